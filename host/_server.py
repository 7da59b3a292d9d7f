"""Transports: one connection on stdin/stdout, or any number on a Unix socket.

Both feed lines to a :class:`~host._endpoint.Connection`. End of input finishes the
requests in flight, then closes that connection; ``host.shutdown`` and SIGTERM stop
reading everywhere, finish what is in flight, and exit 0. One host per data dir: the
host holds an exclusive ``flock`` on ``DIR/host.lock`` for its whole life.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import gc
import logging
import os
import signal
import socket
import sqlite3
import stat
import sys
import threading
from typing import Any

from host._endpoint import Connection
from host._errors import LimitExceeded, NotHandshaken
from host._framing import CHUNK, LineReader
from host._fs import DIR_MODE, NotRegularFile, on_thread, open_regular, read_regular, write_all
from host._index import BUSY_TIMEOUT, DISK_FULL, NOT_WRITABLE, IndexBusy
from host._layout import UnsafeDataDir
from host._limits import (
    ANSWERS_RESUME,
    ANSWERS_WAITING,
    HANDSHAKE_TIMEOUT,
    REFUSAL_READ,
    REFUSAL_WAIT,
    Limits,
    raise_nofile,
)
from host._service import Host
from host._wire import ENCODER

log = logging.getLogger("host.server")


class DataDirBusy(Exception):
    """Raised when another process holds the data dir's lock."""


class DataDirLock:
    """The data dir's locks, held for the host's whole life (see :func:`lock_data_dir`)."""

    def __init__(self, fds: list[int]) -> None:
        self.fds = fds

    def close(self) -> None:
        """Let the data dir go."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def lock_data_dir(root: str) -> DataDirLock:
    """Take the data dir's exclusive locks for this process.

    Two ``flock``s: the data dir's own (a descriptor of the folder) and ``host.lock``'s,
    which names the holder's pid. The folder's is what keeps a second host out even when
    ``host.lock`` is deleted or replaced under a live host (a new file's lock proves
    nothing); a symlinked path or a bind mount of the folder reaches the same lock. The
    file's keeps out hosts that lock only it, and ``verify --repair``'s of older versions.
    """
    os.makedirs(root, mode=DIR_MODE, exist_ok=True)
    path = os.path.join(root, "host.lock")
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        if not _flock(fds[0], folder=True):
            raise DataDirBusy(_in_use(root, path))
        try:
            fds.append(open_regular(path, os.O_RDWR | os.O_CREAT))  # never a link's target
        except NotRegularFile:
            msg = f"{path} is not a regular file (a link, folder or FIFO): remove it"
            raise DataDirBusy(msg) from None
        if not _flock(fds[1], folder=False):
            raise DataDirBusy(_in_use(root, path))
        os.ftruncate(fds[1], 0)
        os.pwrite(fds[1], f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        DataDirLock(fds).close()
        raise
    return DataDirLock(fds)


def _flock(fd: int, *, folder: bool) -> bool:
    """Take an exclusive ``flock`` without waiting; ``False`` when another holds it.

    Where a folder cannot be locked (NFS emulates ``flock`` with write locks, which a
    folder's read-only descriptor cannot take) the file's lock alone guards the dir.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        if not folder:
            raise
        log.warning("cannot lock the data dir's folder (%s): only host.lock guards it", exc)
    return True


def _in_use(root: str, path: str) -> str:
    try:
        holder = read_regular(path)[:64].decode(errors="replace").strip() or "unknown"
    except OSError:  # deleted or replaced under its holder: the folder's lock still holds
        holder = "unknown"
    return f"data dir {root} is in use by another host (pid {holder}); one host per data dir"


GC_THRESHOLDS = (5000, 50, 10)
"""The cycle collector's thresholds while serving (CPython's default is (700, 10, 10))."""


def tune_gc() -> None:
    """Collect what start-up left, freeze the survivors, and collect the young less often.

    Frozen start-up objects are never scanned again, and most calls of a backlog end
    before a young collection sees them (docs/design.md, "The cycle collector").
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


CLOSE_WAIT = 30.0
"""Seconds a closing connection waits for its client to read the answers still queued."""


def connect(host: Host, lines: LineReader, writer: Any) -> Connection:
    """The endpoint of one connection, wired to its reader and writer (flow control)."""
    conn = Connection(host, host.stats, writer, budget=host.requests)
    lines.on_line = conn.read  # before the first read, which may come in this pass
    lines.on_read_end = conn.run_ready
    lines.budget = host.requests
    conn.reader = lines
    if isinstance(writer, _Sender):
        writer.listener = conn
    return conn


async def serve_connection(host: Host, lines: LineReader, conn: Connection, writer: Any) -> None:
    """Serve one connection until end of input or shutdown, then finish its calls.

    Every answer is written before the connection closes (and, on stdio, before the host
    exits): a client busy for a moment still gets them all, a client that reads none for
    :data:`CLOSE_WAIT` seconds loses what is left (its calls still run: writes land).
    """
    ended = asyncio.create_task(lines.ended.wait())
    stop = asyncio.create_task(host.shutdown_requested.wait())
    try:
        await asyncio.wait({ended, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
        stop.cancel()
        lines.stop()
        if (queued := writer.queued()) or conn.waiting():
            log.info("closing: waiting for the client to read %d bytes of answers", queued)
        try:
            async with asyncio.timeout(CLOSE_WAIT):
                await conn.finish()
                writer.close()
                await writer.wait_closed()
        except TimeoutError:
            log.warning("closing: the client read no answers for %.0f s; dropped", CLOSE_WAIT)
            writer.abort()
            conn.writer_gone()
            await conn.finish()
        except ConnectionError:
            pass  # gone: nothing more can reach it


class _FileWriter:
    """Replies to a stdout the loop does not watch (a file, a device, a terminal).

    What is written goes out by itself, in a thread, one write at a time: an answer done
    at once (no task) is never drained, and two drains never write to the file together.
    A write that fails (a full disk, ``/dev/full``) loses the answers as a closed pipe
    does: the client is gone (``ConnectionError``), its calls still run.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf: list[bytes] = []
        self._writing: asyncio.Task[None] | None = None
        self.failed: OSError | None = None

    def write(self, data: bytes) -> None:
        self._raise_failed()
        self.buf.append(data)
        if self._writing is None:
            self._writing = asyncio.get_running_loop().create_task(self._write_out())

    async def _write_out(self) -> None:
        try:
            while self.buf:
                data, self.buf = b"".join(self.buf), []
                await on_thread(write_all, self.fd, data)
        except OSError as exc:
            self.failed, self.buf = exc, []
        finally:
            self._writing = None

    async def drain(self) -> None:
        """Wait until everything written so far is out."""
        while self._writing is not None:
            await asyncio.shield(self._writing)
        self._raise_failed()

    def _raise_failed(self) -> None:
        if self.failed is not None:
            raise ConnectionError(f"stdout cannot be written: {self.failed}")

    def queued(self) -> int:
        return sum(map(len, self.buf))

    def close(self) -> None:
        pass

    def abort(self) -> None:
        self.buf.clear()

    async def wait_closed(self) -> None:
        await self.drain()


class _FileFeed:
    """The "transport" of a stdin read in a thread: flow control pauses the thread."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.reading.set()

    def pause_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()


def _feed_from_file(loop: asyncio.AbstractEventLoop, lines: LineReader, feed: _FileFeed) -> None:
    """Read a stdin the loop does not watch (a file, a device, a terminal) in a thread.

    A daemon thread: a read a terminal holds open must not keep a stopped host alive.
    It waits while the connection is paused, so a file is read no faster than served.
    """
    with contextlib.suppress(RuntimeError):  # the loop closed: the host has stopped
        while feed.reading.wait() and (chunk := os.read(0, CHUNK)):
            loop.call_soon_threadsafe(lines.data_received, chunk)
        loop.call_soon_threadsafe(lines.eof_received)


def _widen_pipe(fd: int) -> None:
    """Give a pipe 1 MiB of buffer (Linux's default limit for anyone) instead of 64 KiB.

    While an append group's fsync holds the loop, the requests behind it wait in the pipe;
    a wider pipe lets a draining outbox queue a bigger next group (fewer fsyncs).
    """
    with contextlib.suppress(OSError, AttributeError):
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)


def _streams(fd: int) -> bool:
    """Whether the loop watches ``fd``: a pipe or a socket, not a file, device or terminal.

    uvloop aborts the process on a regular file or ``/dev/null``, and asyncio waits on
    ``/dev/null`` for ever. A terminal the loop would make non-blocking for every program
    that shares it (the next one in the shell fails with ``EAGAIN``), and uvloop drops
    what was typed before it read. Those are read and written in a thread instead.
    """
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _one_socket(a: int, b: int) -> bool:
    """Whether ``a`` and ``b`` are the same socket (inetd, systemd ``Accept=yes``)."""
    sa, sb = os.fstat(a), os.fstat(b)
    return stat.S_ISSOCK(sa.st_mode) and (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


async def serve_stdio(host: Host) -> None:
    """Serve the one connection on stdin/stdout (pipes, sockets, ttys, files or devices)."""
    loop = asyncio.get_running_loop()
    if _one_socket(sys.stdin.fileno(), sys.stdout.fileno()):
        # One socket both ways is one socket connection. As a read pipe and a write pipe,
        # the write side's watch for a closed peer takes each request for end of input.
        served: set[asyncio.Task[None]] = set()
        sock = socket.socket(fileno=os.dup(sys.stdin.fileno()))
        await loop.connect_accepted_socket(lambda: _Client(host, served), sock)
        await asyncio.gather(*list(served))
        return
    writer: _Output | _FileWriter
    if _streams(sys.stdout.fileno()):
        _, writer = await loop.connect_write_pipe(_Output, sys.stdout.buffer)
    else:
        writer = _FileWriter(sys.stdout.fileno())
    lines = LineReader()
    conn = connect(host, lines, writer)
    if _streams(sys.stdin.fileno()):
        _widen_pipe(sys.stdin.fileno())
        await loop.connect_read_pipe(lambda: lines, sys.stdin.buffer)
    else:
        feed = _FileFeed()
        lines.transport = feed
        args = (loop, lines, feed)
        threading.Thread(target=_feed_from_file, args=args, daemon=True).start()
    await serve_connection(host, lines, conn, writer)


class _Sender:
    """The writer a connection answers through, over a transport's own flow control.

    asyncio's ``FlowControlMixin`` cannot be it: its ``wait_closed`` raises
    ``NotImplementedError``, so a host that ended its connection exited before the answers
    still queued for a slow client were written; and uvloop only reads into
    ``get_buffer`` for a protocol that is not a ``FlowControlMixin``.
    """

    transport: Any

    def __init__(self) -> None:
        self._writable = asyncio.Event()
        self._writable.set()
        self._gone = asyncio.Event()
        self.listener: Connection | None = None
        """The connection answering through it, told when the client falls behind."""

    def _made(self, transport: Any) -> None:
        """Pause past ``ANSWERS_WAITING`` bytes unread, resume at ``ANSWERS_RESUME``."""
        self.transport = transport
        with contextlib.suppress(AttributeError, NotImplementedError):
            transport.set_write_buffer_limits(high=ANSWERS_WAITING, low=ANSWERS_RESUME)

    def pause_writing(self) -> None:
        self._writable.clear()
        if self.listener is not None:
            self.listener.writer_paused(True)

    def resume_writing(self) -> None:
        self._writable.set()
        if self.listener is not None:
            self.listener.writer_paused(False)

    def _lost(self) -> None:
        self._gone.set()
        self._writable.set()  # wake the drains, to fail
        if self.listener is not None:
            self.listener.writer_gone()

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the client reads too slowly; ``ConnectionResetError`` once it is gone."""
        await self._writable.wait()
        if self._gone.is_set():
            raise ConnectionResetError("the client went away")

    def queued(self) -> int:
        """Bytes written but not yet taken by the client."""
        return 0 if self._gone.is_set() else int(self.transport.get_write_buffer_size())

    def close(self) -> None:
        """Close once every queued byte is written (:meth:`wait_closed` waits for it)."""
        self.transport.close()

    def abort(self) -> None:
        self.transport.abort()

    async def wait_closed(self) -> None:
        await self._gone.wait()


class _Output(_Sender, asyncio.Protocol):
    """stdout as a pipe, socket or tty."""

    def connection_made(self, transport: Any) -> None:
        self._made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()


class _Client(_Sender, LineReader):
    """One socket client: its lines go to its connection, which answers through it.

    A client that has not handshaken within the host's ``handshake_timeout`` is told so
    and closed: an idle connection holds a descriptor and a buffer for nothing.
    """

    def __init__(
        self, host: Host, clients: set[asyncio.Task[None]], server: _Listener | None = None
    ) -> None:
        LineReader.__init__(self, budget=host.requests)
        _Sender.__init__(self)
        self.host = host
        self.clients = clients
        self.server = server  # a socket server's (stdio's one socket has no deadline)
        if server is not None:
            server.connections += 1
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        LineReader.connection_made(self, transport)
        self._made(transport)
        conn = connect(self.host, self, self)
        loop = asyncio.get_running_loop()
        if self.server is not None:
            timeout = self.host.limits.handshake_timeout
            self._deadline = loop.call_later(timeout, self._no_handshake, conn, timeout)
        task = loop.create_task(serve_connection(self.host, self, conn, self))
        self.clients.add(task)
        task.add_done_callback(self._served)

    def _no_handshake(self, conn: Connection, timeout: float) -> None:
        if conn.handshaken or self.ended.is_set():
            return
        log.info("closing a connection that did not handshake within %g s", timeout)
        err = NotHandshaken(f"no handshake within {timeout:g} s: closing", limit=timeout)
        conn.error_now(err.to_object())
        self.ended.set()  # serve_connection finishes what there is, and closes

    def _served(self, task: asyncio.Task[None]) -> None:
        self.clients.discard(task)
        if self.server is not None:
            self.server.connections -= 1
        if self._deadline is not None:
            self._deadline.cancel()

    def connection_lost(self, exc: Exception | None) -> None:
        LineReader.connection_lost(self, exc)
        self._lost()


class _Refusal(asyncio.Protocol):
    """A connection past the cap: one error line, then end of file.

    The host's side is shut once the line is written (``write_eof``) and what the client
    sends meanwhile is read and dropped, so the client reads the line and then the end.
    Closing at once, with the handshake every client writes on connecting unread, reset
    the connection: Node's ``net.Socket`` got ``EPIPE`` and dropped the line unread, Python
    read ``ECONNRESET`` after it (issue 36). It is closed when the client closes, or after
    :data:`REFUSAL_WAIT` seconds or :data:`REFUSAL_READ` bytes. ``held`` is the listener's
    set of such refusals; ``None`` (already ``refusals_held`` of them) closes at once.
    """

    def __init__(self, cap: int, held: set[_Refusal] | None) -> None:
        self.cap = cap
        self.held = held
        if held is not None:  # counted at once, like a client: a burst is accepted in one go
            held.add(self)
        self.transport: Any = None
        self.read = 0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        err = LimitExceeded(
            f"too many connections: the host serves {self.cap} at once; try again later",
            limit=self.cap,
        )
        transport.write(ENCODER.encode({"jsonrpc": "2.0", "id": None, "error": err.to_object()}))
        transport.write(b"\n")
        if self.held is None or transport.is_closing():
            transport.close()  # once the line is written
            return
        transport.write_eof()  # once the line is written: the client reads it, then the end
        self._timer = asyncio.get_running_loop().call_later(REFUSAL_WAIT, transport.close)

    def data_received(self, data: bytes) -> None:
        self.read += len(data)
        if self.read > REFUSAL_READ:
            self.transport.close()

    def eof_received(self) -> bool:
        return False  # the client is done: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        if self.held is not None:
            self.held.discard(self)
        if self._timer is not None:
            self._timer.cancel()


def _clear_stale_socket(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise DataDirBusy(f"{path} exists and is not a socket: refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody answers: a leftover of a host that died
        return
    finally:
        probe.close()
    raise DataDirBusy(f"socket {path} is already served by another process")


class _Listener:
    """A Unix socket (mode 0600), bound before recovery and served after it.

    Bound first so a bad or busy path fails at once, not after a long recovery; clients
    that connect meanwhile wait in the backlog. At shutdown the path is unlinked as soon as
    the socket stops listening, and only while it is still this host's: a newer host may
    have taken the path while this one waits for its slow clients.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.clients: set[asyncio.Task[None]] = set()
        self.connections = 0  # accepted and not yet done (the cap's count)
        self.refusals: set[_Refusal] = set()  # refused, held for their clients to read
        self.host: Host | None = None
        self.server: asyncio.AbstractServer | None = None
        self.ident: tuple[int, int] | None = None

    async def bind(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=DIR_MODE, exist_ok=True)
        _clear_stale_socket(self.path)
        old = os.umask(0o177)
        try:
            self.server = await asyncio.get_running_loop().create_unix_server(
                self._client, self.path, start_serving=False
            )
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        st = os.stat(self.path)
        self.ident = st.st_dev, st.st_ino

    def _client(self) -> asyncio.BaseProtocol:
        assert self.host is not None, "connections are accepted only once serving"
        cap = self.host.limits.max_connections
        if self.connections >= cap:
            self.host.registry.count("connections.refused")
            log.warning("a connection refused: %d are served already", cap)
            room = len(self.refusals) < self.host.limits.refusals_held
            return _Refusal(cap, self.refusals if room else None)
        return _Client(self.host, self.clients, self)

    async def serve(self, host: Host) -> None:
        """Serve every connection until shutdown, then wait for the clients to finish."""
        assert self.server is not None
        self.host = host
        await self.server.start_serving()
        log.info("serving on %s", self.path)
        try:
            await host.shutdown_requested.wait()
        finally:
            self.close()
            await asyncio.gather(*list(self.clients), return_exceptions=True)

    def close(self) -> None:
        """Stop listening and remove the path if it is still this socket (idempotent)."""
        if self.server is not None:
            self.server.close()
        for refusal in list(self.refusals):
            if refusal.transport is not None:
                refusal.transport.close()
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self.ident:
                os.unlink(self.path)
        self.ident = None


async def _serve_both(host: Host, listener: _Listener) -> None:
    """Serve stdio and ``listener``'s socket; end of stdin stops the socket's too."""
    socket = asyncio.create_task(listener.serve(host))
    try:
        await serve_stdio(host)
    finally:
        host.shutdown_requested.set()
        await socket


EXIT_DISK_FULL = 4
"""Exit status of a start the disk refused: full or failing. Nothing was changed."""
EXIT_NOT_WRITABLE = 5
"""Exit status of a start on a data dir the host may not write: read-only, no permission."""
EXIT_OS_ERROR = 6
"""Exit status of a start any other ``OSError`` stopped (the line names it: a data dir
path that is a file, a ``sessions`` that is no folder, a name too long, a file system that
refuses a call). Nothing is set aside or removed for it."""
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.ENOMEM)
_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def refuse_start(data_dir: str, exc: OSError | sqlite3.Error) -> int:
    """Log why the system refused the start, in one line; return the exit status.

    Every ``OSError`` is one line and a documented status (issue 36: one the start did
    not know gave a traceback and exit 1); its traceback goes to the debug log. Re-raises
    an ``sqlite3.Error`` that is no disk trouble (a bug's traceback is worth keeping).
    Never damage: the index is left where it is (see ``host._index.disk_trouble``).
    """
    if isinstance(exc, OSError):
        what = f"{errno.errorcode.get(exc.errno or 0, '?')}: {exc.strerror}: {exc.filename}"
        full = exc.errno in _FULL_ERRNOS
        if not full and exc.errno not in _READ_ONLY_ERRNOS:
            log.debug("the start's error", exc_info=exc)
            log.error(
                "cannot start on %s: %s; nothing was set aside or removed for it: fix what"
                " it names and start again (--log-level debug shows where it came from)",
                data_dir,
                what,
            )
            return EXIT_OS_ERROR
        why = "read-only file system" if exc.errno == errno.EROFS else "no write permission"
    else:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        what = f"index: {exc}"
        full = code in DISK_FULL
        if not full and code not in NOT_WRITABLE:
            raise exc
        why = "read-only file system or no write permission"
    if full:
        log.error(
            "cannot start on %s: the disk is full or failing (%s); nothing was changed:"
            " start again once there is space or the disk is fixed",
            data_dir,
            what,
        )
        return EXIT_DISK_FULL
    log.error(
        "cannot start on %s: the data dir cannot be written (%s; %s); nothing was changed:"
        " make it writable and start again",
        data_dir,
        why,
        what,
    )
    return EXIT_NOT_WRITABLE


async def serve(
    data_dir: str,
    socket_path: str | None,
    busy_timeout: float = BUSY_TIMEOUT,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    *,
    also_socket: str | None = None,
) -> int:
    """Run the host on ``data_dir`` until end of input or shutdown; return the exit code.

    ``also_socket``: serve stdio and that socket together (watchers beside the app that
    spawned the host, issue 34); end of stdin stops both.
    """
    nofile = raise_nofile()
    limits = Limits.for_descriptors(nofile, handshake_timeout)
    log.debug(
        "%d descriptors: at most %d connections and %d open transcripts",
        nofile,
        limits.max_connections,
        limits.open_transcripts,
    )
    try:
        lock = lock_data_dir(data_dir)
    except DataDirBusy as exc:
        log.error("%s", exc)
        return 3
    except OSError as exc:
        return refuse_start(data_dir, exc)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()  # a signal during recovery: finish it, then exit 0 unserved
    for sig in _SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    listen = socket_path or also_socket
    listener = _Listener(listen) if listen else None
    try:
        if listener is not None:
            try:
                await listener.bind()
            except DataDirBusy as exc:
                log.error("%s", exc)
                return 3
            except OSError as exc:
                log.error("cannot listen on %s: %s", socket_path, exc)
                return 2
        return await _run(data_dir, listener, busy_timeout, limits, stop, beside=not socket_path)
    finally:
        if listener is not None:
            listener.close()
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)
        lock.close()


_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def _run(
    data_dir: str,
    listener: _Listener | None,
    busy_timeout: float,
    limits: Limits,
    stop: asyncio.Event,
    *,
    beside: bool = False,
) -> int:
    """Open the host and serve until shutdown; the exit code (a refused start's too).

    ``beside``: ``listener`` serves beside stdio (issue 34's ``--also-socket``)."""
    started = False
    try:
        async with Host.open(data_dir, busy_timeout=busy_timeout, limits=limits) as host:
            started = True
            tune_gc()
            for sig in _SIGNALS:
                asyncio.get_running_loop().add_signal_handler(sig, host.shutdown_requested.set)
            if stop.is_set():
                host.shutdown_requested.set()
            if listener is not None and beside:
                await _serve_both(host, listener)
            elif listener is not None:
                await listener.serve(host)
            else:
                await serve_stdio(host)
    except IndexBusy as exc:  # only Host.open raises these
        log.error("%s", exc)
        return 3
    except UnsafeDataDir as exc:
        log.error("%s", exc)
        return 2
    except (OSError, sqlite3.Error) as exc:
        if started:
            raise
        return refuse_start(data_dir, exc)
    log.info("host stopped")
    return 0
