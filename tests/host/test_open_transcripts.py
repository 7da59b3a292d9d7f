"""A bounded set of open transcripts: the least recently used idle one is closed.

A session a call is using keeps its descriptor whatever else is opened meanwhile (a call
holds its ``OpenSession``, and a rewrite its old descriptor, from its first read to its
last write). In-process, where a test can pause a call half-way (``HistoryMethods.hook``)
while the same client's other calls open other transcripts.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

from host._limits import Limits
from host._verify import verify
from tests.host.inproc import Client, msg, open_host, pause_history_at


async def counters(call: Client) -> dict[str, int]:
    return dict((await call("host.stats"))["counters"])


async def ids(call: Client, sid: str) -> list[str]:
    return [m["id"] for m in (await call("session.get", sessionId=sid))["messages"]]


async def test_only_idle_transcripts_are_closed_and_any_is_reopened(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    async with open_host(data, limits=Limits(open_transcripts=4)) as call:
        for i in range(10):
            await call("session.create", sessionId=f"s{i}")
            await call("session.appendMessage", sessionId=f"s{i}", message=msg(f"m{i}", "user"))
        await call("session.appendMessage", sessionId="s0", message=msg("a0"))
        assert (await counters(call))["sessions.open"] == 4

        reached, release = pause_history_at(call, "branch-read")
        # a call using s0, mid-way: its branch read, its archive and root stamp to write
        saving = asyncio.create_task(call("session.saveActiveRevision", sessionId="s0"))
        await reached.wait()
        for i in range(1, 10):  # others open (and close) meanwhile
            assert await ids(call, f"s{i}") == [f"m{i}"]
        assert (await counters(call))["sessions.open"] == 4  # the others made room
        release.set()
        saved = await saving
        call.host.history.hook = None
        # written through the descriptor it held all along: never closed under it
        assert saved == {
            "rootId": "m0",
            "revisionCount": 1,
            "activeRevision": 0,
            "archived": 1,
            "stamped": True,
        }
        before = await counters(call)
        await call("session.get", sessionId="s5")  # idle now, s0 may be closed for it
        after = await counters(call)
        assert after["sessions.open"] == 4
        assert after["transcripts.closed"] == before["transcripts.closed"] + 1
        # every session reopens on demand, with everything it was written
        page = await call("session.get", sessionId="s0")
        assert [m["id"] for m in page["messages"]] == ["m0", "a0"]
        assert page["messages"][0]["revisionCount"] == 1
        revs = await call(
            "session.listRevisions", sessionId="s0", rootId="m0", includeMessages=True
        )
        assert [[m["id"] for m in r["messages"]] for r in revs["revisions"]] == [["a0"]]
        for i in range(1, 10):
            assert await ids(call, f"s{i}") == [f"m{i}"]
        assert (await counters(call))["transcripts.closed"] >= 10
    report = io.StringIO()
    assert await verify(data, out=report) == 0, report.getvalue()


async def test_calls_on_more_sessions_than_the_bound_wait_their_turn(tmp_path: Path) -> None:
    """One client pipelining calls on 250 sessions at once had every one of them busy,
    so none could be closed: 250 descriptors. The calls past the bound wait for one.

    Writes: the endpoint runs a connection's reads (``session.get``) one at a time, but
    its writes at once, each holding its session from its first read to its fsync.
    """
    async with open_host(str(tmp_path / "d"), limits=Limits(open_transcripts=4)) as call:
        host = call.host
        for i in range(40):
            await call("session.create", sessionId=f"s{i}")
            await call("session.appendMessage", sessionId=f"s{i}", message=msg(f"m{i}", "user"))
        most = 0

        async def update(i: int) -> Any:
            nonlocal most
            new = msg(f"m{i}", "user", content=f"v{i}")
            got = await call("session.updateMessage", sessionId=f"s{i}", message=new)
            most = max(most, host.registry.open_count)
            return got

        got = await asyncio.gather(*(update(i) for i in range(40)), update(0), update(1))
        assert got == [{"line": 0}] * 42
        assert most <= 4 and host.registry.open_count <= 4
        for i in range(40):
            page = await call("session.get", sessionId=f"s{i}")
            assert [(m["id"], m["content"]) for m in page["messages"]] == [(f"m{i}", f"v{i}")]
