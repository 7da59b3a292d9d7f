"""A call that finds its session idle ends in the read callback that read it (inline).

The one pipeline (docs/design.md) runs each call's first step at once; an append to an
open, idle session while fsyncs are fast needs nothing else, so it is written, fsynced and
answered before the read returns, and every promise of the awaited way still holds.
The endpoint in-process, a real Host on real files, a fake writer at the transport edge.
"""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any

from host import Host
from host._endpoint import Connection
from tests.host.inproc import FaultyFileSystem, open_host
from tests.host.test_deferred_index import FailingCommits
from tests.host.test_endpoint import FakeWriter, line


def _connect(host: Host) -> tuple[Connection, FakeWriter]:
    """The endpoint, fed by hand: each ``feed`` is one read of one line.

    Its fsyncs count as fast whatever they take: durable writes run on the loop only while
    they are (``FsyncPolicy``), and on a loaded machine (a parallel suite, a busy CI) a
    flush can take over the policy's 2 ms, which would send the calls these tests watch
    to a thread (then they are queued, and answered all the same).
    """
    host.registry.fsyncs.SLOW = math.inf
    writer = FakeWriter()
    return Connection(host, host.stats, writer), writer


def _append(mid: str, rid: Any) -> bytes:
    message = {"id": mid, "role": "user", "content": "x"}
    return line("session.appendMessage", {"sessionId": "s", "message": message}, rid)


async def _session(conn: Connection, writer: FakeWriter, first: str | None = None) -> None:
    """Create session ``s``; ``first``: append that message the awaited way, which opens it."""
    conn.feed(line("handshake", {"protocolVersion": 11}, 0))
    conn.feed(line("session.create", {"sessionId": "s"}, "create"))
    await conn.finish()
    assert writer.replies()["create"]["result"]["created"] is True
    if first is not None:
        conn.feed(_append(first, "first"))
        assert "first" not in writer.replies()  # opening a session takes a thread: queued
        await conn.finish()
        assert writer.replies()["first"]["result"]["appended"] is True


def _stored(tmp_path: Path) -> list[str]:
    raw = (tmp_path / "data" / "sessions" / "s.jsonl").read_bytes()
    return [json.loads(x)["id"] for x in raw.split(b"\n")[:-1]]


async def _ids_after_restart(tmp_path: Path) -> list[str]:
    async with open_host(str(tmp_path / "data")) as call:
        return [m["id"] for m in (await call("session.get", sessionId="s"))["messages"]]


async def test_a_lone_append_is_stored_and_answered_before_feed_returns(tmp_path: Path) -> None:
    async with Host.open(str(tmp_path / "data")) as host:
        conn, writer = _connect(host)
        await _session(conn, writer, first="m0")
        inline = host.stats.inline
        conn.feed(_append("m1", 1))
        assert writer.replies()[1]["result"] == {"line": 1, "appended": True}
        assert _stored(tmp_path) == ["m0", "m1"]
        assert host.stats.inline == inline + 1
        conn.feed(_append("m1", 2))  # delivered again: at least once in, once stored
        assert writer.replies()[2]["result"] == {"line": 1, "appended": False}
        assert _stored(tmp_path) == ["m0", "m1"]
        await conn.finish()
    assert await _ids_after_restart(tmp_path) == ["m0", "m1"]


async def test_the_appends_of_one_read_are_one_group_with_one_fsync(tmp_path: Path) -> None:
    async with Host.open(str(tmp_path / "data")) as host:
        conn, writer = _connect(host)
        await _session(conn, writer, first="m0")
        fsyncs, inline = host.registry.counters["fsyncs"], host.stats.inline
        for i in range(1, 6):  # one read of five lines: all queued before any runs
            conn.read(_append(f"m{i}", i))
        conn.feed(_append("m3", 6))  # a replay of one of them, in the same group
        replies = writer.replies()
        assert [replies[i]["result"] for i in range(1, 7)] == [
            *({"line": i, "appended": True} for i in range(1, 6)),
            {"line": 3, "appended": False},
        ]
        assert host.registry.counters["fsyncs"] == fsyncs + 1
        assert host.stats.inline == inline + 6
        await conn.finish()
    assert await _ids_after_restart(tmp_path) == [f"m{i}" for i in range(6)]


async def test_a_failed_fsync_of_a_lone_append_changes_nothing(tmp_path: Path) -> None:
    fs = FaultyFileSystem(2, errno.EIO)  # its write, then its fsync
    async with Host.open(str(tmp_path / "data"), fs) as host:
        conn, writer = _connect(host)
        await _session(conn, writer, first="m0")
        fs.armed = True
        conn.feed(_append("m1", 1))
        await conn.finish()  # the cut back goes to a thread
        assert writer.replies()[1]["error"]["data"]["code"] == "STORAGE_ERROR"
        assert fs.failed == 1
        assert _stored(tmp_path) == ["m0"]  # the unsynced line was cut back
        conn.feed(_append("m2", 2))
        await conn.finish()
        assert writer.replies()[2]["result"] == {"line": 1, "appended": True}
    assert await _ids_after_restart(tmp_path) == ["m0", "m2"]


async def test_appending_the_checkpointed_message_still_removes_the_checkpoint(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "data" / "sessions" / "s.inflight.json"
    async with Host.open(str(tmp_path / "data")) as host:
        conn, writer = _connect(host)
        await _session(conn, writer, first="u1")  # open: the append could be done at once
        streaming = {"id": "a1", "role": "assistant", "content": "partial"}
        conn.feed(
            line(
                "session.saveInflightMessage",
                {"sessionId": "s", "turnId": "t1", "message": streaming},
                "save",
            )
        )
        await conn.finish()
        assert writer.replies()["save"]["result"] == {"saved": True}
        assert checkpoint.exists()
        final = {"id": "a1", "role": "assistant", "content": "the whole reply"}
        conn.feed(line("session.appendMessage", {"sessionId": "s", "message": final}, 1))
        await conn.finish()
        assert writer.replies()[1]["result"] == {"line": 1, "appended": True}
        assert not checkpoint.exists()
        assert not os.path.exists(str(checkpoint) + ".spare")


async def test_a_session_whose_rows_failed_to_commit_is_reconciled_first(tmp_path: Path) -> None:
    fs = FailingCommits()
    async with Host.open(str(tmp_path / "data"), fs) as host:
        conn, writer = _connect(host)
        await _session(conn, writer, first="m0")
        conn.feed(_append("m1", 1))  # inline; its row waits in the index's queue
        assert writer.replies()[1]["result"] == {"line": 1, "appended": True}
        fs.fail = 1
        conn.feed(line("session.get", {"sessionId": "s"}, "get"))  # waits for the batch: fails
        await conn.finish()
        assert writer.replies()["get"]["error"]["data"]["code"] == "STORAGE_ERROR"
        assert fs.failed == 1
        conn.feed(_append("m1", 2))  # a replay: s is rebuilt from its file first (queued)
        assert 2 not in writer.replies()
        await conn.finish()
        assert writer.replies()[2]["result"] == {"line": 1, "appended": False}
        conn.feed(_append("m2", 3))  # rebuilt: inline again
        assert writer.replies()[3]["result"] == {"line": 2, "appended": True}
        await conn.finish()
    assert await _ids_after_restart(tmp_path) == ["m0", "m1", "m2"]
