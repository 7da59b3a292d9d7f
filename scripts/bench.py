#!/usr/bin/env python3
"""``make bench``: hostcore's speed as ratios against floors measured in the same run.

Every figure is hostcore doing something over the real protocol (``python -m host serve``
on stdio pipes, as the app runs it) next to a *floor*: the least the machine can do for
the same job, measured by this script in the same run, with the same sizes, in the same
folder (so on the same file system and disk). Speed is measured, not asserted (STYLE.md
rule 10): the script prints a table (or JSON with ``--json``) with each figure's goal and
whether this run met it, and exits 0 whatever it found (``--check`` exits 1 on a miss).

==========================  =================================================  ===========
figure                      floor                                              goal
==========================  =================================================  ===========
append_one                  1 KB ``os.write`` + fsync, plus a bare JSON echo   <= 1.5x
                            over the same kind of pipes: one ``python -c``
                            child that appends and fsyncs each request line,
                            then echoes it (the parts measured apart are in
                            the note)
turn_change                 the same durable echo as append_one                <= 1.5x
append_backlog              one write + fsync per message, 3,000 times         >= 5x faster
update_message              copy the 50 MB file (copy_file_range), fsync,      <= 1.5x
                            rename, fsync the folder
update_memory               the host's VmHWM once started (idle peak)          <= +32 MB
get_page                    the same page of a 1,000-line transcript           <= 1.5x
truncate_tail               the same cut in a 1,000-line transcript            <= 2x
save_inflight               temp file, write, fsync, rename, folder fsync      <= 1.5x
host_start                  a fresh ``python -c`` reading the sessions rows    <= 1 s
                            and counting the message rows with sqlite3
host_start_bytes            host start with 10-line sessions                   <= 1.5x
==========================  =================================================  ===========

Peers: the same one-at-a-time append workload through a store that rewrites the whole
session JSON file per message (temp file, fsync, rename; what several chat apps do), and
through LangGraph's ``AsyncSqliteSaver`` (one ``aput`` of the whole ``messages`` state
per message) when ``langgraph-checkpoint-sqlite`` is importable; it is skipped with a
note when it is not.

Every timing is a median of repeated runs, host and floor interleaved so that a noisy
neighbour hurts both alike. Linux only (``/proc``, ``copy_file_range``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parent.parent
PROTOCOL_VERSION = 11
KB = 1024
MB = 1024 * 1024
TIMEOUT = 600.0  # the bound of any one wait on a child process
ECHO = (
    "import fcntl, os, sys\n"
    "try:\n"
    "    fcntl.fcntl(0, fcntl.F_SETPIPE_SZ, 1 << 20)  # as wide as the host makes its stdin\n"
    "except OSError:\n"
    "    pass\n"
    "log = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)"
    " if sys.argv[1:2] == ['durable'] else None\n"
    "r, w = sys.stdin.buffer, sys.stdout.buffer\n"
    "for line in r:\n"
    "    if log is not None:\n"
    "        os.write(log, line)\n"
    "        os.fsync(log)\n"
    "    w.write(line)\n"
    "    w.flush()\n"
)
"""The bare echo child: writes each line back (``durable PATH``: appends each line to PATH
and fsyncs it before writing it back)."""
SINK = (
    "import fcntl, os\n"
    "try:\n"
    "    fcntl.fcntl(0, fcntl.F_SETPIPE_SZ, 1 << 20)  # as wide as the host makes its stdin\n"
    "except OSError:\n"
    "    pass\n"
    "buf = bytearray()\n"
    "while chunk := os.read(0, 1 << 20):  # a buffered reader's line loop is 3x slower at 1 MB\n"
    "    buf += chunk\n"
    "    while (nl := buf.find(b'\\n')) >= 0:\n"
    "        line = bytes(buf[:nl])\n"
    "        del buf[: nl + 1]\n"
    "        rid = line[: line.index(b',', line.index(b'\"id\":'))].rsplit(b':', 1)[1]\n"
    "        os.write(1, b'{\"id\":' + rid + b'}\\n')\n"
)
"""The bare sink child: reads each line and answers just its id (a big request's transfer)."""


class BenchError(Exception):
    """Raised when a child answers with an error or dies: the run cannot go on."""


# -- sizes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sizes:
    """Every size and repeat count of one run."""

    one_rounds: int  # figure 1: rounds of host / fsync / echo / durable echo, interleaved
    one_ops: int  # ... operations of each kind per round
    backlog: int  # figure 2: appends in flight
    backlog_reps: int
    update_lines: int  # figures 3-4: lines of the big transcript
    update_line_bytes: int  # ... bytes of each line
    update_reps: int
    get_big: int  # figures 5-6: lines of the big transcript
    get_small: int  # ... and of the small one
    get_reps: int
    truncate_reps: int
    inflight_bytes: int  # figure 7
    inflight_reps: int
    start_sessions: int  # figure 8
    start_lines: int
    start_small_lines: int
    start_reps: int
    peer_counts: tuple[int, ...]
    peer_reps: tuple[int, ...]  # runs of each count
    peer_budget: float  # seconds a peer may take for one count before it is stopped


FULL = Sizes(
    one_rounds=10,
    one_ops=50,
    backlog=3000,
    backlog_reps=5,  # the noisiest figure (a VM's fsyncs swing 2x): the median of five
    update_lines=5000,
    update_line_bytes=10 * KB,
    update_reps=7,
    get_big=100_000,
    get_small=1000,
    get_reps=25,
    truncate_reps=15,
    inflight_bytes=MB,
    inflight_reps=100,
    start_sessions=1000,
    start_lines=1000,
    start_small_lines=10,
    start_reps=5,
    peer_counts=(100, 1000, 5000),
    peer_reps=(5, 3, 1),
    peer_budget=30.0,
)
QUICK = Sizes(
    one_rounds=2,
    one_ops=25,
    backlog=300,
    backlog_reps=2,
    update_lines=300,
    update_line_bytes=10 * KB,
    update_reps=3,
    get_big=5000,
    get_small=500,
    get_reps=5,
    truncate_reps=3,
    inflight_bytes=MB,
    inflight_reps=3,
    start_sessions=50,
    start_lines=100,
    start_small_lines=10,
    start_reps=2,
    peer_counts=(10, 50, 200),
    peer_reps=(3, 2, 1),
    peer_budget=5.0,
)


# -- results ---------------------------------------------------------------------------


@dataclass(slots=True)
class Figure:
    """One row of the table: hostcore, its floor, their ratio, the goal, and the verdict.

    ``ratio`` is hostcore / floor, except where the goal says "faster" (floor / hostcore).
    """

    key: str
    title: str
    hostcore: float
    floor: float
    unit: str  # "s" (seconds) or "MB"
    ratio: float
    goal: str
    met: bool
    note: str = ""


@dataclass(slots=True)
class Peer:
    """One peer comparison: the same workload through hostcore and through a peer store."""

    key: str
    title: str
    messages: int
    hostcore: float | None
    peer: float | None
    ratio: float | None  # peer / hostcore: how many times faster hostcore is
    done: int = 0  # messages the peer stored before its time budget ran out
    lower_bound: bool = False  # the peer ran out of budget: ``ratio`` is at least this
    skipped: str = ""  # why the peer was not run


@dataclass(slots=True)
class Run:
    """Everything one run found."""

    machine: dict[str, str]
    folder: str
    quick: bool
    figures: list[Figure] = field(default_factory=list)
    peers: list[Peer] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def median(xs: Sequence[float]) -> float:
    """The median of ``xs``."""
    return float(statistics.median(xs))


def progress(text: str) -> None:
    """Say what the run is doing, on stderr (stdout is the table or the JSON)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


# -- the wire --------------------------------------------------------------------------


class Reply(msgspec.Struct):
    """A response line (or, from the echo child, the request itself)."""

    id: int | None = None
    result: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    error: dict[str, Any] | None = None


_ENC = msgspec.json.Encoder()
_REPLY = msgspec.json.Decoder(Reply)
_REPLIES = msgspec.json.Decoder(list[Reply])
_ANY = msgspec.json.Decoder()


@dataclass(slots=True)
class Prepared:
    """Calls framed and registered, to be sent with one write."""

    futures: list[asyncio.Future[Reply]]
    data: bytes


class Conn:
    """One NDJSON JSON-RPC 2.0 connection to a child process over its stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self._writer = proc.stdin
        self._reader = proc.stdout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def spawn(cls, argv: Sequence[str], log: Path) -> Conn:
        """Start ``argv`` with pipes on stdin/stdout and stderr appended to ``log``."""
        with open(log, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                cwd=REPO,
                limit=1 << 27,
            )
        return cls(proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _read_loop(self) -> None:
        try:
            while line := await self._reader.readline():
                replies = _REPLIES.decode(line) if line[:1] == b"[" else [_REPLY.decode(line)]
                for r in replies:
                    fut = self._pending.pop(r.id, None) if r.id is not None else None
                    if fut is not None and not fut.done():
                        fut.set_result(r)
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(BenchError("the child closed its stdout"))
            self._pending.clear()

    def prepare(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> Prepared:
        """Frame ``calls`` (one line each) and register their futures."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Reply]] = []
        lines: list[bytes] = []
        for method, params in calls:
            rid = next(self._ids)
            fut: asyncio.Future[Reply] = loop.create_future()
            self._pending[rid] = fut
            futures.append(fut)
            lines.append(
                _ENC.encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            )
        return Prepared(futures, b"\n".join(lines) + b"\n")

    async def run(self, prepared: Prepared) -> list[Reply]:
        """Send prepared calls with one write; return every reply, or raise on an error."""
        self._writer.write(prepared.data)
        await self._writer.drain()
        replies = await asyncio.wait_for(asyncio.gather(*prepared.futures), TIMEOUT)
        for r in replies:
            if r.error is not None:
                raise BenchError(f"call answered with an error: {r.error}")
        return replies

    async def pipeline(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> list[Reply]:
        """Send every call in one write, without waiting; return the replies in order."""
        return await self.run(self.prepare(calls))

    async def call_raw(self, method: str, params: dict[str, Any]) -> Reply:
        """Call one method and return its reply (the result still encoded)."""
        return (await self.run(self.prepare([(method, params)])))[0]

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Call one method and return its decoded result."""
        reply = await self.call_raw(method, params or {})
        return _ANY.decode(reply.result)

    async def timed(self, method: str, params: dict[str, Any]) -> float:
        """Call one method; return the seconds from its write to its answer."""
        prepared = self.prepare([(method, params)])
        t0 = time.perf_counter()
        await self.run(prepared)
        return time.perf_counter() - t0

    async def close(self) -> int:
        """End the child's input, wait for it to exit, return its exit code."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.close()
        rc = await asyncio.wait_for(self.proc.wait(), TIMEOUT)
        await self._task
        return rc

    def kill(self) -> None:
        """Kill the child if it still runs (cleanup after a failure)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


# -- the bench's context ---------------------------------------------------------------


class Bench:
    """One run: its folder, sizes, children, and what it found."""

    def __init__(self, folder: Path, sizes: Sizes, run: Run) -> None:
        self.folder = folder
        self.sizes = sizes
        self.run = run
        self.children: list[Conn] = []
        self.log = folder / "children.stderr.log"
        self.main = folder / "main"  # the data dir of most figures

    async def host(self, data: Path) -> Conn:
        """Start ``python -m host serve --data-dir data`` and handshake."""
        conn = await Conn.spawn(
            [sys.executable, "-m", "host", "serve", "--data-dir", str(data)], self.log
        )
        self.children.append(conn)
        await conn.call("handshake", {"protocolVersion": PROTOCOL_VERSION})
        return conn

    async def echo(self, *, durable: Path | None = None) -> Conn:
        """Start the bare echo child: reads a line, writes it back.

        ``durable``: it appends each line to that file and fsyncs it before answering.
        """
        return await self._child(ECHO, *(["durable", str(durable)] if durable else []))

    async def sink(self) -> Conn:
        """Start the bare sink child: reads a line, answers just its id."""
        return await self._child(SINK)

    async def _child(self, source: str, *args: str) -> Conn:
        conn = await Conn.spawn([sys.executable, "-c", source, *args], self.log)
        self.children.append(conn)
        return conn

    async def stop(self, conn: Conn) -> None:
        """Close a child and check it exited 0."""
        rc = await conn.close()
        self.children.remove(conn)
        if rc != 0:
            raise BenchError(f"child {conn.pid} exited {rc}; see {self.log}")

    def kill_all(self) -> None:
        """Kill every child still running."""
        for conn in self.children:
            conn.kill()

    def figure(
        self,
        key: str,
        title: str,
        hostcore: float,
        floor: float,
        goal: str,
        *,
        unit: str = "s",
        faster: bool = False,
        limit: float,
        note: str = "",
    ) -> Figure:
        """Record one figure; ``limit`` is the ratio the goal allows (a minimum if faster)."""
        if faster:
            ratio = floor / hostcore if hostcore > 0 else float("inf")
            met = ratio >= limit
        else:
            ratio = hostcore / floor if floor > 0 else float("inf")
            met = ratio <= limit
        fig = Figure(key, title, hostcore, floor, unit, ratio, goal, met, note)
        self.run.figures.append(fig)
        progress(f"{key}: {fmt_value(hostcore, unit)} vs {fmt_value(floor, unit)}")
        return fig


# -- building blocks -------------------------------------------------------------------


def message(mid: str, role: str, size: int) -> dict[str, Any]:
    """A message whose stored line is about ``size`` bytes."""
    bare = len(_ENC.encode({"id": mid, "role": role, "content": ""}))
    return {"id": mid, "role": role, "content": "x" * max(0, size - bare)}


def role_of(i: int) -> str:
    return "user" if i % 2 == 0 else "assistant"


def appends(sid: str, prefix: str, start: int, n: int, size: int) -> list[tuple[str, Any]]:
    """``n`` appendMessage calls of ``size``-byte messages ``prefix-start`` on."""
    return [
        (
            "session.appendMessage",
            {"sessionId": sid, "message": message(f"{prefix}-{i}", role_of(i), size)},
        )
        for i in range(start, start + n)
    ]


async def build(host: Conn, sid: str, prefix: str, n: int, size: int, chunk_bytes: int) -> None:
    """Create ``sid`` and append ``n`` lines, pipelined in writes of about ``chunk_bytes``."""
    await host.call("session.create", {"sessionId": sid})
    per = max(1, chunk_bytes // (size + 100))
    for start in range(0, n, per):
        await host.pipeline(appends(sid, prefix, start, min(per, n - start), size))


def vm_kb(pid: int, name: str) -> int:
    """A ``/proc/PID/status`` value in kB (``VmHWM``: peak resident set)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise BenchError(f"no {name} in /proc/{pid}/status")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class RawLog:
    """The floor of a durable append: ``os.write`` of a whole line, then fsync."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, line: bytes) -> float:
        """Append one line durably; return the seconds it took."""
        t0 = time.perf_counter()
        write_all(self.fd, line)
        os.fsync(self.fd)
        return time.perf_counter() - t0

    def close(self) -> None:
        os.close(self.fd)


def copy_replace(src: Path, dst: Path) -> float:
    """Copy ``src`` over ``dst`` in the kernel: temp file, fsync, rename, folder fsync."""
    t0 = time.perf_counter()
    tmp = dst.with_name(dst.name + ".tmp")
    fin = os.open(src, os.O_RDONLY)
    fout = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        size = os.fstat(fin).st_size
        off = 0
        while off < size:
            n = os.copy_file_range(fin, fout, size - off, off)
            if n == 0:
                raise BenchError("copy_file_range copied nothing")
            off += n
        os.fsync(fout)
    finally:
        os.close(fin)
        os.close(fout)
    os.rename(tmp, dst)
    fsync_dir(dst.parent)
    return time.perf_counter() - t0


def atomic_replace(path: Path, data: bytes) -> float:
    """The atomic-replace recipe done raw: temp file, write, fsync, rename, folder fsync."""
    t0 = time.perf_counter()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    fsync_dir(path.parent)
    return time.perf_counter() - t0


class RewriteStore:
    """The peer: the session kept in memory, its whole JSON file rewritten per message.

    What several chat apps do (``writeFile(JSON.stringify(session))``), made durable:
    temp file, fsync, rename. It runs in this process, with no pipe to cross.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[dict[str, Any]] = []

    def append(self, msg: dict[str, Any]) -> None:
        """Store one more message durably by rewriting the whole file."""
        self.messages.append(msg)
        data = _ENC.encode({"id": self.path.stem, "messages": self.messages})
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path)


INDEX_READ = (
    "import sqlite3, sys\n"
    "conn = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True)\n"
    "sessions = conn.execute('SELECT * FROM sessions').fetchall()\n"
    "counts = conn.execute('SELECT session_id, COUNT(*) FROM messages GROUP BY session_id')\n"
    "print(len(sessions), sum(c for _, c in counts), flush=True)\n"
)


def read_index_rows(index: Path) -> float:
    """Read every session row and count the message rows, in this process."""
    t0 = time.perf_counter()
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        sessions = conn.execute("SELECT * FROM sessions").fetchall()
        counts = dict(conn.execute("SELECT session_id, COUNT(*) FROM messages GROUP BY session_id"))
    finally:
        conn.close()
    if len(counts) > len(sessions):
        raise BenchError("index has message rows of sessions it does not list")
    return time.perf_counter() - t0


async def time_index_read(index: Path) -> float:
    """The floor of a host start: a fresh interpreter that reads the index rows.

    Seconds from spawning ``python -c`` to its one line of output, like a host start
    measured from spawn to the handshake answer.
    """
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", INDEX_READ, str(index), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)
    seconds = time.perf_counter() - t0
    if await proc.wait() != 0 or not line:
        raise BenchError("the index reader failed")
    return seconds


async def time_start(bench: Bench, data: Path) -> float:
    """Seconds from spawning a host on ``data`` to its answer to the handshake.

    The host runs start-up recovery before it reads its first request, so the handshake
    answer comes only once the data dir is recovered.
    """
    t0 = time.perf_counter()
    conn = await Conn.spawn(
        [sys.executable, "-m", "host", "serve", "--data-dir", str(data)], bench.log
    )
    bench.children.append(conn)
    await conn.call("handshake", {"protocolVersion": PROTOCOL_VERSION})
    seconds = time.perf_counter() - t0
    await bench.stop(conn)
    return seconds


async def counter(host: Conn, name: str) -> int:
    """A ``host.stats`` counter."""
    stats = await host.call("host.stats")
    return int(stats["counters"].get(name, 0))


# -- the figures -----------------------------------------------------------------------


async def fig_append_one(bench: Bench, host: Conn) -> None:
    """1: one durable 1 KB append at a time vs a 1 KB write + fsync plus a pipe echo."""
    z = bench.sizes
    sid = "one"
    await host.call("session.create", {"sessionId": sid})
    echo = await bench.echo()
    durable = await bench.echo(durable=bench.folder / "floor-durable-echo.jsonl")
    raw = RawLog(bench.folder / "floor-append.jsonl")
    line = _ENC.encode(message("floor", "user", KB)) + b"\n"
    counter_ = itertools.count()

    def params() -> dict[str, Any]:
        i = next(counter_)
        return {"sessionId": sid, "message": message(f"one-{i}", role_of(i), KB)}

    host_t: list[float] = []
    disk_t: list[float] = []
    echo_t: list[float] = []
    durable_t: list[float] = []
    try:
        for _ in range(20):  # warm up: page cache, sqlite, code paths
            await host.timed("session.appendMessage", params())
            await echo.timed("session.appendMessage", params())
            await durable.timed("session.appendMessage", params())
            raw.append(line)
        for _ in range(z.one_rounds):
            for _ in range(z.one_ops):
                host_t.append(await host.timed("session.appendMessage", params()))
            for _ in range(z.one_ops):
                disk_t.append(raw.append(line))
            for _ in range(z.one_ops):
                echo_t.append(await echo.timed("session.appendMessage", params()))
            for _ in range(z.one_ops):
                durable_t.append(await durable.timed("session.appendMessage", params()))
    finally:
        raw.close()
        await bench.stop(echo)
        await bench.stop(durable)
    disk, pipe, floor = median(disk_t), median(echo_t), median(durable_t)
    ours = median(host_t)
    bench.figure(
        "append_one",
        "appendMessage, one at a time, 1 KB",
        ours,
        floor,
        "<= 1.5x",
        limit=1.5,
        note=(
            f"floor = a child that appends each request line with os.write + fsync, then"
            f" echoes it: {fmt_value(floor)}; measured apart, write+fsync {fmt_value(disk)}"
            f" + pipe echo {fmt_value(pipe)} = {fmt_value(disk + pipe)}"
            f" ({ours / (disk + pipe):.2f}x): the parts apart miss the wake-ups a durable"
            " answer pays while the other side sleeps through the fsync"
        ),
    )


async def fig_turns(bench: Bench, host: Conn) -> None:
    """A turn change (beginTurn, endTurn without a prompt) vs a durable echo.

    Each is one line fsynced in the session's turn log before the answer, so its floor
    is append_one's: a child that appends each request line with write + fsync, then
    echoes it.
    """
    z = bench.sizes
    sid = "turns"
    await host.call("session.create", {"sessionId": sid})
    durable = await bench.echo(durable=bench.folder / "floor-durable-turns.jsonl")
    turn = itertools.count()
    host_t: list[float] = []
    floor_t: list[float] = []

    async def change() -> float:
        i = next(turn)
        params = {"sessionId": sid, "turnId": f"t{i // 2}"}
        if i % 2:
            return await host.timed("session.endTurn", {**params, "status": "completed"})
        return await host.timed("session.beginTurn", params)

    try:
        for _ in range(20):  # warm up
            await change()
            await durable.timed("session.endTurn", {"sessionId": sid})
        for _ in range(z.one_rounds):
            for _ in range(z.one_ops):
                host_t.append(await change())
            for _ in range(z.one_ops):
                floor_t.append(await durable.timed("session.endTurn", {"sessionId": sid}))
    finally:
        await bench.stop(durable)
    bench.figure(
        "turn_change",
        "beginTurn / endTurn, one at a time, no prompt",
        median(host_t),
        median(floor_t),
        "<= 1.5x",
        limit=1.5,
        note="each is one fsynced line in the session's turn log, then the index's table",
    )


async def fig_append_backlog(bench: Bench, host: Conn) -> None:
    """2: a backlog of appends in flight (an outbox draining) vs one fsync per message."""
    z = bench.sizes
    n = z.backlog
    line = _ENC.encode(message("floor", "user", KB)) + b"\n"
    host_t: list[float] = []
    floor_t: list[float] = []
    fsyncs: list[int] = []
    for rep in range(z.backlog_reps):
        sid = f"backlog-{rep}"
        await host.call("session.create", {"sessionId": sid})
        prepared = host.prepare(appends(sid, sid, 0, n, KB))
        before = await counter(host, "fsyncs")
        t0 = time.perf_counter()
        await host.run(prepared)
        host_t.append(time.perf_counter() - t0)
        fsyncs.append(await counter(host, "fsyncs") - before)
        raw = RawLog(bench.folder / f"floor-backlog-{rep}.jsonl")
        try:
            floor_t.append(sum(raw.append(line) for _ in range(n)))
        finally:
            raw.close()
    bench.figure(
        "append_backlog",
        f"{n:,} appends in flight, 1 KB each",
        median(host_t),
        median(floor_t),
        ">= 5x faster",
        faster=True,
        limit=5.0,
        note=f"host fsyncs per backlog: {fsyncs} for {n:,} answers (group commit)",
    )


async def fig_update(bench: Bench) -> None:
    """3-4: updateMessage in a big transcript vs copying it; the host's memory meanwhile."""
    z = bench.sizes
    data = bench.folder / "update"
    sid = "big"
    n, size = z.update_lines, z.update_line_bytes
    host = await bench.host(data)
    t0 = time.perf_counter()
    await build(host, sid, "big", n, size, 4 * MB)
    built = time.perf_counter() - t0
    await bench.stop(host)
    path = data / "sessions" / f"{sid}.jsonl"
    file_mb = path.stat().st_size / MB
    progress(f"built {n:,} lines of {size // KB} KB ({file_mb:.0f} MB) in {built:.1f} s")

    host = await bench.host(data)  # a fresh process: its peak so far is its idle peak
    idle = vm_kb(host.pid, "VmHWM")
    mid = n // 2
    floor_path = bench.folder / "floor-copy.jsonl"
    host_t: list[float] = []
    floor_t: list[float] = []
    for rep in range(z.update_reps):
        # Each edit changes the line's length, so the index shifts the offsets after it.
        msg = message(f"big-{mid}", role_of(mid), size + 1 + rep % 2)
        host_t.append(await host.timed("session.updateMessage", {"sessionId": sid, "message": msg}))
        floor_t.append(copy_replace(path, floor_path))
    peak = vm_kb(host.pid, "VmHWM")
    await bench.stop(host)
    bench.figure(
        "update_message",
        f"updateMessage, {file_mb:.0f} MB / {n:,}-line transcript",
        median(host_t),
        median(floor_t),
        "<= 1.5x",
        limit=1.5,
        note="floor = copy_file_range of the whole file + fsync + rename + folder fsync",
    )
    delta_mb = (peak - idle) / KB
    fig = Figure(
        "update_memory",
        "host memory (VmHWM) during that",
        peak / KB,
        idle / KB,
        "MB",
        peak / idle,
        "<= +32 MB",
        delta_mb <= 32,
        f"+{delta_mb:.1f} MB over the idle peak; the file is {file_mb:.0f} MB",
    )
    bench.run.figures.append(fig)
    progress(f"update_memory: {fmt_value(peak / KB, 'MB')} vs {fmt_value(idle / KB, 'MB')}")


async def fig_get_truncate(bench: Bench, host: Conn) -> None:
    """5-6: a 100-line page and a 10-line cut, big transcript vs small one."""
    z = bench.sizes
    line_size = 200
    t0 = time.perf_counter()
    await build(host, "get-big", "gb", z.get_big, line_size, 2 * MB)
    await build(host, "get-small", "gs", z.get_small, line_size, 2 * MB)
    progress(f"built {z.get_big:,} + {z.get_small:,} lines in {time.perf_counter() - t0:.1f} s")
    sizes = {"get-big": z.get_big, "get-small": z.get_small}

    get_t: dict[str, list[float]] = {sid: [] for sid in sizes}
    for _ in range(3):  # warm up
        for sid in sizes:
            await host.timed("session.get", {"sessionId": sid, "limit": 100})
    for _ in range(z.get_reps):
        for sid, total in sizes.items():
            # The last page, then one from the middle: both must cost what the page costs.
            get_t[sid].append(await host.timed("session.get", {"sessionId": sid, "limit": 100}))
            mid = {"sessionId": sid, "limit": 100, "beforeLine": total // 2}
            get_t[sid].append(await host.timed("session.get", mid))
    bench.figure(
        "get_page",
        f"get 100 lines, {z.get_big:,}-line vs {z.get_small:,}-line transcript",
        median(get_t["get-big"]),
        median(get_t["get-small"]),
        "<= 1.5x",
        limit=1.5,
        note="the last page and a page from the middle, alternately",
    )

    cut_t: dict[str, list[float]] = {sid: [] for sid in sizes}
    rounds = itertools.count()
    for _ in range(z.truncate_reps + 1):  # the first round warms up
        r = next(rounds)
        for sid, total in sizes.items():
            # Fresh rows for every cut: append 10 (user first: an edit-resend cut, no
            # archive), then cut them; only the cut is timed.
            prefix = f"cut{r}"
            await host.pipeline(appends(sid, prefix, total, 10, line_size))
            params = {"sessionId": sid, "fromMessageId": f"{prefix}-{total}"}
            seconds = await host.timed("session.truncateFrom", params)
            if r > 0:
                cut_t[sid].append(seconds)
    bench.figure(
        "truncate_tail",
        f"truncateFrom the last 10 lines, {z.get_big:,} vs {z.get_small:,} lines",
        median(cut_t["get-big"]),
        median(cut_t["get-small"]),
        "<= 2x",
        limit=2.0,
        note="each cut on 10 fresh rows appended before it (not timed)",
    )


async def fig_inflight(bench: Bench, host: Conn) -> None:
    """7: saveInflightMessage of a 1 MB snapshot vs the atomic-replace recipe done raw."""
    z = bench.sizes
    sid = "inflight"
    await host.call("session.create", {"sessionId": sid})
    msg = message("inflight-reply", "assistant", z.inflight_bytes)
    params = {"sessionId": sid, "turnId": "t-inflight", "message": msg}
    await host.call("session.saveInflightMessage", params)  # warm up; sets the file size
    payload = (bench.main / "sessions" / f"{sid}.inflight.json").read_bytes()
    floor_path = bench.folder / "floor-inflight.json"
    atomic_replace(floor_path, payload)
    sink = await bench.sink()
    host_t: list[float] = []
    floor_t: list[float] = []
    pipe_t: list[float] = []
    try:
        await sink.timed("session.saveInflightMessage", params)
        for _ in range(z.inflight_reps):
            host_t.append(await host.timed("session.saveInflightMessage", params))
            floor_t.append(atomic_replace(floor_path, payload))
            pipe_t.append(await sink.timed("session.saveInflightMessage", params))
    finally:
        await bench.stop(sink)
    bench.figure(
        "save_inflight",
        f"saveInflightMessage, {len(payload) / MB:.0f} MB snapshot",
        median(host_t),
        median(floor_t),
        "<= 1.5x",
        limit=1.5,
        note=(
            "floor = temp file, write, fsync, rename, folder fsync of the same bytes;"
            f" the request alone over the pipes to a child that answers its id:"
            f" {fmt_value(median(pipe_t))}"
        ),
    )


async def build_sessions(bench: Bench, data: Path, sessions: int, lines: int) -> float:
    """Build ``sessions`` clean sessions of ``lines`` lines through a host; return seconds.

    One ``session.replaceMessages`` per session writes its transcript and all its index
    rows in one go, so the index is clean (as after normal use) and the build is quick.
    """
    t0 = time.perf_counter()
    host = await bench.host(data)
    sids = [f"s{i:05d}" for i in range(sessions)]
    await host.pipeline([("session.create", {"sessionId": sid}) for sid in sids])
    per = max(1, (4 * MB) // (lines * 150))
    for start in range(0, sessions, per):
        calls: list[tuple[str, dict[str, Any]]] = []
        for sid in sids[start : start + per]:
            msgs = [message(f"{sid}-{i}", role_of(i), 150) for i in range(lines)]
            calls.append(("session.replaceMessages", {"sessionId": sid, "messages": msgs}))
        await host.pipeline(calls)
    await bench.stop(host)
    return time.perf_counter() - t0


async def fig_start(bench: Bench) -> None:
    """8: host start over many clean sessions vs reading their index rows; O(sessions)."""
    z = bench.sizes
    n = z.start_sessions
    big = bench.folder / "start-big"
    small = bench.folder / "start-small"
    empty = bench.folder / "start-empty"
    built_big = await build_sessions(bench, big, n, z.start_lines)
    built_small = await build_sessions(bench, small, n, z.start_small_lines)
    progress(
        f"built {n:,} sessions of {z.start_lines:,} lines in {built_big:.1f} s"
        f" and of {z.start_small_lines} lines in {built_small:.1f} s"
    )
    host = await bench.host(empty)
    await bench.stop(host)

    host = await bench.host(big)  # check the index really is clean: nothing to reconcile
    reconciled = await counter(host, "recovery.reconciled")
    await bench.stop(host)
    if reconciled:
        bench.run.notes.append(f"host_start: {reconciled} session(s) were reconciled at start")

    big_t: list[float] = []
    small_t: list[float] = []
    empty_t: list[float] = []
    floor_t: list[float] = []
    inproc_t: list[float] = []
    for _ in range(z.start_reps):
        big_t.append(await time_start(bench, big))
        small_t.append(await time_start(bench, small))
        empty_t.append(await time_start(bench, empty))
        floor_t.append(await time_index_read(big / "index.sqlite3"))
        inproc_t.append(read_index_rows(big / "index.sqlite3"))
    start_big, start_small = median(big_t), median(small_t)
    mb = sum(p.stat().st_size for p in (big / "sessions").glob("*.jsonl")) / MB
    fig = bench.figure(
        "host_start",
        f"host start, {n:,} clean sessions of {z.start_lines:,} lines",
        start_big,
        median(floor_t),
        "<= 1 s",
        limit=float("inf"),
        note=(
            f"spawn to handshake answer; {mb:.0f} MB of transcripts; an empty data dir"
            f" starts in {fmt_value(median(empty_t))} (interpreter + imports); floor = a"
            f" fresh python reading the index rows ({fmt_value(median(inproc_t))} of it"
            " the SQL); built with one session.replaceMessages per session (clean index)"
        ),
    )
    fig.met = start_big <= 1.0
    bench.figure(
        "host_start_bytes",
        f"host start, {z.start_lines:,}-line vs {z.start_small_lines}-line sessions",
        start_big,
        start_small,
        "<= 1.5x (O(sessions))",
        limit=1.5,
        note=f"{n:,} sessions both; {z.start_lines // z.start_small_lines}x the bytes",
    )


def langgraph_saver() -> tuple[Any, Any] | str:
    """``(AsyncSqliteSaver, empty_checkpoint)``, or why they cannot be had."""
    try:
        from langgraph.checkpoint.base import empty_checkpoint  # type: ignore[import-not-found,unused-ignore]
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        return f"langgraph-checkpoint-sqlite is not installed ({exc})"
    return AsyncSqliteSaver, empty_checkpoint


async def langgraph_appends(
    path: Path, msgs: Sequence[dict[str, Any]], budget: float
) -> tuple[float, int]:
    """``aput`` one checkpoint per message, each holding the messages so far.

    That is what a LangGraph agent's checkpointer does once per step with a ``messages``
    channel. Stops once ``budget`` seconds are spent; returns (seconds, messages stored).
    """
    got = langgraph_saver()
    assert not isinstance(got, str)
    saver_cls, empty_checkpoint = got
    async with saver_cls.from_conn_string(str(path)) as saver:
        await saver.setup()
        config: Any = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
        version: str | None = None
        done = 0
        t0 = time.perf_counter()
        for i in range(len(msgs)):
            version = saver.get_next_version(version, None)
            cp = empty_checkpoint()
            cp["channel_values"] = {"messages": list(msgs[: i + 1])}
            cp["channel_versions"] = {"messages": version}
            meta = {"source": "loop", "step": i, "parents": {}}
            config = await saver.aput(config, cp, meta, {"messages": version})
            done += 1
            if time.perf_counter() - t0 > budget:
                break
        return time.perf_counter() - t0, done


def rewrite_appends(path: Path, msgs: Sequence[dict[str, Any]], budget: float) -> tuple[float, int]:
    """Store ``msgs`` one by one in a :class:`RewriteStore`; stop past ``budget`` seconds."""
    store = RewriteStore(path)
    done = 0
    t0 = time.perf_counter()
    for m in msgs:
        store.append(m)
        done += 1
        if time.perf_counter() - t0 > budget:
            break
    return time.perf_counter() - t0, done


def peer_row(key: str, title: str, n: int, ours: float, runs: list[tuple[float, int]]) -> Peer:
    """A peer's row from its runs; one that ran out of budget gives a lower bound."""
    theirs = median([seconds for seconds, _ in runs])
    done = min(d for _, d in runs)
    return Peer(key, title, n, ours, theirs, theirs / ours, done, done < n)


async def peers(bench: Bench, host: Conn) -> None:
    """The same one-at-a-time append workload through hostcore and through the peers.

    Each count is run ``peer_reps`` times (fresh session, fresh peer file each time),
    hostcore and peers interleaved; the medians are compared.
    """
    lg = langgraph_saver()
    budget = bench.sizes.peer_budget
    for n, reps in zip(bench.sizes.peer_counts, bench.sizes.peer_reps, strict=True):
        ours: list[float] = []
        rewrite: list[tuple[float, int]] = []
        graph: list[tuple[float, int]] = []
        for rep in range(reps):
            sid = f"peer-{n}-{rep}"
            msgs = [message(f"{sid}-{i}", role_of(i), KB) for i in range(n)]
            await host.call("session.create", {"sessionId": sid})
            t0 = time.perf_counter()
            for m in msgs:
                await host.call_raw("session.appendMessage", {"sessionId": sid, "message": m})
            ours.append(time.perf_counter() - t0)
            path = bench.folder / f"{sid}.json"
            rewrite.append(rewrite_appends(path, msgs, budget))
            path.unlink()
            if not isinstance(lg, str):
                path = bench.folder / f"{sid}.sqlite"
                graph.append(await langgraph_appends(path, msgs, budget))
                for p in path.parent.glob(path.name + "*"):  # the database and its WAL
                    p.unlink()
        host_s = median(ours)
        rows = [peer_row(f"peer_rewrite_{n}", REWRITE_TITLE, n, host_s, rewrite)]
        if isinstance(lg, str):
            rows.append(
                Peer(f"peer_langgraph_{n}", LANGGRAPH_TITLE, n, host_s, None, None, skipped=lg)
            )
        else:
            rows.append(peer_row(f"peer_langgraph_{n}", LANGGRAPH_TITLE, n, host_s, graph))
        for row in rows:
            bench.run.peers.append(row)
            if row.peer is not None:
                progress(f"{row.key}: {fmt_value(host_s)} vs {fmt_value(row.peer)}")
    if isinstance(lg, str):
        bench.run.notes.append(f"LangGraph peer skipped: {lg}")
    bench.run.notes.append(
        f"peers: medians of {', '.join(map(str, bench.sizes.peer_reps))} runs; a peer that"
        f" passes {budget:.0f} s is stopped there, and its ratio is then a lower bound"
    )


REWRITE_TITLE = "rewrite-the-whole-file store"
LANGGRAPH_TITLE = "LangGraph AsyncSqliteSaver"


async def hop_costs(bench: Bench) -> None:
    """Note what a hop between the loop and a thread costs here: the host pays it per await."""
    import aiosqlite  # a host dependency, so it is installed wherever the host is

    async def to_thread() -> float:
        t0 = time.perf_counter()
        await asyncio.to_thread(int)
        return time.perf_counter() - t0

    hop = median([await to_thread() for _ in range(200)])
    async with aiosqlite.connect(":memory:") as db:
        rt: list[float] = []
        for _ in range(200):
            t0 = time.perf_counter()
            await db.execute_fetchall("SELECT 1")
            rt.append(time.perf_counter() - t0)
    bench.run.notes.append(
        f"on this machine one asyncio.to_thread round trip costs {fmt_value(hop)} and one"
        f" aiosqlite statement {fmt_value(median(rt))} (each await of the host's index is one)"
    )


PARTS = (
    "append_one",
    "turns",
    "append_backlog",
    "save_inflight",
    "peers",
    "get_truncate",
    "update",
    "start",
)
"""The parts of a run, in the order that keeps the big builds apart (``--only`` picks)."""


async def bench_all(bench: Bench, only: frozenset[str] = frozenset(PARTS)) -> None:
    """Run the figures and peers named in ``only``."""
    await hop_costs(bench)
    shared = {
        "append_one": fig_append_one,
        "turns": fig_turns,
        "append_backlog": fig_append_backlog,
        "save_inflight": fig_inflight,
        "peers": peers,
        "get_truncate": fig_get_truncate,
    }
    if only & shared.keys():
        host = await bench.host(bench.main)
        try:
            for name, fig in shared.items():
                if name in only:
                    await fig(bench, host)
        finally:
            await bench.stop(host)
    if "update" in only:
        await fig_update(bench)
    if "start" in only:
        await fig_start(bench)


# -- output ----------------------------------------------------------------------------


def fmt_value(value: float, unit: str = "s") -> str:
    """A time in s, ms or us, or a size in MB."""
    if unit == "MB":
        return f"{value:.1f} MB"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.0f} us"


def fmt_ratio(fig: Figure) -> str:
    if fig.key == "update_memory":
        return f"+{fig.hostcore - fig.floor:.1f} MB"
    if "faster" in fig.goal:
        return f"{fig.ratio:.1f}x faster"
    return f"{fig.ratio:.2f}x"


def table(rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (the README carries one)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def render(run: Run) -> str:
    """The whole report as text."""
    lines = [
        f"hostcore bench ({'quick' if run.quick else 'full'} run, {run.seconds:.0f} s)"
        f" in {run.folder}",
        "machine: " + ", ".join(f"{k} {v}" for k, v in run.machine.items()),
        "",
    ]
    rows = [["figure", "hostcore", "floor", "ratio", "goal", "met?"]]
    for f in run.figures:
        rows.append(
            [
                f.title,
                fmt_value(f.hostcore, f.unit),
                fmt_value(f.floor, f.unit),
                fmt_ratio(f),
                f.goal,
                "yes" if f.met else "NO",
            ]
        )
    lines.append(table(rows))
    lines.append("")
    for f in run.figures:
        if f.note:
            lines.append(f"- {f.key}: {f.note}")
    if run.peers:
        lines.append("")
        rows = [["peer: same appends, one at a time, 1 KB", "messages", "hostcore", "peer"]]
        rows[0].append("hostcore is")
        for p in sorted(run.peers, key=lambda p: (p.key.rsplit("_", 1)[0], p.messages)):
            rows.append([p.title, f"{p.messages:,}", fmt_value(p.hostcore or 0)])
            if p.ratio is None or p.peer is None:
                rows[-1] += ["-", "skipped"]
                continue
            if p.lower_bound:
                peer = f"> {fmt_value(p.peer)} ({p.done:,} done)"
                verdict = f">= {p.ratio:.1f}x faster"
            else:
                peer = fmt_value(p.peer)
                verdict = f"{p.ratio:.1f}x faster" if p.ratio >= 1 else f"{1 / p.ratio:.1f}x slower"
            rows[-1] += [peer, verdict]
        lines.append(table(rows))
    if run.notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in run.notes)
    missed = [f.key for f in run.figures if not f.met]
    lines.append("")
    lines.append("every goal met" if not missed else "goals missed: " + ", ".join(missed))
    return "\n".join(lines)


def machine(folder: Path) -> dict[str, str]:
    """What this run ran on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    fs = "?"
    with contextlib.suppress(OSError):
        best = ""
        real = os.path.realpath(folder)
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mount = parts[1]
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best):
                best, fs = mount, f"{parts[2]} on {parts[0]}"
    return {
        "cpu": f"{cpu} x{os.cpu_count()}",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "fs": fs,
    }


# -- entry point -----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run of a few seconds"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        help="folder to run in (a fresh subfolder is made and removed); default ./.bench."
        " It decides the file system measured: use the one your data lives on",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument(
        "--only",
        type=lambda v: frozenset(v.split(",")),
        default=frozenset(PARTS),
        help=f"run only these parts, comma-separated: {','.join(PARTS)}",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; print the table (or JSON); return the exit code."""
    args = parse_args(argv)
    unknown = args.only - set(PARTS)
    if unknown:
        raise SystemExit(f"--only: unknown parts {sorted(unknown)}; known: {', '.join(PARTS)}")
    parent: Path = args.dir if args.dir is not None else Path.cwd() / ".bench"
    made_parent = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
    run = Run(machine(folder), str(folder), args.quick)
    bench = Bench(folder, QUICK if args.quick else FULL, run)
    t0 = time.perf_counter()
    try:
        asyncio.run(_guarded(bench, bench_all(bench, args.only)))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
            if made_parent:
                with contextlib.suppress(OSError):
                    parent.rmdir()
    run.seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps(asdict(run), indent=2))
    else:
        print(render(run))
    return 1 if args.check and not all(f.met for f in run.figures) else 0


async def _guarded(bench: Bench, work: Awaitable[None]) -> None:
    try:
        await work
    except BaseException:
        with contextlib.suppress(OSError):
            sys.stderr.write(bench.log.read_text()[-4000:])
        raise
    finally:
        bench.kill_all()


if __name__ == "__main__":
    sys.exit(main())
