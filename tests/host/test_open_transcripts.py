"""A bounded set of open transcripts: the least recently used idle one is closed.

In-process, where a test can hold a session's lock: a session a call is using keeps its
descriptor whatever else is opened meanwhile (a call holds its ``OpenSession``, and a
rewrite its old descriptor, from its first read to its last write).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from host._limits import Limits
from host._messages import parse_incoming
from host._store import NewLine
from tests.host.inproc import msg, open_host


async def test_only_idle_transcripts_are_closed_and_any_is_reopened(tmp_path: Path) -> None:
    async with open_host(str(tmp_path / "d"), limits=Limits(open_transcripts=4)) as call:
        host = call.host
        for i in range(10):
            await call("session.create", sessionId=f"s{i}")
            await call("session.appendMessage", sessionId=f"s{i}", message=msg(f"m{i}", "user"))
        store = host.store
        assert store.open_count == 4
        async with store.locks.hold("s0"):  # a call using s0, mid-way
            s0 = await store.open_session("s0")
            for i in range(1, 10):  # others open (and close) meanwhile
                await call("session.get", sessionId=f"s{i}")
            assert store.is_open(s0), "a session in use was closed under its call"
            os.fstat(s0.transcript.fd)
            line = NewLine.of(parse_incoming(b'{"id":"late","role":"user"}'), None)
            assert await store.append(s0, [line]) == [1]
            assert store.open_count == 4  # the others made room: s0 was never a candidate
        await call("session.get", sessionId="s5")  # idle now, and least recently used
        assert store.open_count == 4 and not store.is_open(s0)
        # every session reopens on demand, with everything it was written
        for i in range(10):
            ids = [m["id"] for m in (await call("session.get", sessionId=f"s{i}"))["messages"]]
            assert ids == [f"m{i}", "late"] if i == 0 else [f"m{i}"]
        assert store.counters["transcripts.closed"] >= 10


async def test_calls_on_more_sessions_than_the_bound_wait_their_turn(tmp_path: Path) -> None:
    """One client pipelining reads of 250 sessions at once had every one of them busy,
    so none could be closed: 250 descriptors. The calls past the bound wait for one."""
    async with open_host(str(tmp_path / "d"), limits=Limits(open_transcripts=4)) as call:
        host = call.host
        for i in range(40):
            await call("session.create", sessionId=f"s{i}")
            await call("session.appendMessage", sessionId=f"s{i}", message=msg(f"m{i}", "user"))
        most = 0

        async def get(i: int) -> list[str]:
            nonlocal most
            got = await call("session.get", sessionId=f"s{i}")
            most = max(most, host.store.open_count)
            return [m["id"] for m in got["messages"]]

        got = await asyncio.gather(*(get(i) for i in range(40)), get(0), get(1))
        assert got[:40] == [[f"m{i}"] for i in range(40)]
        assert most <= 4 and host.store.open_count <= 4
