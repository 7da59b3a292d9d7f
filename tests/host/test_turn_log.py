"""The turn log: what a rebuilt index replays, a torn last line and a line edited by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.host.inproc import Client, msg, open_host


async def _status(call: Client, tid: str) -> str:
    """A turn's status (every turn is ended after a start: ending it again only reads it)."""
    return str((await call("session.endTurn", sessionId="s", turnId=tid, status="error"))["status"])


async def test_a_rebuilt_index_replays_the_turn_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    async with open_host(str(data)) as call:
        await call("session.create", sessionId="s")
        await call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", "user"))
        await call("session.endTurn", sessionId="s", turnId="t1", status="completed")
        await call("session.beginTurn", sessionId="s", turnId="t2")
        await call("session.endTurn", sessionId="s", turnId="t2", status="error")
    log = data / "sessions" / "s.turns.log"
    good = log.read_bytes()
    # A line edited by hand, a later good one, and a torn last line (never answered).
    log.write_bytes(
        good
        + b"not a turn change\n"
        + b'{"turnId":"t3","status":"running","at":"2026-12-06T00:00:00.000Z"}\n'
        + b'{"turnId":"t3","status":"compl'
    )
    for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm"):
        (data / name).unlink(missing_ok=True)
    async with open_host(str(data)) as call:
        assert await _status(call, "t1") == "completed"
        assert await _status(call, "t2") == "error"
        assert await _status(call, "t3") == "aborted"  # running at start, its end torn
    assert "is no turn change" in caplog.text
    assert not log.read_bytes().endswith(b"compl")  # the torn line is cut
