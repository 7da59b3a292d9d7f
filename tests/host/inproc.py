"""In-process helpers: a real Host on real files, called as bytes through its endpoint.

For tests that crash the store at its Nth file operation, fail it, or cut its power, and
for those that pause a call inside the host: the calls go through the endpoint the server
runs (``host._server.connect``), so what it decides (which path serves a call) is what
they test. Only the transport is faked. Everything about processes, pipes and sockets is
tested over the real subprocess in tests/e2e.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Hashable, Iterable
from typing import Any

import msgspec

from host import FileSystem, Host
from host._framing import LineReader
from host._limits import Limits
from host._server import connect, serve_connection
from tests.conftest import PROTOCOL_VERSION, RpcError, result_of

_ENCODE = msgspec.json.Encoder().encode  # compact, UTF-8: as the clients here send


class Crash(BaseException):
    """The process died here: nothing after this point runs."""


class CrashingFileSystem(FileSystem):
    """A file system whose Nth call, and every call after it, kills the "process".

    ``torn``: a write (an append or an overwrite) that is the Nth call first writes half its
    bytes, as a kill -9 in the middle of a big ``write`` leaves them.
    """

    def __init__(self, crash_at: int, *, torn: bool = False) -> None:
        self.crash_at = crash_at
        self.torn = torn
        self.calls = 0
        self.armed = False  # start-up's own file operations are not counted

    def write_all(self, fd: int, data: bytes | memoryview) -> None:
        if self.torn and self.armed and self.calls + 1 >= self.crash_at:
            FileSystem.write_all(self, fd, memoryview(data)[: len(data) // 2])
        self._tick("write_all")
        FileSystem.write_all(self, fd, data)

    def overwrite(self, fd: int, data: bytes, offset: int) -> None:
        if self.torn and self.armed and self.calls + 1 >= self.crash_at:
            FileSystem.overwrite(self, fd, data[: len(data) // 2], offset)
        self._tick("overwrite")
        FileSystem.overwrite(self, fd, data, offset)

    def _tick(self, what: str) -> None:
        if not self.armed:
            return
        self.calls += 1
        if self.calls >= self.crash_at:
            raise Crash(f"crash at file operation {self.calls} ({what})")


FS_CALLS = (
    "open",
    "overwrite",
    "reserve",
    "link",
    "write_all",
    "write_synced",
    "copy_range",
    "fsync",
    "fsync_dir",
    "ftruncate",
    "rename",
    "exchange",
    "unlink",
    "mkdir",
)


def tick_before(cls: type, names: tuple[str, ...] = FS_CALLS) -> None:
    """Make each of ``cls``'s seam calls in ``names`` call ``self._tick(name)`` first."""
    for name in names:
        base = getattr(FileSystem, name)

        def method(self: Any, *args: Any, _base: Any = base, _name: str = name, **kw: Any) -> Any:
            self._tick(_name)
            return _base(self, *args, **kw)

        setattr(cls, name, method)


tick_before(CrashingFileSystem, tuple(n for n in FS_CALLS if n not in ("write_all", "overwrite")))


ALLOCATING = ("write_all", "write_synced", "copy_range", "mkdir", "reserve", "sqlite-write")
"""The seam's calls that need new space: the only ones a full disk fails."""


class FaultyFileSystem(FileSystem):
    """Fails its Nth operation with ``errno``: once, or from then on (``always``).

    ``ENOSPC`` as a real file system (ext4, xfs, tmpfs) gives it: only on what needs new
    space (:data:`ALLOCATING`: writing bytes, making a folder, reserving blocks, an SQLite
    write, which fails with ``SQLITE_FULL``), never on what frees or moves space (an
    unlink, a cut, a rename, an fsync) or overwrites bytes a file already holds; so its
    Nth operation is its Nth allocation. A copy-on-write file system (APFS, btrfs) needs
    space for those too; this models the ones that do not. Any other ``errno`` (``EIO``)
    fails any operation, file or SQLite.
    """

    def __init__(self, fail_at: int, err: int, *, always: bool = False) -> None:
        self.fail_at = fail_at
        self.err = err
        self.always = always
        self.calls = 0
        self.armed = False
        self.failed = 0

    def _tick(self, what: str) -> None:
        if not self.armed or (self.err == errno.ENOSPC and what not in ALLOCATING):
            return
        self.calls += 1
        if self.calls == self.fail_at or (self.always and self.calls > self.fail_at):
            self.failed += 1
            if what.startswith("sqlite"):
                full = self.err == errno.ENOSPC
                exc = sqlite3.OperationalError(
                    "database or disk is full (injected)" if full else "disk I/O error (injected)"
                )
                exc.sqlite_errorcode = sqlite3.SQLITE_FULL if full else sqlite3.SQLITE_IOERR  # type: ignore[attr-defined]
                raise exc
            raise OSError(self.err, f"{os.strerror(self.err)} (injected at call {self.calls})")

    def sqlite(self, kind: str) -> None:
        self._tick(f"sqlite-{kind}")


tick_before(FaultyFileSystem)


def full_disk(fill_at: int) -> FaultyFileSystem:
    """A disk that fills up at its ``fill_at``-th allocation and stays full."""
    return FaultyFileSystem(fill_at, errno.ENOSPC, always=True)


class _Edge:
    """The transport edge: takes what the connection writes and reads it back as answers.

    Every answer line is decoded as a client decodes it and handed to the future waiting
    for its id (a batch answer to the one waiting for its ids); the rest (``id: null``
    errors) lands in ``unmatched``. It has the writer protocol of ``host._server``'s
    ``_Sender``: ``write``, ``drain``, and what ``serve_connection`` calls when it closes.
    """

    def __init__(self) -> None:
        self._partial = b""
        self.pending: dict[Hashable, asyncio.Future[dict[str, Any]]] = {}
        self.batches: list[tuple[frozenset[Hashable], asyncio.Future[list[Any]]]] = []
        self.unmatched: list[Any] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        """Take bytes the connection wrote; each whole line reaches the client later.

        Not before the loop's next pass, as over a pipe or a socket: by then the task that
        answered is done, so the next call finds the connection as a real client would.
        """
        *lines, self._partial = (self._partial + data).split(b"\n")
        loop = asyncio.get_running_loop()
        for line in lines:
            loop.call_soon(self._dispatch, json.loads(line))

    def _dispatch(self, answer: Any) -> None:
        if isinstance(answer, list):
            ids = frozenset(_key(a["id"]) for a in answer if a.get("id") is not None)
            for i, (want, bfut) in enumerate(self.batches):
                if want == ids:
                    del self.batches[i]
                    bfut.set_result(answer)
                    return
        elif isinstance(answer, dict) and answer.get("id") is not None:
            fut = self.pending.pop(_key(answer["id"]), None)
            if fut is not None:
                fut.set_result(answer)
                return
        self.unmatched.append(answer)

    def fail(self, exc: BaseException) -> None:
        """Fail every answer still awaited with ``exc`` (the process died, or closed)."""
        waiting: list[asyncio.Future[Any]] = [*self.pending.values()]
        waiting += (f for _, f in self.batches)
        self.pending.clear()
        self.batches.clear()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # raised to whoever awaits it; no "never retrieved" log

    async def drain(self) -> None:
        pass  # this client reads every answer as soon as it is written

    def queued(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        pass


def _key(rid: Any) -> Hashable:
    return (type(rid).__name__, rid)


class _Watched(set[asyncio.Future[Any]]):
    """A connection's ``tasks``: each task it tracks reports how it ended, once done."""

    def __init__(self, ended: Callable[[asyncio.Future[Any]], None]) -> None:
        super().__init__()
        self.ended = ended

    def add(self, task: asyncio.Future[Any]) -> None:
        super().add(task)
        task.add_done_callback(self.ended)


class Client:
    """A client of a Host in this process: every call is bytes through its endpoint.

    The real path a connection's bytes take (``host._server.connect``: a
    ``LineReader`` feeding a ``Connection``, served by ``serve_connection``); the only
    fake is the transport edge (:class:`_Edge`). ``await client(method, **params)`` sends
    one JSON-RPC request line with a fresh id and returns the result as a client decodes
    it, or raises :class:`~tests.conftest.RpcError` carrying the error object the endpoint
    sent.

    A :class:`Crash` (the process died at a file operation) surfaces as itself: the task
    of the call ends with it and its answer never comes; every call waiting, and every
    one after, raises it. Open it with :func:`open_host`, or :meth:`connect` and :meth:`close`.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.lines = LineReader()
        self.edge = _Edge()
        self.conn = connect(host, self.lines, self.edge)
        self.conn.tasks = self._watched = _Watched(self._ended)
        self.crashed: BaseException | None = None
        """What ended the "process" (a :class:`Crash`), or a task's unexpected exception."""
        self._ids = itertools.count(1)
        self._serving: asyncio.Task[None] | None = None

    async def connect(self) -> Any:
        """Serve the connection and handshake; return the handshake's result."""
        assert self._serving is None, "connected already"
        self._serving = asyncio.get_running_loop().create_task(
            serve_connection(self.host, self.lines, self.conn, self.edge)
        )
        self._serving.add_done_callback(self._closed)
        client = {"name": "tests.host.inproc"}
        return await self("handshake", protocolVersion=PROTOCOL_VERSION, client=client)

    async def close(self, *, abandon: bool = False) -> None:
        """End of input: the endpoint finishes the calls in flight and closes.

        ``abandon``: cancel the calls in flight first (the test failed, or the process
        died: nothing of it runs on).
        """
        if abandon or self.crashed is not None:
            for task in list(self.conn.tasks):
                task.cancel()
        self.lines.eof_received()
        if self._serving is not None:
            await self._serving

    # -- sending ----------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Feed bytes as they are to the endpoint, as a transport's read hands them on: in
        a callback of the loop's, outside any task (not in the caller's)."""
        if self.crashed is not None:
            raise self.crashed
        if self._serving is None or self._serving.done():
            raise ConnectionError("the connection is not served")
        # a call the connection ran outside its ``tasks`` could die unseen: a hang, not Crash
        assert self.conn.tasks is self._watched, "Connection.tasks was replaced"
        asyncio.get_running_loop().call_soon(self._read, data)

    def _read(self, data: bytes) -> None:
        try:
            self.lines.data_received(data)
        except BaseException as exc:  # the read callback died: so did the "process"
            self._die(exc)

    def expect(self, rid: Any) -> asyncio.Future[dict[str, Any]]:
        """A future for the answer with id ``rid`` (register it before sending)."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.edge.pending[_key(rid)] = fut
        return fut

    def expect_batch(self, ids: Iterable[Any]) -> asyncio.Future[list[Any]]:
        """A future for the batch answer holding exactly the ids ``ids``."""
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.edge.batches.append((frozenset(_key(i) for i in ids), fut))
        return fut

    def envelope(self, method: str, params: Any = None, rid: Any = None) -> dict[str, Any]:
        """A request (with ``rid``) or a notification: jsonrpc, id, method, params."""
        req: dict[str, Any] = {"jsonrpc": "2.0"}
        if rid is not None:
            req["id"] = rid
        req["method"] = method
        if params is not None:
            req["params"] = params
        return req

    async def request(self, method: str, params: Any = None, *, rid: Any = None) -> dict[str, Any]:
        """Send one request line and return its whole answer object."""
        rid = next(self._ids) if rid is None else rid
        fut = self.expect(rid)
        self.send(_ENCODE(self.envelope(method, params, rid)) + b"\n")
        return await fut

    async def batch(self, items: list[dict[str, Any]]) -> list[Any]:
        """Send a batch line (see :meth:`envelope`) and return the batch answer."""
        fut = self.expect_batch(m["id"] for m in items if m.get("id") is not None)
        self.send(_ENCODE(items) + b"\n")
        return await fut

    async def __call__(self, method: str, **params: Any) -> Any:
        return result_of(await self.request(method, params))

    async def error(self, method: str, **params: Any) -> dict[str, Any]:
        """The error object the endpoint answered this call with."""
        try:
            await self(method, **params)
        except RpcError as exc:
            return exc.error
        raise AssertionError(f"{method} did not fail")

    # -- how it ends ------------------------------------------------------------------

    def _ended(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._die(exc)  # a Crash: its answer never comes (anything else: a bug)

    def _die(self, exc: BaseException) -> None:
        if self.crashed is None:
            self.crashed = exc
        self.edge.fail(self.crashed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self.edge.fail(ConnectionError("the host closed the connection"))


@contextlib.asynccontextmanager
async def open_host(
    data_dir: str, fs: FileSystem | None = None, *, limits: Limits | None = None
) -> AsyncIterator[Client]:
    """A Host on ``data_dir`` and a handshaken :class:`Client` of it.

    On the way out, end of input: the calls in flight finish (or, when the block raised,
    are cancelled), then the host closes.
    """
    os.makedirs(data_dir, exist_ok=True)
    async with Host.open(data_dir, fs, limits=limits) as host:
        client = Client(host)
        await client.connect()
        try:
            yield client
        except BaseException:
            await client.close(abandon=True)
            raise
        await client.close()


def msg(mid: str, role: str = "assistant", content: str = "text", **extra: Any) -> dict[str, Any]:
    return {"id": mid, "role": role, "content": content, **extra}


def pause_history_at(client: Client, point: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Make a history call that reaches ``point`` (``HistoryMethods.hook``) wait there:
    ``reached`` is set when one does, and it goes on once ``release`` is set."""
    reached, release = asyncio.Event(), asyncio.Event()

    async def hold(at: str) -> None:
        if at == point:
            reached.set()
            await release.wait()

    client.host.history.hook = hold
    return reached, release
