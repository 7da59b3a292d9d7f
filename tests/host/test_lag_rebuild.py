"""A session whose index lags its files is rebuilt from them, and stays marked until it is.

The index fails as a full disk makes SQLite fail (``SQLITE_FULL`` on a write), here at the
seam every index statement passes (``FileSystem.sqlite``). The files are the truth: what
they hold and an answer acknowledged must be served, never a row the index missed.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from host import FileSystem
from tests.conftest import RpcError
from tests.host.inproc import msg, open_host


class FullIndex(FileSystem):
    """The index's next ``writes`` write statements fail as on a full disk."""

    def __init__(self) -> None:
        self.writes = 0

    def sqlite(self, kind: str) -> None:
        if self.writes and kind == "write":
            self.writes -= 1
            raise sqlite3.OperationalError("database or disk is full")
        super().sqlite(kind)


async def ids(call: Any, sid: str = "s") -> list[str]:
    return [m["id"] for m in (await call("session.get", sessionId=sid))["messages"]]


async def test_a_session_created_without_its_index_row_is_served(tmp_path: Path) -> None:
    fs = FullIndex()
    async with open_host(str(tmp_path / "d"), fs) as call:
        fs.writes = 1  # the create's row
        assert (await call("session.create", sessionId="s"))["created"] is True
        r = await call("session.appendMessage", sessionId="s", message=msg("u1", "user"))
        assert r == {"line": 0, "appended": True}
        assert await ids(call) == ["u1"]
        assert [x["sessionId"] for x in (await call("session.list"))["sessions"]] == ["s"]
        assert (await call("session.create", sessionId="s"))["created"] is False


async def test_a_turn_change_the_index_missed_is_rebuilt_even_after_a_failed_rebuild(
    tmp_path: Path,
) -> None:
    fs = FullIndex()
    async with open_host(str(tmp_path / "d"), fs) as call:
        await call("session.create", sessionId="s")
        await call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", "user"))
        fs.writes = 2  # the turn's row, then the first rebuild's first write
        end = await call("session.endTurn", sessionId="s", turnId="t1", status="completed")
        assert end["status"] == "completed"  # in its log: made
        with pytest.raises(RpcError) as failed:  # its rebuild fails: an error, no state
            await call("session.get", sessionId="s")
        assert failed.value.name == "STORAGE_ERROR"
        # the disk has room again: the turn log is the truth, t1 ended, t2 may begin
        begin = await call("session.beginTurn", sessionId="s", turnId="t2")
        assert begin["turnId"] == "t2"


async def test_deleting_a_lagging_session_leaves_no_lag_behind(tmp_path: Path) -> None:
    fs = FullIndex()
    async with open_host(str(tmp_path / "d"), fs) as call:
        for sid in ("s", "o"):
            await call("session.create", sessionId=sid)
        fs.writes = 1  # the batch of s's append
        await call("session.appendMessage", sessionId="s", message=msg("u1", "user"))
        with contextlib.suppress(sqlite3.OperationalError):  # the batch fails
            await call.host.registry.index.settle()
        lagging = (await call("host.stats"))["counters"]["index.lagging"]
        assert lagging == 1
        await call("session.delete", sessionId="s")
        assert (await call("host.stats"))["counters"]["index.lagging"] == 0
