"""Shared fixtures: the real host as a subprocess, and a JSON-RPC client to talk to it.

``start_host`` starts ``python -m host serve`` (stdio, or ``--socket``) on a data dir under
``tmp_path``; its stderr is copied to a log file beside the data dir (a failed test's report
shows the tail of each host's log in a "host stderr" section) and kept in memory so a test
can wait for a log line. Every process a test starts is killed at teardown, whatever
happened.

:class:`Client` speaks NDJSON JSON-RPC over any stream pair: ``call()`` returns a result or
raises :class:`RpcError`, ``request()`` returns the whole response, responses are matched
by id (they may come back out of order), and anything the client cannot match (``id:
null`` errors, replies nobody asked for) lands in ``client.unmatched``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import resource
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

REPO = Path(__file__).resolve().parent.parent
PROTOCOL_VERSION = 11
MAX_LINE = 64 * 1024 * 1024
READ_LIMIT = 256 * 1024 * 1024  # the client reads lines far over the host's own limit
WAIT = 30.0  # the bound of every wait on the host (pytest-timeout is the outer guard)

_ENC = msgspec.json.Encoder()
_DEC = msgspec.json.Decoder()


def dumps(value: Any) -> bytes:
    """Encode a value as one compact JSON text."""
    return _ENC.encode(value)


def _loads(line: bytes) -> Any:
    """Decode a reply as a JSON parser (JSON.parse, Python's json) reads it.

    msgspec, fast, first; it refuses a lone UTF-16 surrogate escape (``"\\ud83d"``), which
    RFC 8259's grammar allows and the host stores as sent, so Python's json reads those
    (as a ``str`` holding the lone surrogate). ``ValueError`` when it is not JSON.
    """
    try:
        return _DEC.decode(line)
    except msgspec.DecodeError:
        return json.loads(line)


class RpcError(Exception):
    """Raised by :meth:`Client.call` when the host answers with an error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')} {error.get('message')!r} {error.get('data')}")
        self.error = error
        self.code: int = error["code"]
        self.data: dict[str, Any] = error.get("data") or {}
        self.name: str | None = self.data.get("code")


def _key(rid: Any) -> Hashable:
    return (type(rid).__name__, rid)


class Client:
    """A JSON-RPC 2.0 client over one NDJSON stream pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[Hashable, asyncio.Future[dict[str, Any]]] = {}
        self._batches: list[tuple[frozenset[Hashable], asyncio.Future[list[Any]]]] = []
        self.unmatched: list[Any] = []
        self.garbage: list[bytes] = []  # lines from the host that are not JSON
        self.lines = 0
        self.longest_line = 0  # bytes, newline excluded
        self._changed = asyncio.Condition()
        self.eof = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    # -- reading --------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    line = await self._reader.readline()
                except (ConnectionError, OSError):
                    break
                if not line:
                    break
                self.lines += 1
                self.longest_line = max(self.longest_line, len(line) - 1)
                if not line.endswith(b"\n"):
                    self.garbage.append(line)
                    break
                try:
                    msg = _loads(line)
                except ValueError:
                    # A reply that is not JSON breaks the protocol: fail every waiter now.
                    self.garbage.append(line)
                    self._fail_all(AssertionError(f"host sent a non-JSON line: {line[:300]!r}"))
                    continue
                self._dispatch(msg)
                async with self._changed:
                    self._changed.notify_all()
        finally:
            self.eof.set()
            self._fail_all(ConnectionError("the host closed the connection"))
            async with self._changed:
                self._changed.notify_all()

    def _fail_all(self, err: BaseException) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        for _, bfut in self._batches:
            if not bfut.done():
                bfut.set_exception(err)
        self._pending.clear()
        self._batches.clear()

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, list):
            ids = frozenset(
                _key(m.get("id")) for m in msg if isinstance(m, dict) and m.get("id") is not None
            )
            for i, (want, fut) in enumerate(self._batches):
                if want == ids and not fut.done():
                    del self._batches[i]
                    fut.set_result(msg)
                    return
        elif isinstance(msg, dict) and msg.get("id") is not None:
            fut = self._pending.pop(_key(msg["id"]), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
                return
        self.unmatched.append(msg)

    async def next_unmatched(self) -> Any:
        """Wait for the next reply the client could not match to a request (e.g. ``id: null``)."""
        async with asyncio.timeout(WAIT):
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self.unmatched) or self.eof.is_set())
        if not self.unmatched:
            raise ConnectionError("the host closed the connection")
        return self.unmatched.pop(0)

    # -- writing --------------------------------------------------------------------

    def next_id(self) -> int:
        """Return a fresh request id."""
        return next(self._ids)

    def expect(self, rid: Any) -> asyncio.Future[dict[str, Any]]:
        """Return a future for the response with id ``rid`` (register before sending)."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[_key(rid)] = fut
        return fut

    def expect_batch(self, ids: Iterable[Any]) -> asyncio.Future[list[Any]]:
        """Return a future for the batch response holding exactly the ids ``ids``."""
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._batches.append((frozenset(_key(i) for i in ids), fut))
        return fut

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (one write) and wait until the transport took them."""
        self._writer.write(data)
        await self._writer.drain()

    async def send_chunks(self, chunks: Iterable[bytes]) -> None:
        """Stream bytes chunk by chunk, draining after each (for lines too big to build)."""
        for chunk in chunks:
            self._writer.write(chunk)
            await self._writer.drain()

    def envelope(self, method: str, params: Any = None, rid: Any = None) -> dict[str, Any]:
        """Build a request (with ``rid``) or a notification (``rid`` None)."""
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if rid is not None:
            msg["id"] = rid
        return msg

    async def request(self, method: str, params: Any = None, *, rid: Any = None) -> dict[str, Any]:
        """Send one request and return its whole response object."""
        rid = self.next_id() if rid is None else rid
        fut = self.expect(rid)
        await self.send_raw(dumps(self.envelope(method, params, rid)) + b"\n")
        return await self.wait(fut)

    async def raw(self, line: bytes, rid: Any = None) -> Any:
        """Send one raw line (newline added); return the reply with id ``rid``.

        With ``rid`` None the reply is the next one the client cannot match (``id: null``).
        """
        if rid is None:
            await self.send_raw(line + b"\n")
            return await self.next_unmatched()
        fut = self.expect(rid)
        await self.send_raw(line + b"\n")
        return await self.wait(fut)

    async def call(self, method: str, **params: Any) -> Any:
        """Call a method; return its result or raise :class:`RpcError`."""
        return result_of(await self.request(method, params))

    async def notify(self, method: str, **params: Any) -> None:
        """Send a notification (no id, so no reply)."""
        await self.send_raw(dumps(self.envelope(method, params)) + b"\n")

    async def batch(self, items: list[dict[str, Any]]) -> list[Any]:
        """Send a batch (requests and notifications) and return the batch response."""
        ids = [m["id"] for m in items if m.get("id") is not None]
        fut = self.expect_batch(ids)
        await self.send_raw(dumps(items) + b"\n")
        return await self.wait(fut)

    async def handshake(self, version: int = PROTOCOL_VERSION, **extra: Any) -> Any:
        """Handshake (protocol 11 unless told); return the result or raise."""
        return await self.call("handshake", protocolVersion=version, **extra)

    @staticmethod
    async def wait(fut: Awaitable[Any]) -> Any:
        """Await a response future, bounded."""
        async with asyncio.timeout(WAIT):
            return await fut

    # -- closing --------------------------------------------------------------------

    async def close_input(self) -> None:
        """Close our sending side (end of input for the host)."""
        if self._writer.is_closing():
            return
        if self._writer.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                self._writer.write_eof()
                return
        self._writer.close()
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()

    async def wait_eof(self) -> None:
        """Wait until the host has closed its side."""
        async with asyncio.timeout(WAIT):
            await self.eof.wait()
            await self._task

    async def close(self) -> None:
        """Close both directions and stop reading."""
        self._writer.close()
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()
        if not self._task.done():
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def result_of(response: dict[str, Any]) -> Any:
    """Return a response's result, or raise its error as :class:`RpcError`."""
    if "error" in response:
        raise RpcError(response["error"])
    return response["result"]


class HostProcess:
    """One ``python -m host serve`` subprocess and its captured stderr."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        data_dir: Path,
        log_path: Path,
        socket_path: Path | None,
    ) -> None:
        self.proc = proc
        self.data_dir = data_dir
        self.log_path = log_path
        self.socket_path = socket_path
        self.log_lines: list[str] = []
        self._log_changed = asyncio.Condition()
        self._log_eof = False
        self._stderr_task = asyncio.get_running_loop().create_task(self._copy_stderr())
        self.client: Client | None = None
        self.socket_clients: list[Client] = []
        if socket_path is None:
            assert proc.stdout is not None and proc.stdin is not None
            self.client = Client(proc.stdout, proc.stdin)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log(self) -> str:
        """Everything the host wrote on stderr so far."""
        return "".join(self.log_lines)

    async def _copy_stderr(self) -> None:
        assert self.proc.stderr is not None
        with open(self.log_path, "ab") as out:
            try:
                while line := await self.proc.stderr.readline():
                    out.write(line)
                    out.flush()
                    self.log_lines.append(line.decode(errors="replace"))
                    async with self._log_changed:
                        self._log_changed.notify_all()
            finally:
                self._log_eof = True
                async with self._log_changed:
                    self._log_changed.notify_all()

    async def log_or_exit(self, text: str) -> str | None:
        """Wait for a stderr line containing ``text`` (return it) or for the host to exit
        without one (return None)."""

        def found() -> str | None:
            return next((line for line in self.log_lines if text in line), None)

        async with asyncio.timeout(WAIT):
            async with self._log_changed:
                await self._log_changed.wait_for(lambda: found() is not None or self._log_eof)
        return found()

    async def wait_for_log(self, text: str) -> str:
        """Wait for a stderr line containing ``text``; fail if the host exits first."""
        line = await self.log_or_exit(text)
        if line is None:
            raise AssertionError(f"host exited before logging {text!r}; log:\n{self.log}")
        return line

    async def connect(self) -> Client:
        """Open a new connection to the socket of a ``--socket`` host."""
        assert self.socket_path is not None
        reader, writer = await asyncio.open_unix_connection(str(self.socket_path), limit=READ_LIMIT)
        client = Client(reader, writer)
        self.socket_clients.append(client)
        return client

    async def wait(self) -> int:
        """Wait (bounded) for the process to exit; return its exit code."""
        async with asyncio.timeout(WAIT):
            code = await self.proc.wait()
            await self._stderr_task
        return code

    async def stop(self) -> int:
        """End the host's input (stdio) or ask it to stop (socket); return its exit code."""
        if self.client is not None:
            await self.client.close_input()
            await self.client.wait_eof()
        elif self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.wait()

    async def kill(self) -> None:
        """Kill the host with SIGKILL (nothing runs in it after this) and reap it."""
        if self.proc.returncode is None:
            self.proc.kill()
        await self.wait()

    async def cleanup(self) -> None:
        """Kill the process if it still runs and close every transport it had."""
        if self.proc.returncode is None:
            self.proc.kill()
        with contextlib.suppress(TimeoutError):
            await self.wait()
        if not self._stderr_task.done():
            self._stderr_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stderr_task
        for client in [self.client, *self.socket_clients]:
            if client is not None:
                await client.close()


StartHost = Callable[..., Awaitable[HostProcess]]
_HOSTS = pytest.StashKey[list[HostProcess]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests marked ``slow`` first (in their order), then the rest as collected.

    Under pytest-xdist a long test that starts last finishes the run alone while the other
    workers idle; started first, it runs beside the others.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Add the tail of every host's stderr to the report of a failed test."""
    report = yield
    if report.failed:
        for host in item.stash.get(_HOSTS, []):
            tail = "".join(host.log_lines[-60:])
            report.sections.append((f"host stderr (pid {host.pid}, {host.log_path})", tail))
    return report


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MiB file system (tmpfs) to fill up or remount read-only; needs root."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """The data dir of the test's host (not created: the host creates it)."""
    return tmp_path / "data"


@pytest.fixture
async def start_host(
    request: pytest.FixtureRequest, tmp_path: Path, data_dir: Path
) -> AsyncIterator[StartHost]:
    """Return ``start(data_dir=None, *, socket=None, ready=True, umask=None, args=(),
    nofile=None)`` (``nofile``: the host's ``RLIMIT_NOFILE``, ``(soft, hard)`` or both).

    ``start()`` serves stdio (``host.client`` is its client); ``start(socket=PATH)`` serves
    a Unix socket and, unless ``ready=False``, returns once the host logged "serving on"
    (``host.connect()`` opens clients). Every host is killed at teardown.
    """
    procs: list[HostProcess] = []
    request.node.stash[_HOSTS] = procs
    counter = itertools.count(1)

    async def start(
        data: Path | None = None,
        *,
        socket: Path | None = None,
        ready: bool = True,
        umask: int | None = None,
        args: Iterable[str] = (),
        nofile: int | tuple[int, int] | None = None,
    ) -> HostProcess:
        data = data_dir if data is None else data
        cmd = [sys.executable, "-m", "host", "serve", "--data-dir", str(data), *args]
        if socket is not None:
            cmd += ["--socket", str(socket)]
        log_path = tmp_path / f"host-{next(counter)}.stderr.log"
        extra: dict[str, Any] = {} if umask is None else {"umask": umask}
        if nofile is not None:  # as `ulimit -n` leaves it: (soft, hard), or both
            limit = nofile if isinstance(nofile, tuple) else (nofile, nofile)
            extra["preexec_fn"] = functools.partial(
                resource.setrlimit, resource.RLIMIT_NOFILE, limit
            )
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE if socket is None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if socket is None else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd=REPO,
            limit=READ_LIMIT,
            **extra,
        )
        host = HostProcess(proc, data, log_path, socket)
        procs.append(host)
        if socket is not None and ready:
            await host.wait_for_log("serving on")
        return host

    try:
        yield start
    finally:
        for host in procs:
            await host.cleanup()


@pytest.fixture
async def host(start_host: StartHost) -> HostProcess:
    """A stdio host on ``data_dir``, not yet handshaken."""
    return await start_host()


@pytest.fixture
async def client(host: HostProcess) -> Client:
    """The handshaken client of ``host``."""
    assert host.client is not None
    await host.client.handshake()
    return host.client


async def restart_host(
    start_host: StartHost, old: HostProcess, *, kill: bool = False
) -> HostProcess:
    """Stop (or kill -9) ``old``, start a new host on its data dir, handshake it."""
    if kill:
        await old.kill()
    else:
        assert await old.stop() == 0, old.log
    new = await start_host(old.data_dir)
    assert new.client is not None
    await new.client.handshake()
    return new


async def restart(start_host: StartHost, old: HostProcess, *, kill: bool = False) -> Client:
    """Like :func:`restart_host`, but return the new host's handshaken client."""
    new = await restart_host(start_host, old, kill=kill)
    assert new.client is not None
    return new.client


async def run_cli(*args: str, module: str = "host") -> tuple[int, str, str]:
    """Run ``python -m host ARGS`` (or ``-m MODULE``); return (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    try:
        async with asyncio.timeout(WAIT):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def run_view(*args: str) -> tuple[int, str, str]:
    """Run ``python -m hostview ARGS`` (inspect, export); return (exit code, stdout, stderr)."""
    return await run_cli(*args, module="hostview")


# -- looking at the data dir --------------------------------------------------------------


def transcript(data: Path, session_id: str) -> Path:
    """The transcript path of a session."""
    return data / "sessions" / f"{session_id}.jsonl"


BRIEF_WAIT = ("--busy-timeout", "0.2")
"""Command-line args for a tool that meets :func:`index_locked`: a lock nobody releases is
waited out for SQLite's busy timeout (5 s by default) before the tool gives up."""


@contextlib.contextmanager
def index_locked(index: Path) -> Iterator[None]:
    """Hold ``index`` as another program can: an exclusive lock no reader gets past."""
    holder = sqlite3.connect(index, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("UPDATE sessions SET title = title")
        holder.execute("COMMIT")  # in EXCLUSIVE locking mode the lock stays held
        yield
    finally:
        holder.close()


def disk_state(data: Path) -> dict[str, bytes]:
    """Every file under ``sessions/`` and ``revisions/``, by relative path, with its bytes."""
    out: dict[str, bytes] = {}
    for folder in ("sessions", "revisions"):
        root = data / folder
        if not root.exists():
            continue
        for path in sorted(root.rglob("*")):
            if path.is_file():
                out[str(path.relative_to(data))] = path.read_bytes()
    return out


async def index_state(client: Client, data: Path) -> list[tuple[Any, ...]]:
    """Every session and message row of the index (read-only; safe beside a live host).

    The host commits appended rows after answering; any query waits for them, so one
    ``session.list`` first makes the index show every answered append.
    """
    await client.call("session.list")
    conn = sqlite3.connect(f"file:{data / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        sessions = conn.execute("SELECT * FROM sessions ORDER BY session_id").fetchall()
        messages = conn.execute("SELECT * FROM messages ORDER BY session_id, line").fetchall()
    finally:
        conn.close()
    return [("sessions", *r) for r in sessions] + [("messages", *r) for r in messages]


async def everything(client: Client, data: Path) -> tuple[dict[str, bytes], list[tuple[Any, ...]]]:
    """The files and the index: what must not change after a failed call."""
    return disk_state(data), await index_state(client, data)


def msg(mid: str, role: str = "user", content: Any = None, **extra: Any) -> dict[str, Any]:
    """A message as a caller sends it."""
    out: dict[str, Any] = {"id": mid, "role": role, "content": f"text of {mid}"}
    if content is not None:
        out["content"] = content
    out.update(extra)
    return out


async def make_session(client: Client, sid: str, n: int = 0, **create: Any) -> list[dict[str, Any]]:
    """Create session ``sid`` and append ``n`` messages m0..m{n-1}; return what was sent."""
    await client.call("session.create", sessionId=sid, **create)
    sent = [msg(f"m{i}", "user" if i % 2 == 0 else "assistant") for i in range(n)]
    for m in sent:
        await client.call("session.appendMessage", sessionId=sid, message=m)
    return sent


async def get_messages(client: Client, sid: str, **params: Any) -> list[dict[str, Any]]:
    """Return every message of a session (or the page ``params`` ask for)."""
    res = await client.call("session.get", sessionId=sid, **params)
    return list(res["messages"])
