#!/usr/bin/env python3
"""The host under hostile clients: memory, descriptors and stalls, measured (issue 26).

Each scenario starts a real ``python -m host serve`` (a socket host unless it says
otherwise) on a fresh data dir, plays a client that does what a careless or hostile one
does, and prints what it cost the host: its peak memory over idle (``VmHWM`` in
``/proc/PID/status``), its descriptors (``/proc/PID/fd``), and the stall another
session's appends saw meanwhile (the longest round trip of appends sent one at a time on
another connection). Nothing here is asserted: STYLE.md rule 10, speed and memory are
measured, never timed tests (``tests/e2e/test_pressure.py`` asserts the bounds, with
generous margins, on smaller cases).

=============  ==========================================================================
scenario       what the client does
=============  ==========================================================================
batch          one 1 MB line ``[1,1,1,...]`` of 520,000 elements, then SIGTERM
unread         60 ``session.get`` of a 16 MiB session, never reading an answer
burst          5,000 appends of 10 KB lines in one write (the answers read meanwhile)
lines          12 connections send half of a 60 MiB line each, stall, then finish it
idle           1,100 idle connections under ``ulimit -n 1024``, then ordinary writes
sessions       10,000 sessions each read and appended to under ``ulimit -n 256``
capped         ``displayCap`` read of a 25 MB message of 5 million tiny strings
=============  ==========================================================================

``--tree DIR`` runs the host from another checkout (``git archive COMMIT | tar -x -C
DIR``) to measure the code before a change. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20
WAIT = 120.0  # the bound of any one wait on the host
_ENC = msgspec.json.Encoder()
_DEC = msgspec.json.Decoder()


def vm_mb(pid: int, name: str) -> float:
    """A ``Vm*`` figure of ``/proc/PID/status`` in MB (MiB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(name)


def fds(pid: int) -> int:
    """How many descriptors ``pid`` has open."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        return -1


def request(rid: Any, method: str, params: Any = None) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return _ENC.encode(msg) + b"\n"


class Client:
    """A JSON-RPC client on a socket: replies matched by id, read by a task."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.ids = itertools.count(1)
        self.pending: dict[Any, asyncio.Future[Any]] = {}
        self.unmatched: asyncio.Queue[Any] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, path: Path) -> Client:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 28)
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while line := await self.reader.readline():
                msg = _DEC.decode(line)
                items = msg if isinstance(msg, list) else [msg]
                fut = None
                if isinstance(msg, dict) and msg.get("id") is not None:
                    fut = self.pending.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
                else:
                    for item in items:
                        await self.unmatched.put(item)
        except (ConnectionError, OSError):
            pass
        finally:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("the host closed the connection"))
            await self.unmatched.put(None)

    def expect(self, rid: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        return fut

    async def call(self, method: str, params: Any = None, timeout: float = WAIT) -> Any:
        rid = next(self.ids)
        fut = self.expect(rid)
        self.writer.write(request(rid, method, params))
        await self.writer.drain()
        async with asyncio.timeout(timeout):
            reply = await fut
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def handshake(self) -> None:
        await self.call("handshake", {"protocolVersion": 11})

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, RuntimeError):
            await self.writer.wait_closed()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class Host:
    """One ``python -m host serve --socket`` subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process, sock: Path, log: Path) -> None:
        self.proc = proc
        self.sock = sock
        self.log = log
        self.idle_mb = 0.0

    @classmethod
    async def start(
        cls, tree: Path, folder: Path, *, nofile: int | None = None, args: Iterable[str] = ()
    ) -> Host:
        sock = folder / "host.sock"
        log = folder / "host.log"

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(log, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "host",
                "serve",
                "--data-dir",
                str(folder / "data"),
                "--socket",
                str(sock),
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
                cwd=tree,
                preexec_fn=limit,
            )
        host = cls(proc, sock, log)
        deadline = time.monotonic() + WAIT
        while "serving on" not in log.read_text(errors="replace"):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"host did not start:\n{log.read_text()[-2000:]}")
            await asyncio.sleep(0.05)
        host.idle_mb = vm_mb(proc.pid, "VmHWM")
        return host

    @property
    def pid(self) -> int:
        return self.proc.pid

    def peak_over_idle(self) -> float:
        return vm_mb(self.pid, "VmHWM") - self.idle_mb

    async def stop(self, timeout: float = 30.0) -> tuple[int | None, float]:
        """SIGTERM; return the exit code (None: killed after ``timeout``) and the seconds."""
        t0 = time.perf_counter()
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout):
                code: int | None = await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            code = None
        return code, time.perf_counter() - t0


async def settle(pid: int, quiet: float = 2.0, bound: float = 60.0) -> None:
    """Wait until the host's resident memory has not changed for ``quiet`` seconds."""
    last, since = -1.0, time.monotonic()
    end = time.monotonic() + bound
    while time.monotonic() < end:
        rss = vm_mb(pid, "VmRSS")
        if abs(rss - last) > 0.5:
            last, since = rss, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        await asyncio.sleep(0.1)


class Stall:
    """Appends sent one at a time on their own connection; the longest round trip."""

    def __init__(self, client: Client, session: str) -> None:
        self.client = client
        self.session = session
        self.times: list[float] = []
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Stall:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        for i in itertools.count():
            if self._stop.is_set():
                return
            t0 = time.perf_counter()
            try:
                msg = {"id": f"stall-{time.time_ns()}-{i}", "role": "user", "content": "x"}
                await self.client.call(
                    "session.appendMessage", {"sessionId": self.session, "message": msg}
                )
            except Exception as exc:  # report it, do not stop measuring
                self.errors.append(str(exc)[:200])
                await asyncio.sleep(0.01)
            self.times.append(time.perf_counter() - t0)

    def worst_ms(self) -> float:
        return 1000 * max(self.times, default=0.0)


def write_session(data: Path, sid: str, lines: Iterable[bytes]) -> None:
    """Write a transcript straight into a data dir (the host indexes it at start)."""
    folder = data / "sessions"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(folder / f"{sid}.jsonl", "wb") as f:
        for line in lines:
            f.write(line + b"\n")


# -- scenarios ----------------------------------------------------------------------------


async def sc_batch(tree: Path, folder: Path) -> dict[str, Any]:
    host = await Host.start(tree, folder)
    a, b = await Client.connect(host.sock), await Client.connect(host.sock)
    await a.handshake()
    await b.handshake()
    await b.call("session.create", {"sessionId": "other"})
    line = b"[" + b",".join([b"1"] * 520_000) + b"]\n"
    out: dict[str, Any] = {"line_bytes": len(line) - 1}
    t0 = time.perf_counter()
    a.writer.write(line)
    await a.writer.drain()
    try:
        async with asyncio.timeout(20):
            reply = await a.unmatched.get()
        out["answer_s"] = round(time.perf_counter() - t0, 3)
        out["answer"] = json.dumps(reply)[:160]
    except TimeoutError:
        out["answer_s"] = "none within 20 s"
    try:
        t1 = time.perf_counter()
        await b.call("session.list", timeout=10)
        out["other_client_served_s"] = round(time.perf_counter() - t1, 3)
    except TimeoutError:
        out["other_client_served_s"] = "not within 10 s"
    out["exit_code"], secs = await host.stop(timeout=10)
    out["sigterm_exit_s"] = round(secs, 2)
    return out


async def sc_unread(tree: Path, folder: Path) -> dict[str, Any]:
    line = b'{"id":"m%d","role":"tool","content":"' + b"x" * (MiB - 40) + b'"}'
    write_session(folder / "data", "big", (line % i for i in range(16)))
    host = await Host.start(tree, folder)
    other = await Client.connect(host.sock)
    await other.handshake()
    await other.call("session.create", {"sessionId": "other"})
    quiet = await Client.connect(host.sock)
    await quiet.handshake()
    await quiet.call("session.get", {"sessionId": "big", "limit": 1})
    idle = vm_mb(host.pid, "VmHWM")
    # A raw socket nobody reads from: 60 reads of the 16 MiB session in one write.
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(host.sock))
    s.sendall(request(0, "handshake", {"protocolVersion": 11}))
    s.sendall(b"".join(request(i, "session.get", {"sessionId": "big"}) for i in range(1, 61)))
    async with Stall(other, "other") as stall:
        await settle(host.pid)
    out = {
        "peak_over_idle_mb": round(vm_mb(host.pid, "VmHWM") - idle, 1),
        "rss_over_idle_mb": round(vm_mb(host.pid, "VmRSS") - idle, 1),
        "other_session_worst_append_ms": round(stall.worst_ms(), 1),
        "other_session_errors": len(stall.errors),
    }
    s.close()
    out["exit_code"], _ = await host.stop()
    return out


async def sc_burst(tree: Path, folder: Path) -> dict[str, Any]:
    host = await Host.start(tree, folder)
    c = await Client.connect(host.sock)
    await c.handshake()
    await c.call("session.create", {"sessionId": "s"})
    await c.call("session.create", {"sessionId": "other"})
    other = await Client.connect(host.sock)
    await other.handshake()
    idle = vm_mb(host.pid, "VmHWM")
    fsyncs = (await c.call("host.stats"))["counters"].get("fsyncs", 0)
    text = "y" * (10_000 - 60)
    lines, futs = [], []
    for i in range(5_000):
        rid = next(c.ids)
        futs.append(c.expect(rid))
        msg = {"id": f"b{i}", "role": "user", "content": text}
        lines.append(request(rid, "session.appendMessage", {"sessionId": "s", "message": msg}))
    t0 = time.perf_counter()
    async with Stall(other, "other") as stall:
        c.writer.write(b"".join(lines))
        await c.writer.drain()
        async with asyncio.timeout(WAIT):
            replies = await asyncio.gather(*futs)
    out = {
        "seconds": round(time.perf_counter() - t0, 2),
        "errors": sum("error" in r for r in replies),
        "peak_over_idle_mb": round(vm_mb(host.pid, "VmHWM") - idle, 1),
        "other_session_worst_append_ms": round(stall.worst_ms(), 1),
        "fsyncs": (await c.call("host.stats"))["counters"].get("fsyncs", 0) - fsyncs,
    }
    out["exit_code"], _ = await host.stop()
    return out


async def sc_lines(tree: Path, folder: Path, n: int = 12, size: int = 60 * MiB) -> dict[str, Any]:
    host = await Host.start(tree, folder)
    clients = [await Client.connect(host.sock) for _ in range(n)]
    for c in clients:
        await c.handshake()
    idle = vm_mb(host.pid, "VmHWM")
    head = b'{"jsonrpc":"2.0","id":7,"method":"session.get","params":{"sessionId":"s","pad":"'
    chunk = b"a" * MiB
    half = size // 2

    async def send(c: Client, nbytes: int) -> None:
        for _ in range(nbytes // MiB):
            c.writer.write(chunk)
            await c.writer.drain()

    for c in clients:
        c.writer.write(head)
    await asyncio.gather(*(send(c, half) for c in clients))
    await settle(host.pid)
    stalled = vm_mb(host.pid, "VmRSS") - idle
    futs = [c.expect(7) for c in clients]
    await asyncio.gather(*(send(c, size - half - len(head)) for c in clients))
    for c in clients:
        c.writer.write(b'"}}\n')
    answers: dict[str, int] = {}
    async with asyncio.timeout(WAIT):
        for c, fut in zip(clients, futs, strict=True):
            other = asyncio.ensure_future(c.unmatched.get())
            done, _ = await asyncio.wait([fut, other], return_when=asyncio.FIRST_COMPLETED)
            reply = fut.result() if fut in done else other.result()
            other.cancel()
            name = (reply or {}).get("error", {}).get("data", {}).get("code", "?")
            answers[name] = answers.get(name, 0) + 1
    out = {
        "stalled_rss_over_idle_mb": round(stalled, 1),
        "peak_over_idle_mb": round(vm_mb(host.pid, "VmHWM") - idle, 1),
        "answers": answers,
    }
    out["exit_code"], _ = await host.stop()
    return out


async def ordinary_writes(c: Client, tag: str) -> list[str]:
    """Create, append, update, checkpoint and regenerate; return the errors."""
    errors = []
    sid = f"w-{tag}"
    steps: list[tuple[str, dict[str, Any]]] = [
        ("session.create", {"sessionId": sid}),
        ("session.appendMessage", {"sessionId": sid, "message": {"id": "u1", "role": "user"}}),
        (
            "session.appendMessage",
            {"sessionId": sid, "message": {"id": "a1", "role": "assistant", "content": "hi"}},
        ),
        (
            "session.updateMessage",
            {"sessionId": sid, "message": {"id": "a1", "role": "assistant", "content": "yo"}},
        ),
        ("session.beginTurn", {"sessionId": sid, "turnId": "t2"}),
        (
            "session.saveInflightMessage",
            {
                "sessionId": sid,
                "turnId": "t2",
                "message": {"id": "a2", "role": "assistant", "content": "part"},
            },
        ),
        ("session.endTurn", {"sessionId": sid, "turnId": "t2", "status": "aborted"}),
        ("session.recoverInflightMessages", {}),
        ("session.saveActiveRevision", {"sessionId": sid}),
        ("session.truncateFrom", {"sessionId": sid, "fromMessageId": "a1"}),
    ]
    for method, params in steps:
        try:
            await c.call(method, params, timeout=30)
        except Exception as exc:
            errors.append(f"{method}: {str(exc)[:160]}")
    return errors


async def connect_raw(path: Path, bound: float = 5.0) -> socket.socket | None:
    """A raw connection, or None; a full listen backlog (EAGAIN) is tried again a while."""
    end = time.monotonic() + bound
    while True:
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(str(path))
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() > end:
                return None
            await asyncio.sleep(0.01)
        except OSError:
            s.close()
            return None


async def sc_idle(tree: Path, folder: Path, n: int = 1_100, nofile: int = 1024) -> dict[str, Any]:
    host = await Host.start(tree, folder, nofile=nofile)
    worker = await Client.connect(host.sock)
    await worker.handshake()
    await ordinary_writes(worker, "warm")
    idle, idle_fds = vm_mb(host.pid, "VmRSS"), fds(host.pid)
    socks = []
    refused = 0
    for _ in range(n):
        s = await connect_raw(host.sock)
        if s is None:
            refused += 1
        else:
            socks.append(s)
    await settle(host.pid, quiet=1.0, bound=20)
    errors = await ordinary_writes(worker, "after")
    closed = 0
    for s in socks:  # what the host said to each idle connection (refusal, then close)
        s.setblocking(False)
        try:
            s.recv(4096, socket.MSG_DONTWAIT)
            closed += 1
        except BlockingIOError:
            pass
    out = {
        "connections": n,
        "connect_failed": refused,
        "answered_or_closed_by_host": closed,
        "host_fds": fds(host.pid),
        "host_fds_idle": idle_fds,
        "rss_per_connection_kb": round((vm_mb(host.pid, "VmRSS") - idle) * 1024 / n, 1),
        "write_errors": errors[:4],
        "write_error_count": len(errors),
    }
    for s in socks:
        s.close()
    out["exit_code"], _ = await host.stop()
    return out


async def sc_sessions(
    tree: Path, folder: Path, n: int = 10_000, nofile: int = 256
) -> dict[str, Any]:
    data = folder / "data"
    for i in range(n):
        write_session(data, f"s{i}", [b'{"id":"u0","role":"user","content":"hello %d"}' % i])
    t0 = time.perf_counter()
    host = await Host.start(tree, folder, nofile=nofile)
    start_s = time.perf_counter() - t0
    c = await Client.connect(host.sock)
    await c.handshake()
    errors: list[str] = []
    most_fds = 0
    t1 = time.perf_counter()
    for base in range(0, n, 250):
        futs = []
        lines = []
        for i in range(base, min(n, base + 250)):
            for method, params in (
                ("session.get", {"sessionId": f"s{i}"}),
                (
                    "session.appendMessage",
                    {"sessionId": f"s{i}", "message": {"id": "a0", "role": "assistant"}},
                ),
            ):
                rid = next(c.ids)
                futs.append(c.expect(rid))
                lines.append(request(rid, method, params))
        c.writer.write(b"".join(lines))
        await c.writer.drain()
        async with asyncio.timeout(WAIT):
            for r in await asyncio.gather(*futs):
                if "error" in r:
                    errors.append(str(r["error"])[:160])
        most_fds = max(most_fds, fds(host.pid))
    served_s = time.perf_counter() - t1
    errors += await ordinary_writes(c, "after")
    stats = await c.call("host.stats")
    out = {
        "sessions": n,
        "nofile": nofile,
        "start_s": round(start_s, 2),
        "get_and_append_each_s": round(served_s, 2),
        "errors": len(errors),
        "first_errors": errors[:3],
        "host_fds_most": most_fds,
        "transcripts_open": stats["counters"].get("sessions.open"),
        "peak_over_idle_mb": round(host.peak_over_idle(), 1),
    }
    out["exit_code"], _ = await host.stop()
    return out


async def sc_capped(tree: Path, folder: Path) -> dict[str, Any]:
    big = b'{"id":"m1","role":"tool","content":[' + b",".join([b'"ab"'] * 5_000_000) + b"]}"
    write_session(folder / "data", "big", [big])
    host = await Host.start(tree, folder)
    a, b = await Client.connect(host.sock), await Client.connect(host.sock)
    await a.handshake()
    await b.handshake()
    await b.call("session.create", {"sessionId": "other"})
    async with Stall(b, "other") as quiet:
        await asyncio.sleep(1.0)
    t0 = time.perf_counter()
    async with Stall(b, "other") as stall:
        page = await a.call("session.get", {"sessionId": "big", "displayCap": 1000}, timeout=300)
    took = time.perf_counter() - t0
    capped = page["messages"][0]
    out = {
        "message_mb": round(len(big) / 1e6, 1),
        "capped_read_s": round(took, 3),
        "capped_bytes": len(_ENC.encode(capped)),
        "other_session_worst_append_ms": round(stall.worst_ms(), 1),
        "other_session_worst_append_ms_idle": round(quiet.worst_ms(), 1),
        "appends_during_read": len(stall.times),
    }
    out["exit_code"], _ = await host.stop()
    return out


SCENARIOS: dict[str, Callable[[Path, Path], Awaitable[dict[str, Any]]]] = {
    "batch": sc_batch,
    "unread": sc_unread,
    "burst": sc_burst,
    "lines": sc_lines,
    "idle": sc_idle,
    "sessions": sc_sessions,
    "capped": sc_capped,
}


async def run(names: list[str], tree: Path, where: Path | None, keep: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        tmp = tempfile.mkdtemp(prefix=f"pressure-{name}-", dir=where)
        try:
            print(f"-- {name} ...", file=sys.stderr, flush=True)
            try:
                results[name] = await SCENARIOS[name](tree, Path(tmp))
            except Exception as exc:
                log = Path(tmp) / "host.log"
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                results[name] = {"failed": f"{type(exc).__name__}: {exc}", "log": tail}
            print(json.dumps({name: results[name]}), file=sys.stderr, flush=True)
        finally:
            if not keep:
                shutil.rmtree(tmp, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--tree", type=Path, default=REPO, help="source tree of the host to run")
    parser.add_argument("--dir", type=Path, help="where the scratch folders go")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders (logs)")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the idle scenario's sockets
    results = asyncio.run(run(names, args.tree.resolve(), args.dir, args.keep))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
