#!/usr/bin/env python3
"""Watches' cost (issue 34), measured against the same host without them, in the same run.

A host serves a Unix socket (``python -m host serve --socket``, as a background service runs
it); one writer connection appends 1 KB messages one at a time (``append_one``), and:

==========================  ==============================================================
figure                      what and against what
==========================  ==============================================================
event_latency               8 watchers (8 connections) on 4 sessions, 2 each; the writer
                            appends to the 4 in turn; from the writer's reading of an
                            append's answer to each watcher's reading of its event: p50,
                            p99 (negative: the event came first)
append_watched              append_one on a session 8 watchers follow, against append_one
                            on one nobody watches, interleaved blocks: <= 1.1x
stalled_watcher             a watcher that never reads (its socket's buffers shrunk) on a
                            session a writer appends 16 KB messages to, then to another
                            nobody watches, interleaved: the writer's ratio (<= 1.1x) and
                            the host's VmRSS growth (bounded: the transport's 4 MiB, the
                            watcher's 1 MiB queue, then it is dropped with one reset)
==========================  ==============================================================

Speed is measured, not asserted (STYLE.md rule 10): it prints the figures (``--json``:
one JSON object) and exits 0, or 1 with ``--check`` when a goal is missed. Linux only
(``/proc``). Run: ``.venv/bin/python scripts/bench_watch.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

_ENC = msgspec.json.Encoder()
_DEC = msgspec.json.Decoder()
REPO = Path(__file__).resolve().parent.parent


SIZE = 16 * 1024  # the stalled watcher's session gets lines of this size


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))]


class Conn:
    """One socket connection: calls one at a time, events timed as they are read."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.seen: dict[str, float] = {}  # message id -> when its event was read
        self.ended = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, path: str) -> Conn:
        reader, writer = await asyncio.open_unix_connection(path, limit=1 << 26)
        conn = cls(reader, writer)
        await conn.call("handshake", {"protocolVersion": 11})
        return conn

    async def _read(self) -> None:
        while line := await self.reader.readline():
            now = time.perf_counter()
            msg = _DEC.decode(line)
            if msg.get("method") == "session.event":
                ev = msg["params"]["event"]
                if ev["kind"] == "appended":
                    self.seen[ev["message"]["id"]] = now
                elif ev["kind"] == "live":  # the writer's last word: every event is in
                    self.ended.set()
            elif (fut := self.pending.pop(msg.get("id"), None)) is not None:
                fut.set_result((msg, now))

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        rid = next(self.ids)
        fut = self.pending[rid] = asyncio.get_running_loop().create_future()
        self.writer.write(
            _ENC.encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + b"\n"
        )
        msg, _ = await fut
        if "error" in msg:
            raise RuntimeError(msg["error"])
        return msg["result"]

    async def timed(self, method: str, params: dict[str, Any]) -> tuple[float, float]:
        """The round trip's seconds, and when the answer was read."""
        t0 = time.perf_counter()
        rid = next(self.ids)
        fut = self.pending[rid] = asyncio.get_running_loop().create_future()
        self.writer.write(
            _ENC.encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + b"\n"
        )
        msg, t1 = await fut
        assert "result" in msg, msg
        return t1 - t0, t1

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await self.task


def cheap_watchers(sock: str, sessions: list[str]) -> None:
    """``--cheap``: watchers that cost their machine little, so the writer's figures are the
    host's, not the scheduler's: each connection is read every 5 ms, whatever came (one
    wake-up a poll, not one an event), and the events are counted at the end."""
    conns = []
    for sid in sessions:
        c = socket.socket(socket.AF_UNIX)
        c.connect(sock)
        hello = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "handshake",
            "params": {"protocolVersion": 11},
        }
        watch = {"jsonrpc": "2.0", "id": 2, "method": "session.watch", "params": {"sessionId": sid}}
        c.sendall(_ENC.encode(hello) + b"\n" + _ENC.encode(watch) + b"\n")
        got = b""
        while got.count(b"\n") < 2:
            got += c.recv(65536)
        c.setblocking(False)
        conns.append([c, bytearray(got.split(b"\n", 2)[2])])
    print("ready", flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    deadline = math.inf
    while not done.wait(0.005) or (
        time.monotonic() < deadline and not all(b'"kind":"live"' in b for _, b in conns)
    ):  # after stdin's end, the events still on their way, up to the writer's last word
        if done.is_set():
            deadline = min(deadline, time.monotonic() + ENDED)
        for conn in conns:
            with contextlib.suppress(BlockingIOError):
                while data := conn[0].recv(1 << 20):
                    conn[1] += data
    counts = [{str(i): 0.0 for i in range(bytes(b).count(b'"kind":"appended"'))} for _, b in conns]
    print(json.dumps(counts), flush=True)


async def watch_in_child(sock: str, sessions: list[str]) -> None:
    """``--watchers``: one watcher per session named, each its own connection, in this
    process (not the writer's: its loop must not wait for theirs); at end of stdin, print
    when each watcher read each appended message's event (``perf_counter``: CLOCK_MONOTONIC,
    the same clock in every process)."""
    conns = []
    for sid in sessions:
        c = await Conn.open(sock)
        await c.call("session.watch", {"sessionId": sid})
        conns.append(c)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    async with asyncio.timeout(ENDED):  # the events still on their way, up to the last word
        await asyncio.gather(*(c.ended.wait() for c in conns))
    print(json.dumps([c.seen for c in conns]), flush=True)
    for c in conns:
        await c.close()


class Watchers:
    """A child process of watchers (:func:`watch_in_child`)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, sock: str, sessions: list[str], *, cheap: bool = False) -> Watchers:
        proc = await asyncio.create_subprocess_exec(
            "nice",
            "-n",
            str(NICE),
            sys.executable,
            __file__,
            "--cheap-watchers" if cheap else "--watchers",
            sock,
            *sessions,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO,
            limit=1 << 26,
        )
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).strip() == b"ready"
        return cls(proc)

    async def stop(self, writer: Conn, sessions: list[str]) -> list[dict[str, float]]:
        """End the watchers: a last word published on each session (after every event of
        its appends, as the session's calls are queued), then what each watcher saw."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        for sid in dict.fromkeys(sessions):
            await writer.call("session.publish", {"sessionId": sid, "turnId": "end", "data": 0})
        self.proc.stdin.close()
        seen: list[dict[str, float]] = json.loads(await self.proc.stdout.readline())
        await self.proc.wait()
        return seen


def body(mid: str, size: int) -> dict[str, Any]:
    return {"id": mid, "role": "assistant", "content": "x" * size}


async def start_host(
    folder: Path, prefix: tuple[str, ...] = ()
) -> tuple[asyncio.subprocess.Process, str]:
    sock = str(folder / "host.sock")
    log = open(folder / "host.log", "wb")  # noqa: SIM115 - the child writes it
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        sys.executable,
        "-m",
        "host",
        "serve",
        "--data-dir",
        str(folder / "data"),
        "--socket",
        sock,
        "--log-level",
        "warning",
        stderr=log,
        cwd=REPO,
    )
    log.close()
    for _ in range(2400):  # until it accepts (bounded: 120 s, valgrind's start)
        with contextlib.suppress(OSError):
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(sock)
                break
            finally:
                probe.close()
        await asyncio.sleep(0.05)
    return proc, sock


async def event_latency(sock: str, writer: Conn, n: int) -> dict[str, Any]:
    sessions = [f"lat{i}" for i in range(4)]
    for sid in sessions:
        await writer.call("session.create", {"sessionId": sid})
    watchers = await Watchers.start(sock, sessions * 2)  # 8 watchers, 2 a session
    answered: dict[str, float] = {}
    for i in range(n):
        mid = f"lat-{i}"
        params = {"sessionId": sessions[i % 4], "message": body(mid, 1024)}
        _, answered[mid] = await writer.timed("session.appendMessage", params)
    seen = await watchers.stop(writer, sessions)
    lat = [(at[mid] - answered[mid]) * 1000 for at in seen for mid in at]
    return {
        "figure": "event_latency",
        "events": len(lat),
        "expected": 2 * n,
        "p50Ms": round(pct(lat, 0.5), 3),
        "p99Ms": round(pct(lat, 0.99), 3),
    }


CPU: dict[str, float] = {}
"""The host's CPU seconds spent in each session's blocks of :func:`interleaved`."""
HOST_PID = 0
IDS = itertools.count()
NICE = int(os.environ.get("WATCHERS_NICE", "0"))
ENDED = 60.0
"""Seconds watchers wait, after their end, for the events still on their way."""


async def interleaved(
    writer: Conn, watched: str, plain: str, rounds: int, ops: int, size: int
) -> tuple[float, float]:
    """Median append_one (ms) on ``watched`` and on ``plain``, in interleaved blocks."""
    ids = IDS  # every message new: a repeated id is deduplicated, not written
    ours: list[float] = []
    base: list[float] = []
    for n in range(rounds):  # which goes first alternates: a slow spell hurts both alike
        order = ((watched, ours), (plain, base))
        for sid, out in order if n % 2 == 0 else order[::-1]:
            cpu = cpu_s(HOST_PID)
            for _ in range(ops):
                params = {"sessionId": sid, "message": body(f"{sid}-{next(ids)}", size)}
                took, _ = await writer.timed("session.appendMessage", params)
                out.append(took * 1000)
            CPU[sid] = CPU.get(sid, 0.0) + cpu_s(HOST_PID) - cpu
    return statistics.median(ours), statistics.median(base)


async def append_watched(sock: str, writer: Conn, rounds: int, ops: int) -> dict[str, Any]:
    for sid in ("watched", "plain"):
        await writer.call("session.create", {"sessionId": sid})
    watchers = await Watchers.start(sock, ["watched"] * 8, cheap=True)
    await interleaved(writer, "watched", "plain", 2, 20, 1024)  # warm up
    ours, base = await interleaved(writer, "watched", "plain", rounds, ops, 1024)
    seen = await watchers.stop(writer, ["watched"])
    assert all(len(at) == len(seen[0]) for at in seen), "every watcher got every event"
    return {
        "figure": "append_watched",
        "watchedMs": round(ours, 4),
        "unwatchedMs": round(base, 4),
        "hostCpuUsPerAppend": {
            "watched": round(CPU["watched"] / len(seen[0]) * 1e6, 1),
            "unwatched": round(CPU["plain"] / len(seen[0]) * 1e6, 1),
        },
        "ratio": round(ours / base, 3),
        "goal": "<= 1.1x",
        "met": ours / base <= 1.1,
    }


async def stalled_watcher(
    sock: str, writer: Conn, pid: int, rounds: int, ops: int
) -> dict[str, Any]:
    for sid in ("stalled", "free"):
        await writer.call("session.create", {"sessionId": sid})
    # a client that watches, then never reads: small socket buffers, nothing read
    raw = socket.socket(socket.AF_UNIX)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(sock)
    hello = {"jsonrpc": "2.0", "id": 1, "method": "handshake", "params": {"protocolVersion": 11}}
    watch = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "session.watch",
        "params": {"sessionId": "stalled"},
    }
    raw.sendall(_ENC.encode(hello) + b"\n" + _ENC.encode(watch) + b"\n")
    for _ in range(1000):  # until its watch started (each a round trip, bounded)
        if (await writer.call("host.stats", {}))["counters"].get("watch.started", 0) >= 1:
            break
    before = rss_mb(pid)
    peak = before
    ours: list[float] = []
    base: list[float] = []
    for _ in range(rounds):
        o, b = await interleaved(writer, "stalled", "free", 1, ops, SIZE)
        ours.append(o)
        base.append(b)
        peak = max(peak, rss_mb(pid))
        o, b = await interleaved(writer, "free", "stalled", 1, ops, SIZE)  # the other first
        ours.append(b)
        base.append(o)
    stats = (await writer.call("host.stats", {}))["counters"]
    raw.close()
    o, b = statistics.median(ours), statistics.median(base)
    return {
        "figure": "stalled_watcher",
        "writerWatchedMs": round(o, 4),
        "writerUnwatchedMs": round(b, 4),
        "ratio": round(o / b, 3),
        "goal": "<= 1.1x, memory bounded",
        "met": o / b <= 1.1,
        "rssBeforeMb": round(before, 1),
        "rssPeakMb": round(peak, 1),
        "stalledSessionMb": round(rounds * 2 * ops * SIZE / 2**20, 1),
        "overflows": stats.get("watch.overflows", 0),
    }


async def instructions(quick: bool) -> list[dict[str, Any]]:
    """append_one's instructions in the host (user space, every thread: callgrind), on a
    session 8 watchers follow against one nobody watches, in interleaved blocks: a count
    that does not depend on where the scheduler puts a process. The kernel's share (the
    sends) is not in it: the host's CPU time and the writer's ratio in :func:`run` are."""
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        folder = Path(tmp)
        out_file = str(folder / "cg.out")
        grind = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}")
        proc, sock = await start_host(folder, grind)
        try:
            writer = await Conn.open(sock)
            for sid in ("watched", "plain"):
                await writer.call("session.create", {"sessionId": sid})
            watchers = await Watchers.start(sock, ["watched"] * 8, cheap=True)

            async def control(flag: str) -> int:
                """Run ``callgrind_control flag`` (the host takes it when it next runs)."""
                ctl = await asyncio.create_subprocess_exec(
                    "callgrind_control", flag, str(proc.pid), stdout=asyncio.subprocess.DEVNULL
                )
                while ctl.returncode is None:
                    await writer.call("host.stats", {})
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ctl.wait(), 0.2)
                dumps = sorted(
                    Path(tmp).glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".")[-1])
                )
                if flag != "-d" or not dumps:
                    return 0
                text = dumps[-1].read_text()
                if keep := os.environ.get("BENCH_KEEP"):
                    dumps[-1].rename(Path(keep) / f"{len(os.listdir(keep))}.{flag}")
                return int(
                    next(ln for ln in text.splitlines() if ln.startswith("summary:")).split()[1]
                )

            ops, rounds = (100, 4) if quick else (200, 8)
            counts: dict[str, list[float]] = {"watched": [], "plain": []}
            for sid in ("watched", "plain"):  # warm up
                for _ in range(10):
                    await writer.call(
                        "session.appendMessage",
                        {"sessionId": sid, "message": body(f"{sid}-{next(IDS)}", 1024)},
                    )
            for n in range(rounds):  # blocks, their order alternating; the median of each
                order = ("watched", "plain") if n % 2 == 0 else ("plain", "watched")
                for sid in order:
                    await control("-z")
                    for _ in range(ops):
                        params = {"sessionId": sid, "message": body(f"{sid}-{next(IDS)}", 1024)}
                        await writer.call("session.appendMessage", params)
                    counts[sid].append(await control("-d") / ops)
            seen = await watchers.stop(writer, ["watched"])
            await writer.close()
        finally:
            proc.terminate()
            await proc.wait()
    ours, base = statistics.median(counts["watched"]), statistics.median(counts["plain"])
    ratio = ours / base
    return [
        {
            "figure": "append_instructions",
            "watchedPerAppend": round(ours),
            "unwatchedPerAppend": round(base),
            "blocks": {k: [round(v) for v in vs] for k, vs in counts.items()},
            "events": [len(at) for at in seen],
            "ratio": round(ratio, 3),
            "goal": "<= 1.1x",
            "met": ratio <= 1.1,
        }
    ]


async def run(quick: bool) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        folder = Path(tmp)
        proc, sock = await start_host(folder)
        global HOST_PID
        HOST_PID = proc.pid
        try:
            writer = await Conn.open(sock)
            out = [
                await event_latency(sock, writer, 400 if quick else 2000),
                await append_watched(sock, writer, 6 if quick else 40, 50),
                await stalled_watcher(sock, writer, proc.pid, 3 if quick else 20, 50),
            ]
            await writer.close()
        finally:
            proc.terminate()
            await proc.wait()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="only append_one's host instructions, watched by 8 against none (callgrind)",
    )
    parser.add_argument("--watchers", nargs="+", metavar="SOCKET SESSION", help=argparse.SUPPRESS)
    parser.add_argument("--cheap-watchers", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.watchers:
        asyncio.run(watch_in_child(args.watchers[0], args.watchers[1:]))
        return 0
    if args.cheap_watchers:
        cheap_watchers(args.cheap_watchers[0], args.cheap_watchers[1:])
        return 0
    figures = asyncio.run(instructions(args.quick) if args.instructions else run(args.quick))
    if args.json:
        print(json.dumps({"figures": figures}))
    else:
        for f in figures:
            name = f.pop("figure")
            print(f"{name:<16} " + "  ".join(f"{k}={v}" for k, v in f.items()))
    missed = [f for f in figures if f.get("met") is False]
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
