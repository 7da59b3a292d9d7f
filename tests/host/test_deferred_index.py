"""An append is answered once its line is fsynced; its index row is committed afterwards.

The rows of answered appends wait in a queue for a batch commit. These tests prove what
that must never cost: a read sees every answered append, a replay is still deduplicated
while its row waits, and a batch that fails to commit loses nothing (the transcript holds
the line; the session is rebuilt from it before it is served again).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from host import FileSystem
from tests.conftest import RpcError
from tests.host.inproc import Crash, msg, open_host


class FailingCommits(FileSystem):
    """Fails the next ``fail`` index transactions."""

    def __init__(self) -> None:
        self.fail = 0
        self.failed = 0

    def sqlite(self, kind: str) -> None:
        if kind == "write" and self.fail:
            self.fail -= 1
            self.failed += 1
            raise sqlite3.OperationalError("disk I/O error (injected)")


def index_ids(data: Path, sid: str) -> list[str]:
    conn = sqlite3.connect(f"file:{data / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT message_id FROM messages WHERE session_id = ? ORDER BY line", (sid,)
        )
        return [r[0] for r in rows]
    finally:
        conn.close()


async def fails(aw: Awaitable[Any]) -> str:
    """The error code the endpoint answered ``aw`` with."""
    try:
        await aw
    except RpcError as exc:
        return str(exc.name)
    raise AssertionError("the call did not fail")


async def ids(call, sid: str = "s") -> list[str]:  # type: ignore[no-untyped-def]
    return [m["id"] for m in (await call("session.get", sessionId=sid))["messages"]]


async def test_a_read_right_after_appends_sees_every_one_and_the_index_follows(tmp_path: Path):
    data = tmp_path / "data"
    async with open_host(str(data)) as call:
        await call("session.create", sessionId="s")
        for i in range(5):
            res = await call("session.appendMessage", sessionId="s", message=msg(f"m{i}"))
            assert res == {"line": i, "appended": True}
        # Nothing forced a commit yet; the replay is found among the queued rows.
        again = await call("session.appendMessage", sessionId="s", message=msg("m3"))
        assert again == {"line": 3, "appended": False}
        assert await ids(call) == [f"m{i}" for i in range(5)]
        assert index_ids(data, "s") == [f"m{i}" for i in range(5)]  # the read committed them


async def test_a_batch_that_fails_to_commit_loses_nothing(tmp_path: Path):
    data = tmp_path / "data"
    fs = FailingCommits()
    async with open_host(str(data), fs) as call:
        await call("session.create", sessionId="s")
        await call("session.appendMessage", sessionId="s", message=msg("m0"))
        assert await ids(call) == ["m0"]
        answered = await call("session.appendMessage", sessionId="s", message=msg("m1"))
        assert answered == {"line": 1, "appended": True}
        fs.fail = 1
        # The read waits for m1's batch, which fails: the read fails, it does not answer
        # without m1.
        assert await fails(call("session.get", sessionId="s")) == "STORAGE_ERROR"
        assert fs.failed == 1
        assert "m1" not in index_ids(data, "s")
        # The session is rebuilt from its file before it is served again.
        assert await ids(call) == ["m0", "m1"]
        replay = await call("session.appendMessage", sessionId="s", message=msg("m1"))
        assert replay == {"line": 1, "appended": False}
        await call("session.appendMessage", sessionId="s", message=msg("m2"))
    async with open_host(str(data)) as call:
        assert await ids(call) == ["m0", "m1", "m2"]
    assert index_ids(data, "s") == ["m0", "m1", "m2"]


async def test_a_replay_while_its_failed_batch_waits_for_reconcile_is_not_stored_twice(
    tmp_path: Path,
):
    data = tmp_path / "data"
    fs = FailingCommits()
    async with open_host(str(data), fs) as call:
        await call("session.create", sessionId="other")
        await call("session.create", sessionId="s")
        await call("session.appendMessage", sessionId="s", message=msg("m0"))
        fs.fail = 1
        # A read of another session waits for s's batch, which fails: that read fails.
        assert await fails(call("session.get", sessionId="other")) == "STORAGE_ERROR"
        assert fs.failed == 1
        replay = await call("session.appendMessage", sessionId="s", message=msg("m0"))
        assert replay == {"line": 0, "appended": False}
        assert await ids(call) == ["m0"]
    async with open_host(str(data)) as call:
        assert await ids(call) == ["m0"]


class KilledAtTheCommit(FileSystem):
    """A process killed (``Crash``) at its first index transaction once ``armed``."""

    armed = False

    def sqlite(self, kind: str) -> None:
        if self.armed and kind == "write":
            raise Crash("killed before the index commit")


# An outside mutant run (issue 37): a start that reconciled only a transcript shorter than
# its index rows was caught by a stats counter alone; session.list then reported the rows
# the index had, not the file's.
async def test_answered_appends_a_kill_kept_out_of_the_index_are_listed_and_read(tmp_path: Path):
    """A kill after the answers, before their rows' commit: the transcript is longer than
    its index. The next start indexes the lines before it serves anything, so the session
    list counts them and a read returns them."""
    data = tmp_path / "data"
    async with open_host(str(data)) as call:
        await call("session.create", sessionId="s")
        await call("session.appendMessage", sessionId="s", message=msg("m0"))
    fs = KilledAtTheCommit()
    with pytest.raises(Crash):
        async with open_host(str(data), fs) as call:
            for mid in ("m1", "m2"):
                answered = await call("session.appendMessage", sessionId="s", message=msg(mid))
                assert answered["appended"] is True
            fs.armed = True
            await call("session.get", sessionId="s")  # its wait for the rows' commit: killed
    assert index_ids(data, "s") == ["m0"]  # the file has three lines, the index one
    async with open_host(str(data)) as call:
        listed = (await call("session.list"))["sessions"]
        assert [(s["sessionId"], s["messageCount"]) for s in listed] == [("s", 3)]
        assert await ids(call) == ["m0", "m1", "m2"]
