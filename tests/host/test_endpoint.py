"""The endpoint in-process: a real Host on real files, a fake writer at the transport edge.

Here the test itself can hold a session's lock, so "a request already waiting for its
lock" is a state the test reaches deterministically (over the wire it is a race).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from host import Host
from host._endpoint import Connection
from host._limits import CALLS_IN_FLIGHT, READ_AHEAD


class FakeWriter:
    """The transport edge: collects every reply line the connection writes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def replies(self) -> dict[Any, dict[str, Any]]:
        out = {}
        for line in bytes(self.data).split(b"\n")[:-1]:
            reply = json.loads(line)
            for one in reply if isinstance(reply, list) else [reply]:  # a batch's answers
                out[one["id"]] = one
        return out


def line(method: str, params: dict[str, Any], rid: Any = None) -> bytes:
    req: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if rid is not None:
        req["id"] = rid
    return json.dumps(req).encode()


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[tuple[Host, Connection, FakeWriter]]:
    async with Host.open(str(tmp_path / "data")) as host:
        writer = FakeWriter()
        conn = Connection(host, host.stats, writer)
        conn.feed(line("handshake", {"protocolVersion": 11}, 0))
        conn.feed(line("session.create", {"sessionId": "s"}, "create"))
        await conn.finish()
        assert writer.replies()["create"]["result"]["created"] is True
        yield host, conn, writer
        async with asyncio.timeout(30):  # a call the test left hanging fails it, not the run
            await conn.finish()


async def _until_waiting(host: Host, session_id: str, users: int) -> None:
    """Spin the loop until ``users`` calls hold or wait for the lock (bounded)."""
    for _ in range(10_000):
        if host.registry.locks.users(session_id) >= users:
            return
        await asyncio.sleep(0)
    raise AssertionError("the call never queued on the session's lock")


def _transcript(tmp_path: Path) -> bytes:
    return (tmp_path / "data" / "sessions" / "s.jsonl").read_bytes()


async def test_cancel_of_a_call_waiting_on_the_lock_is_request_cancelled(
    opened: tuple[Host, Connection, FakeWriter], tmp_path: Path
) -> None:
    host, conn, writer = opened
    message = {"id": "m1", "role": "user", "content": "x"}
    async with host.registry.locks.hold("s"):
        conn.feed(line("session.appendMessage", {"sessionId": "s", "message": message}, 7))
        await _until_waiting(host, "s", 2)
        conn.feed(line("$/cancelRequest", {"id": 7}))
    await conn.finish()
    reply = writer.replies()[7]
    assert reply["error"]["code"] == -32800
    assert reply["error"]["data"]["code"] == "REQUEST_CANCELLED"
    assert _transcript(tmp_path) == b""
    assert conn.calls == {}


async def test_only_the_cancelled_call_is_skipped(
    opened: tuple[Host, Connection, FakeWriter], tmp_path: Path
) -> None:
    host, conn, writer = opened
    async with host.registry.locks.hold("s"):
        for i in range(3):
            message = {"id": f"m{i}", "role": "user", "content": "x"}
            conn.feed(line("session.appendMessage", {"sessionId": "s", "message": message}, i))
        await _until_waiting(host, "s", 4)
        conn.feed(line("$/cancelRequest", {"id": 1}))
    await conn.finish()
    replies = writer.replies()
    assert replies[0]["result"] == {"line": 0, "appended": True}
    assert replies[1]["error"]["data"]["code"] == "REQUEST_CANCELLED"
    assert replies[2]["result"] == {"line": 1, "appended": True}
    ids = [json.loads(b)["id"] for b in _transcript(tmp_path).split(b"\n")[:-1]]
    assert ids == ["m0", "m2"]


async def test_calls_on_one_session_apply_in_arrival_order(
    opened: tuple[Host, Connection, FakeWriter], tmp_path: Path
) -> None:
    host, conn, writer = opened
    message = {"id": "m", "role": "user", "content": "v1"}
    async with host.registry.locks.hold("s"):
        conn.feed(line("session.appendMessage", {"sessionId": "s", "message": message}, 1))
        update = {**message, "content": "v2"}
        conn.feed(line("session.updateMessage", {"sessionId": "s", "message": update}, 2))
        conn.feed(line("session.deleteMessages", {"sessionId": "s", "messageIds": ["m"]}, 3))
        conn.feed(line("session.appendMessage", {"sessionId": "s", "message": update}, 4))
        await _until_waiting(host, "s", 5)
    await conn.finish()
    replies = writer.replies()
    assert replies[2]["result"] == {"line": 0}
    assert replies[3]["result"] == {"deleted": 1}
    assert replies[4]["result"] == {"line": 0, "appended": True}
    assert json.loads(_transcript(tmp_path)) == {"id": "m", "role": "user", "content": "v2"}


async def test_finished_calls_leave_no_garbage_for_the_cycle_collector(
    opened: tuple[Host, Connection, FakeWriter],
) -> None:
    # A backlog's calls must be freed as they end: a cycle per call (task -> context ->
    # call -> task) left each one to the collector, whose passes over the calls in flight
    # cost a draining outbox a quarter of its time.
    _host, conn, writer = opened
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for i in range(50):
            message = {"id": f"g{i}", "role": "user", "content": "x"}
            conn.feed(line("session.appendMessage", {"sessionId": "s", "message": message}, i))
        conn.feed(line("session.get", {"sessionId": "s"}, "get"))
        await conn.finish()
        for _ in range(3):
            await asyncio.sleep(0)  # a turn of the loop: its last callbacks let the calls go
        gc.collect()
        left = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert writer.replies()["get"]["result"]["totalLines"] == 50
    assert left == []


class _Reader:
    """The reader edge: records what flow control asks of it."""

    def __init__(self) -> None:
        self.paused = False
        self.resumed = 0

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self.resumed += 1


@pytest.mark.parametrize("size", [10_000, 10], ids=["4 MiB of requests", "1,024 calls"])
async def test_reading_pauses_at_the_bound_of_calls_in_flight_and_resumes_after(
    opened: tuple[Host, Connection, FakeWriter], size: int
) -> None:
    """A 5,000-append burst of 10 KB lines grew the host by ~60 MB when its fsyncs were
    slow (issue 26): every line read was held. Here the calls wait on their session's
    lock, as behind a slow fsync; the connection asks its reader to stop at the bound."""
    host, conn, writer = opened
    reader = _Reader()
    conn.reader = reader
    fed = held = 0
    async with host.registry.locks.hold("s"):
        while not reader.paused and fed < 5_000:
            message = {"id": f"b{fed}", "role": "user", "content": "y" * size}
            data = line("session.appendMessage", {"sessionId": "s", "message": message}, fed)
            conn.feed(data)
            fed, held = fed + 1, held + len(data)
        assert reader.paused
        if size > 10:  # paused by the line that took it to 4 MiB, not one later
            assert held - len(data) < READ_AHEAD <= held
        else:
            assert fed == CALLS_IN_FLIGHT
    await conn.finish()
    assert not reader.paused and reader.resumed == 1
    replies = writer.replies()
    assert all(replies[i]["result"]["appended"] for i in range(fed))


async def test_a_call_waiting_for_its_client_to_read_is_cancelled_and_others_go_on(
    opened: tuple[Host, Connection, FakeWriter],
) -> None:
    """While the client leaves its answers unread, calls wait to start, in order; one
    of them can still be cancelled (it never started), and the rest run once it reads."""
    host, conn, writer = opened
    conn.writer_paused(True)  # the transport's high-water mark: the client reads nothing
    conn.feed(line("session.get", {"sessionId": "s"}, "g1"))
    conn.feed(line("session.appendMessage", {"sessionId": "s", "message": _m("a")}, "a"))
    for _ in range(10_000):  # bounded: until both wait at the gate
        if host.stats.waiting == 2:
            break
        await asyncio.sleep(0)
    assert host.stats.waiting == 2
    conn.feed(line("$/cancelRequest", {"id": "g1"}))
    conn.writer_paused(False)
    await conn.finish()
    replies = writer.replies()
    assert replies["g1"]["error"]["data"]["code"] == "REQUEST_CANCELLED"
    assert replies["a"]["result"] == {"line": 0, "appended": True}
    assert host.stats.waiting == 0


def _m(mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": "x"}


async def test_a_batch_element_nested_too_deep_leaves_no_call_of_it_queued(
    opened: tuple[Host, Connection, FakeWriter],
) -> None:
    """A batch decodes its elements as raw values; each element is then decoded a few
    frames deeper, where msgspec's recursion bound (the interpreter's) is a few levels
    lower. An element nested just past it raised out of the whole line after the
    elements before it were queued on their sessions: they never ran, never left their
    queues, and the session answered nothing ever again. Every depth around the bound
    is tried: the window is a few levels wide, wherever the stack is."""
    host, conn, writer = opened
    limit = sys.getrecursionlimit()
    ran = 0
    for n in range(limit + 10, limit - 300, -1):  # down to where every element decodes
        deep = {"id": f"d{n}", "role": "user", "content": "x"}
        first = line("session.appendMessage", {"sessionId": "s", "message": _m(f"a{n}")}, n)
        second = line("session.appendMessage", {"sessionId": "s", "message": deep}, f"d{n}")
        second = second.replace(b'"x"', b"[" * n + b"]" * n)
        conn.feed(b"[" + first + b"," + second + b"]")
        conn.feed(line("session.get", {"sessionId": "s", "limit": 1}, f"probe{n}"))
        await asyncio.wait_for(conn.finish(), 10)  # a queued call never run: forever
        assert host.registry.locks.users("s") == 0, n
        replies = writer.replies()
        assert f"probe{n}" in replies, n
        if n in replies:  # else the batch itself was too deep: one error, nothing queued
            assert replies[n]["result"]["appended"] is True, n  # it ran, and answered
            ran += 1
            if f"d{n}" in replies:
                break  # the deep element decodes too: past the window
    assert ran
    assert conn.calls == {}


async def test_recover_inflight_is_started_once_admitted(
    opened: tuple[Host, Connection, FakeWriter],
) -> None:
    """``recoverInflightMessages`` enters no queue (it takes each session's in turn
    itself): it is started once admitted (docs/protocol.md, Cancellation), and a cancel
    then leaves it to finish. Once, its locks were taken with no call, so it never counted
    as started, and a cancel could stop it between any two of its writes (a checkpoint
    promoted, its turn still running) and answer REQUEST_CANCELLED "before it started"."""
    host, conn, writer = opened
    conn.feed(line("session.beginTurn", {"sessionId": "s", "turnId": "t1", "prompt": _m("p")}, 1))
    partial = {"id": "r1", "role": "assistant", "content": "half a reply"}
    save = {"sessionId": "s", "turnId": "t1", "message": partial}
    conn.feed(line("session.saveInflightMessage", save, 2))
    await conn.finish()
    assert writer.replies()[2]["result"] == {"saved": True}
    conn.feed(line("session.recoverInflightMessages", {}, "rec"))
    for _ in range(10_000):  # bounded: until it holds s, half-way through its work
        if host.registry.locks.held("s"):
            break
        await asyncio.sleep(0)
    assert host.registry.locks.held("s")
    conn.feed(line("$/cancelRequest", {"id": "rec"}))
    await conn.finish()
    assert writer.replies()["rec"]["result"]["recovered"] == [
        {"sessionId": "s", "messageId": "r1", "turnId": "t1", "status": "aborted"}
    ]
    conn.feed(line("session.beginTurn", {"sessionId": "s", "turnId": "t2"}, 3))
    await conn.finish()
    assert writer.replies()[3]["result"] == {"turnId": "t2"}


async def test_a_call_waiting_for_its_client_to_read_does_not_hold_up_other_clients(
    opened: tuple[Host, Connection, FakeWriter],
) -> None:
    """A call waiting at its connection's gate (its client leaves answers unread) holds no
    lock (docs/design.md, "Answers a client does not read"): a client that stops reading
    stops only itself. Its ticket now joins the session's queue at read time, before the
    gate, so it held the session against every other connection until its client read."""
    host, conn, _writer = opened
    other_writer = FakeWriter()
    other = Connection(host, host.stats, other_writer)
    other.feed(line("handshake", {"protocolVersion": 11}, 0))
    conn.writer_paused(True)  # this client reads nothing
    conn.feed(line("session.appendMessage", {"sessionId": "s", "message": _m("a")}, "a"))
    other.feed(line("session.appendMessage", {"sessionId": "s", "message": _m("b")}, "b"))
    try:
        await asyncio.wait_for(asyncio.shield(other.finish()), 5)
    finally:
        conn.writer_paused(False)
        await other.finish()
    assert other_writer.replies()["b"]["result"] == {"line": 0, "appended": True}


class _Died(BaseException):
    """The process died here (as ``tests.host.inproc.Crash``): no answer, no cleanup."""


async def test_a_batch_whose_calls_die_leaves_no_place_held(
    opened: tuple[Host, Connection, FakeWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a dying process raises past a handler (its errors are answers); a call that
    # dies must not keep its places in its queues, nor its batch the bytes of its line.
    host, conn, _writer = opened
    conn.feed(line("session.create", {"sessionId": "t"}, "t"))
    for sid in ("s", "t"):
        conn.feed(line("session.appendMessage", {"sessionId": sid, "message": _m("a")}, sid))
    await conn.finish()

    def dies(*_: object) -> dict[str, int]:
        raise _Died

    monkeypatch.setattr(host.registry.index, "lookup_now", dies)
    batch = b"[%s,%s]" % (
        line("session.appendMessage", {"sessionId": "s", "message": _m("b")}, 1),
        line("session.appendMessage", {"sessionId": "t", "message": _m("b")}, 2),
    )
    with contextlib.suppress(_Died):  # 3.12+: raised out of the read (eager first steps)
        conn.feed(batch)
    await conn.finish()
    assert host.registry.locks.users("s") == host.registry.locks.users("t") == 0
    assert conn._held == 0
