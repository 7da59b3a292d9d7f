"""NDJSON framing: lines out of a byte stream, at most ``limit`` bytes of any line held."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host._framing import CHUNK, KEEP, ROOM, TOO_LONG, LineReader, Refused, RequestBudget
from host._limits import READ_BUFFER

MODES = ["get_buffer", "data_received"]


def _read_into(reader: LineReader, chunk: bytes) -> None:
    """What uvloop and asyncio's sockets do: read into the protocol's buffer, then tell it."""
    view = memoryview(chunk)
    while view:
        with reader.get_buffer(-1) as room:
            n = min(len(room), len(view))
            room[:n] = view[:n]
        view = view[n:]
        reader.buffer_updated(n)


def _collect(chunks: Iterable[bytes], limit: int, mode: str = "get_buffer") -> list[object]:
    """The transport edge: feed ``chunks`` as reads, then end of input."""
    got: list[object] = []
    reader = LineReader(got.append, limit)
    for chunk in chunks:
        if mode == "get_buffer":
            _read_into(reader, chunk)
        else:
            reader.data_received(chunk)
    assert not reader.ended.is_set()
    reader.eof_received()
    assert reader.ended.is_set()
    return got


@pytest.mark.parametrize("mode", MODES)
def test_lines_split_at_every_possible_point(mode: str) -> None:
    data = b'{"a":1}\n\n{"b":2}\r\nlast'
    expected = [b'{"a":1}', b"", b'{"b":2}\r', b"last"]
    for cut in range(len(data) + 1):
        assert _collect([data[:cut], data[cut:]], 100, mode) == expected, cut
    one_by_one = [data[i : i + 1] for i in range(len(data))]
    assert _collect(one_by_one, 100, mode) == expected


@pytest.mark.parametrize("mode", MODES)
def test_a_line_over_the_limit_is_read_through_and_the_next_is_served(mode: str) -> None:
    chunks = [b"short\n", b"x" * 7, b"x" * 7, b"x" * 7, b"\nok\n", b"y" * 11, b"\n", b"z\n"]
    assert _collect(chunks, 10, mode) == [b"short", TOO_LONG, b"ok", TOO_LONG, b"z"]


@pytest.mark.parametrize("mode", MODES)
def test_the_limit_is_inclusive(mode: str) -> None:
    got = _collect([b"x" * 10 + b"\n" + b"y" * 11 + b"\n"], 10, mode)
    assert got == [b"x" * 10, TOO_LONG]
    got = _collect([b"x" * 5, b"x" * 5, b"\n", b"y" * 6, b"y" * 5, b"\n"], 10, mode)
    assert got == [b"x" * 10, TOO_LONG]


def test_an_over_limit_line_spanning_many_reads_counts_once_and_is_not_held() -> None:
    got: list[object] = []
    limit = 3 * ROOM
    reader = LineReader(got.append, limit)
    for _ in range(200):  # 200 reads of 64 KiB: 12.8 MiB of one line
        _read_into(reader, b"a" * ROOM)
        with reader.get_buffer(-1) as room:
            held = len(room.obj)  # type: ignore[arg-type]
        assert held <= CHUNK + limit + ROOM  # what the connection holds stays bounded
    _read_into(reader, b"\nb\n")
    assert got == [TOO_LONG, b"b"]


@pytest.mark.parametrize("mode", MODES)
def test_the_last_unterminated_line_counts(mode: str) -> None:
    assert _collect([b"a\nb", b"c"], 10, mode) == [b"a", b"bc"]
    assert _collect([b"a\n", b"z" * 30], 10, mode) == [b"a", TOO_LONG]
    assert _collect([b"a\n"], 10, mode) == [b"a"]
    assert _collect([], 10, mode) == []
    assert _collect([b"\n"], 10, mode) == [b""]


def test_a_big_buffer_is_let_go_after_its_line() -> None:
    got: list[object] = []
    reader = LineReader(got.append)
    _read_into(reader, b"x" * (8 * CHUNK) + b"\n")
    _read_into(reader, b"y\n")
    assert got == [b"x" * (8 * CHUNK), b"y"]
    with reader.get_buffer(-1) as room:
        assert len(room.obj) == READ_BUFFER  # type: ignore[arg-type]


def test_a_buffer_is_small_until_a_long_line_comes_and_a_grown_one_is_kept_to_4_mib() -> None:
    """1,000 idle connections held 1 MiB each (issue 26); a reply's 1 MB snapshots, one
    after the other, must not grow a buffer from scratch every time."""
    got: list[object] = []
    budget = RequestBudget()
    reader = LineReader(got.append, budget=budget)
    _read_into(reader, b"short\n")
    with reader.get_buffer(-1) as room:
        assert len(room.obj) == READ_BUFFER  # type: ignore[arg-type]
    _read_into(reader, b"x" * CHUNK + b"\n")
    with reader.get_buffer(-1) as room:
        kept = len(room.obj)  # type: ignore[arg-type]
    assert CHUNK < kept <= KEEP
    assert budget.used == kept - READ_BUFFER  # counted while kept
    reader.connection_lost(None)
    assert budget.used == 0


def test_a_line_the_shared_budget_cannot_hold_is_refused_with_its_head() -> None:
    got: list[object] = []
    budget = RequestBudget(limit=3 * CHUNK)
    reader = LineReader(got.append, budget=budget)
    head = b'{"jsonrpc":"2.0","id":7,"method":"session.get","params":{"pad":"'
    _read_into(reader, head + b"a" * (8 * CHUNK) + b'"}}\nok\n')
    (refused, ok) = got
    assert isinstance(refused, Refused) and refused.head.startswith(head)
    assert ok == b"ok"
    assert budget.used <= 3 * CHUNK


def test_an_idle_grown_buffer_is_let_go_for_another_connections_line() -> None:
    budget = RequestBudget(limit=5 * CHUNK)  # a keeps ~2 MiB; b's line grows to ~4 MiB
    a_got: list[object] = []
    b_got: list[object] = []
    a = LineReader(a_got.append, budget=budget)
    b = LineReader(b_got.append, budget=budget)
    _read_into(a, b"x" * CHUNK + b"\n")  # a keeps a grown buffer, holding nothing
    _read_into(b, b"y" * (2 * CHUNK) + b"\n")
    assert b_got == [b"y" * (2 * CHUNK)]
    with a.get_buffer(-1) as room:
        assert len(room.obj) == READ_BUFFER  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_lines_read_while_paused_wait_and_come_in_order_at_resume(mode: str) -> None:
    got: list[object] = []
    reader = LineReader(got.append, 100)
    reader.connection_made(_Transport())
    feed = (lambda c: _read_into(reader, c)) if mode == "get_buffer" else reader.data_received
    feed(b"a\nb")
    reader.pause()
    assert reader.transport.reading is False
    feed(b"\nc\nd")
    reader.eof_received()
    assert got == [b"a"] and not reader.ended.is_set()
    reader.resume()
    assert got == [b"a", b"b", b"c", b"d"] and reader.ended.is_set()


class _Transport:
    reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def test_after_stop_nothing_more_is_handed_on() -> None:
    got: list[object] = []
    reader = LineReader(got.append, 100)
    _read_into(reader, b"a\nb")
    reader.stop()
    _read_into(reader, b"\nc\n")
    reader.eof_received()
    assert got == [b"a"]


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12),
    terminated=st.booleans(),
    limit=st.integers(min_value=1, max_value=30),
    mode=st.sampled_from(MODES),
)
def test_any_chunking_gives_the_same_lines(
    lines: list[bytes], cuts: list[int], terminated: bool, limit: int, mode: str
) -> None:
    data = b"\n".join(lines) + (b"\n" if terminated and lines else b"")
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    expected: list[object] = [line if len(line) <= limit else TOO_LONG for line in lines]
    if lines and not terminated and lines[-1] == b"":
        expected.pop()  # "a\n" then nothing: no last line
    assert _collect(chunks, limit, mode) == expected


# -- through real transports -----------------------------------------------------------

LINES = [bytes([65 + i]) * 300_000 for i in range(9)]  # lines straddle every read
DATA = b"\n".join(LINES) + b"\n"


async def test_lines_through_a_real_pipe() -> None:
    got: list[object] = []
    reader = LineReader(got.append)
    r, w = os.pipe()
    loop = asyncio.get_running_loop()
    with open(r, "rb", buffering=0) as pipe_in:
        transport, _ = await loop.connect_read_pipe(lambda: reader, pipe_in)
        writing = asyncio.create_task(asyncio.to_thread(_write_and_close, w, DATA))
        await reader.ended.wait()
        await writing
        transport.close()
    assert got == LINES


async def test_lines_through_a_real_socket() -> None:
    got: list[object] = []
    reader = LineReader(got.append)
    ours, theirs = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: reader, ours)
    writing = asyncio.create_task(asyncio.to_thread(_send_and_shut, theirs, DATA))
    await reader.ended.wait()
    await writing
    transport.close()
    theirs.close()
    assert got == LINES


def _write_and_close(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


def _send_and_shut(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def test_the_end_of_each_read_is_told_after_its_lines() -> None:
    # The endpoint queues a read's lines and starts them at the end of the read, so the
    # lines of a backlog read together are queued together and share one fsync.
    seen: list[bytes | str] = []
    reader = LineReader(seen.append)  # type: ignore[arg-type]
    reader.on_read_end = lambda: seen.append("end")
    _read_into(reader, b"a\nb\nc\nd")
    assert seen == [b"a", b"b", b"c", "end"]
    _read_into(reader, b"\n")
    assert seen[-2:] == [b"d", "end"]
    reader.data_received(b"y" * (CHUNK - 1) + b"\nz\n")  # a thread feeding a file
    assert seen[-3:] == [b"y" * (CHUNK - 1), b"z", "end"]
    reader.pause()
    _read_into(reader, b"p\n")
    assert seen[-1] == "end"  # held back while paused: handed on, and ended, on resume
    reader.resume()
    assert seen[-2:] == [b"p", "end"]
