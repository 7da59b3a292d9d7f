"""One request pipeline: every step of a call runs in a task of its own, and the
session's queue alone decides when.

A handler may use ``asyncio.timeout`` (or, on Python 3.12+, ``wait_for``) in any step,
its first included: until issue 33 a call's first step ran in the transport's read
callback, outside any task, where ``asyncio.timeout`` raises ``RuntimeError`` and the call
was answered ``INTERNAL``. The calls of one read still enter their session's queue before
any of them runs, so a backlog read in one go is one group (one write, one fsync).
In-process, a real Host on real files, a fake writer at the transport edge.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from host import Host
from host._endpoint import Connection
from host._index import SessionRow
from host._limits import Limits
from tests.host.inproc import FaultyFileSystem, msg, open_host, pause_history_at
from tests.host.test_deferred_index import FailingCommits
from tests.host.test_endpoint import FakeWriter, line


async def test_a_wait_under_asyncio_timeout_in_a_first_step_answers_as_designed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open-transcripts bound: a call that needs a transcript opened while every open
    one is held waits (``asyncio.timeout(ROOM_WAIT)``) for a holder to let one go. Here
    the session's row comes from memory (no thread hop before it), so the call reaches
    that wait in its first step: it must wait there and then answer its page."""
    async with open_host(str(tmp_path / "d"), limits=Limits(open_transcripts=1)) as call:
        for sid in ("a", "b"):
            await call("session.create", sessionId=sid)
            await call("session.appendMessage", sessionId=sid, message=msg(f"{sid}0", "user"))
        await call("session.appendMessage", sessionId="a", message=msg("a1"))
        index = call.host.registry.index
        row_b = await index.session("b")
        read_index = index.session
        waits = asyncio.Event()

        async def session(sid: str) -> SessionRow | None:
            if sid != "b":
                return await read_index(sid)
            waits.set()  # what follows, up to the room wait, needs nothing but the loop
            return row_b

        monkeypatch.setattr(index, "session", session)
        # a holds the one open transcript: a call on it paused half-way
        reached, release = pause_history_at(call, "branch-read")
        saving = asyncio.create_task(call("session.saveActiveRevision", sessionId="a"))
        await reached.wait()
        assert call.host.registry.open_count == 1
        page: asyncio.Task[Any] = asyncio.create_task(call("session.get", sessionId="b"))
        await waits.wait()
        assert not page.done()  # waiting for room, not answered INTERNAL
        release.set()
        assert (await saving)["archived"] == 1
        assert [m["id"] for m in (await page)["messages"]] == ["b0"]
        assert call.host.registry.open_count == 1


def _connect(host: Host) -> tuple[Connection, FakeWriter]:
    """The endpoint, fed by hand: each ``feed`` is one read.

    Its fsyncs count as fast whatever they take: durable writes run on the loop only while
    they are (``FsyncPolicy``), and on a loaded machine a flush can take over the policy's
    2 ms, which would send the writes these tests count to a thread (answered all the
    same, but a read's appends could then be split over two groups).
    """
    host.registry.fsyncs.SLOW = math.inf
    writer = FakeWriter()
    return Connection(host, host.stats, writer), writer


def _append(mid: str, rid: Any) -> bytes:
    message = {"id": mid, "role": "user", "content": "x"}
    return line("session.appendMessage", {"sessionId": "s", "message": message}, rid)


async def _session(conn: Connection, writer: FakeWriter, first: str) -> None:
    """Create session ``s`` and append ``first`` to it (which opens it)."""
    conn.feed(line("handshake", {"protocolVersion": 11}, 0))
    conn.feed(line("session.create", {"sessionId": "s"}, "create"))
    await conn.finish()
    assert writer.replies()["create"]["result"]["created"] is True
    conn.feed(_append(first, "first"))
    await conn.finish()
    assert writer.replies()["first"]["result"]["appended"] is True


def _stored(tmp_path: Path) -> list[str]:
    raw = (tmp_path / "data" / "sessions" / "s.jsonl").read_bytes()
    return [json.loads(x)["id"] for x in raw.split(b"\n")[:-1]]


async def _ids_after_restart(tmp_path: Path) -> list[str]:
    async with open_host(str(tmp_path / "data")) as call:
        return [m["id"] for m in (await call("session.get", sessionId="s"))["messages"]]


async def test_the_appends_of_one_read_are_one_group_with_one_fsync(tmp_path: Path) -> None:
    async with Host.open(str(tmp_path / "data")) as host:
        conn, writer = _connect(host)
        await _session(conn, writer, "m0")
        fsyncs = host.registry.counters["fsyncs"]
        for i in range(1, 6):  # one read of five lines: all queued before any runs
            conn.read(_append(f"m{i}", i))
        conn.read(
            b'{"jsonrpc":"2.0","id":"bad","method":"session.appendMessage",'
            b'"params":{"sessionId":"s","message":{"role":"user"}}}'
        )
        conn.feed(_append("m3", 6))  # a replay of one of them, in the same group
        await conn.finish()
        replies = writer.replies()
        assert [replies[i]["result"] for i in range(1, 7)] == [
            *({"line": i, "appended": True} for i in range(1, 6)),
            {"line": 3, "appended": False},
        ]
        assert replies["bad"]["error"]["data"]["code"] == "INVALID_PARAMS"  # its own error
        assert host.registry.counters["fsyncs"] == fsyncs + 1
    assert await _ids_after_restart(tmp_path) == [f"m{i}" for i in range(6)]


async def test_a_failed_fsync_of_a_lone_append_changes_nothing(tmp_path: Path) -> None:
    fs = FaultyFileSystem(2, errno.EIO)  # its write, then its fsync
    async with Host.open(str(tmp_path / "data"), fs) as host:
        conn, writer = _connect(host)
        await _session(conn, writer, "m0")
        fs.armed = True
        conn.feed(_append("m1", 1))
        await conn.finish()
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
        await _session(conn, writer, "u1")
        streaming = {"id": "a1", "role": "assistant", "content": "partial"}
        save = {"sessionId": "s", "turnId": "t1", "message": streaming}
        conn.feed(line("session.saveInflightMessage", save, "save"))
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
        await _session(conn, writer, "m0")
        conn.feed(_append("m1", 1))  # its row waits in the index's queue
        await conn.finish()
        assert writer.replies()[1]["result"] == {"line": 1, "appended": True}
        fs.fail = 1
        conn.feed(line("session.get", {"sessionId": "s"}, "get"))  # waits for the batch: fails
        await conn.finish()
        assert writer.replies()["get"]["error"]["data"]["code"] == "STORAGE_ERROR"
        assert fs.failed == 1
        conn.feed(_append("m1", 2))  # a replay: s is rebuilt from its file first
        await conn.finish()
        assert writer.replies()[2]["result"] == {"line": 1, "appended": False}
        conn.feed(_append("m2", 3))
        await conn.finish()
        assert writer.replies()[3]["result"] == {"line": 2, "appended": True}
    assert await _ids_after_restart(tmp_path) == ["m0", "m1", "m2"]
