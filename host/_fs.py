"""The one seam every file operation of the store passes through.

The store never calls ``os`` for its data files directly: it calls a :class:`FileSystem`.
Tests swap in a subclass that fails the Nth call (EIO, ENOSPC) to prove that a failed
write answers ``STORAGE_ERROR`` and loses nothing that was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import errno
import fcntl
import functools
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias, TypeVar

T = TypeVar("T")
log = logging.getLogger("host.fs")
Buffer: TypeAlias = bytes | memoryview
"""What the write calls take (msgspec's ``Raw`` is passed as a ``memoryview`` of it)."""
FILE_MODE = 0o600
DIR_MODE = 0o700

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# EPERM: a seccomp filter that denies renameat2 (Docker's default errno) but not rename.
_NO_EXCHANGE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM)
_RWF_DSYNC: int = getattr(os, "RWF_DSYNC", 0)  # Linux 4.7
_copy_file_range = getattr(os, "copy_file_range", None)  # Linux 4.5; not on macOS
_LIBC = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_LIBC, "renameat2", None)
if _renameat2 is not None:
    _renameat2.argtypes = (
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    )
    _renameat2.restype = ctypes.c_int
_FALLOC_FL_KEEP_SIZE = 1
_fallocate = getattr(_LIBC, "fallocate", None)  # Linux: posix_fallocate cannot keep the size
if _fallocate is not None:
    _fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    _fallocate.restype = ctypes.c_int


async def on_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """Run ``fn(*args)`` on a worker thread; return (or raise) only once it has ended.

    A cancel that arrives meanwhile is raised after the thread's work, never before
    (:func:`completed`): the caller still holds its session while the thread writes, and
    its cleanup runs after it (trio's ``abandon_on_cancel=False``; ``asyncio.to_thread``
    abandons the thread, and a rewrite renamed over a transcript after its session had
    passed to the next call, dropping that call's acknowledged append).
    """
    loop = asyncio.get_running_loop()
    run = functools.partial(contextvars.copy_context().run, fn, *args)
    return await completed(loop.run_in_executor(None, run))


async def completed(work: Awaitable[T]) -> T:
    """Await ``work`` to its end: a cancel that arrives meanwhile is raised after it.

    The work's own failure is then logged and dropped for the cancel (the caller's cleanup
    runs anyway): left unretrieved, the collector logs it later with its traceback.
    """
    future = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        if not future.cancelled() and (exc := future.exception()) is not None:
            log.warning("work failed after its call was cancelled: %r", exc)
        raise


class FileSystem:
    """Thin, synchronous wrappers over the system calls the store makes."""

    copy_fallbacks = 0
    """Ranges :meth:`copy_range` copied in user space (``host.stats``: a regression shows)."""
    set_aside_count = 0
    """Entries :meth:`set_aside` renamed (``host.stats``: ``sidecars.setAside``)."""

    def sqlite(self, kind: str) -> None:
        """Called before every index read (``"read"``) and transaction (``"write"``).

        It does nothing here; a test's file system raises ``sqlite3.Error`` from it, so
        SQLite failures come through the same seam as the file system's.
        """

    def sqlite_committed(self, synchronous: int) -> None:
        """Called after every index commit, with the ``PRAGMA synchronous`` it ran under.

        It does nothing here; the power-cut model keeps what SQLite's documented rule for
        that level makes durable (in WAL mode: FULL syncs the WAL at each commit, NORMAL
        only at checkpoints).
        """

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        """Open ``path`` and return its descriptor (created 0600): the one guarded open.

        A regular file only (:func:`open_regular`), else :class:`NotRegularFile`: never
        through a symlink (a link planted in the data dir must not make the host append
        to, cut or overwrite a file outside it), never blocked by a FIFO (a blocking open
        on the event loop hung every client and SIGTERM: issue 36).
        """
        return open_regular(path, flags, mode)

    def open_own(self, path: str, flags: int) -> int:
        """:meth:`open`; a link, FIFO or folder at ``path`` is set aside first and a new
        file made (one the host never reads, or one it makes anew)."""
        try:
            return self.open(path, flags)
        except NotRegularFile:
            self.set_aside(path)
            return self.open(path, flags | os.O_CREAT | os.O_EXCL)

    def set_aside(self, path: str) -> str:
        """Rename what sits at ``path`` to ``<path>.odd-<hex>`` and report it; return that.

        For a link, FIFO or folder where the host keeps a file of its own: renamed, never
        read, followed or deleted (a link is moved itself, not what it points to), so
        the host can carry on with a file of its own there and the user keeps whatever it
        was. Logged as an error and counted (``sidecars.setAside``).
        """
        what = _kind(path)
        aside = f"{path}.odd-{os.urandom(3).hex()}"
        self.rename(path, aside)
        self.set_aside_count += 1
        log.error("%s is %s, not a regular file: set aside as %s", path, what, aside)
        return aside

    def close(self, fd: int) -> None:
        """Close a descriptor."""
        os.close(fd)

    def write_all(self, fd: int, data: bytes | memoryview) -> None:
        """Write every byte of ``data`` at the descriptor's position."""
        write_all(fd, data)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """Read exactly ``size`` bytes at ``offset`` (fewer only at end of file)."""
        parts: list[bytes] = []
        while size > 0:
            chunk = os.pread(fd, min(size, 1 << 24), offset)
            if not chunk:
                break
            parts.append(chunk)
            size -= len(chunk)
            offset += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def copy_range(self, src: int, dst: int, offset: int, size: int) -> None:
        """Append ``size`` bytes of ``src`` from ``offset`` to ``dst``: in the kernel where
        it can (``copy_file_range``, Linux), else through a 1 MiB buffer (macOS)."""
        while size > 0:
            try:
                n = _copy_file_range(src, dst, size, offset) if _copy_file_range else 0
            except OSError:
                n = 0
            if n == 0:  # unsupported or short: fall back to user space
                self.copy_fallbacks += 1
                chunk = os.pread(src, min(size, 1 << 20), offset)
                if not chunk:
                    raise OSError(5, f"source ended {size} bytes early")
                self.write_all(dst, chunk)
                n = len(chunk)
            offset += n
            size -= n

    def overwrite(self, fd: int, data: bytes, offset: int) -> None:
        """Write ``data`` at ``offset`` over the bytes the file holds there (not appended).

        Over blocks the file already has (or :meth:`reserve` took) it needs no new space
        on ext4, xfs or tmpfs, so a full disk cannot fail it there (a copy-on-write file
        system, APFS or btrfs, may). ``O_APPEND`` is lifted for it: Linux's ``pwrite``
        appends on such a descriptor whatever the offset.
        """
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if flags & os.O_APPEND:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
        try:
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n
        finally:
            if flags & os.O_APPEND:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)

    def reserve(self, fd: int, offset: int, size: int) -> None:
        """Take the disk space for ``size`` bytes at ``offset`` now, the file's size unchanged.

        ``fallocate(FALLOC_FL_KEEP_SIZE)``: a later :meth:`overwrite` that grows the file
        into it needs no new space. ``ENOSPC`` when the disk is full. Where the call or the
        file system has no such thing it does nothing: the space is then taken by the write.
        """
        if _fallocate is None or size <= 0:
            return
        if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, size):
            code = ctypes.get_errno()
            if code not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise OSError(code, os.strerror(code))

    def fsync(self, fd: int) -> None:
        """Flush a file's data and metadata to the disk."""
        os.fsync(fd)

    def fsync_dir(self, path: str) -> None:
        """Flush a directory's entries (after a create, rename or unlink)."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        """Cut a file at ``size`` bytes."""
        os.ftruncate(fd, size)

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src``."""
        os.rename(src, dst)

    def unlink(self, path: str) -> bool:
        """Remove a file; ``False`` when it was already gone.

        A folder where the host keeps a file (``EISDIR``; ``EPERM`` on macOS) is set aside
        instead (:meth:`set_aside`): one planted where a deleted session's turn log was
        stopped every start (issue 36). A link or FIFO is removed like a file: only its name.
        """
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except (IsADirectoryError, PermissionError):
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise
            self.set_aside(path)
        return True

    def mkdir(self, path: str) -> None:
        """Create a directory (0700) and its missing parents, durably (parents fsynced)."""
        path = os.path.abspath(path)
        if os.path.isdir(path):
            return
        self.mkdir(os.path.dirname(path))
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            return
        self.fsync_dir(os.path.dirname(path))

    def link(self, src: str, dst: str) -> None:
        """Give ``src``'s file a second name ``dst``."""
        os.link(src, dst)

    def exchange(self, a: str, b: str) -> None:
        """Swap the files named ``a`` and ``b`` in one step (``renameat2`` RENAME_EXCHANGE).

        ``OSError`` EINVAL, ENOSYS, EOPNOTSUPP or EPERM where the kernel, the C library,
        the file system or a seccomp filter will not.
        """
        if _renameat2 is None:
            raise OSError(errno.ENOSYS, "renameat2 is not in this C library", a)
        if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), a, None, b)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data``: temp file, fsync, rename, folder fsync.

        Until the folder fsync succeeds the old file keeps a second name, so a failure at
        any step puts it back: a failed replace changes nothing.
        """
        tmp = temp_name(path)
        self.write_new(tmp, data)
        self._install(tmp, path)

    def write_swap(self, path: str, spare: str, parts: Sequence[Buffer]) -> None:
        """Replace ``path`` with the bytes of ``parts`` as :meth:`write_atomic` does, reusing a
        temp file.

        The temp file is ``spare``, kept between calls: it is overwritten in place and made
        durable (:meth:`fill_spare`), then swapped with ``path`` in one :meth:`exchange`
        and the folder fsynced (:meth:`swap_in`). The old file becomes the next call's
        spare. Reusing its blocks more than halves a 1 MB replace on ext4 (0.9 ms against
        2.1 ms): no blocks to allocate at the fsync, none to free at the rename. A failure
        changes nothing; the spare is never read, so a torn one is harmless.
        """
        self.fill_spare(spare, parts)
        self.swap_in(path, spare)

    def fill_spare(self, spare: str, parts: Sequence[Buffer]) -> None:
        """Make ``spare`` hold the bytes of ``parts`` and only those, durably, in place.

        The first half of :meth:`write_swap`: until :meth:`swap_in` the spare is never
        read, so a caller may still decide not to finish. A file a reader holds (``host
        inspect`` takes a shared lock) keeps its bytes and a new file takes the name.
        Removed on a failure.
        """
        fd = self.open_own(spare, os.O_WRONLY | os.O_CREAT)  # never read: nothing is lost
        if not _lock(fd):
            self.close(fd)
            self.unlink(spare)
            fd = self.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            size = sum(memoryview(p).nbytes for p in parts)
            longer = os.fstat(fd).st_size > size
            if longer:  # a shorter file: its cut must be durable too
                self.write_all(fd, b"".join(parts))
                self.ftruncate(fd, size)
                self.fsync(fd)
            else:  # as long or longer: the size is part of what the synced write keeps
                self.write_synced(fd, parts)
        except BaseException:
            self.close(fd)
            self.unlink(spare)
            raise
        self.close(fd)

    def write_synced(self, fd: int, parts: Sequence[Buffer]) -> None:
        """Write ``parts`` at the start of the file and make them durable before returning.

        One ``pwritev`` with ``RWF_DSYNC``: the bytes and what reading them needs (the
        size), as ``fdatasync`` promises, in one system call that holds no GIL from the
        first byte to the flush, so a thread can scan the same request meanwhile. Where the
        flag is refused, or the write comes up short, the rest is written and fsynced.
        """
        done = 0
        if _RWF_DSYNC:
            try:
                done = os.pwritev(fd, parts, 0, _RWF_DSYNC)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
        if done < sum(memoryview(p).nbytes for p in parts):
            os.lseek(fd, done, os.SEEK_SET)
            self.write_all(fd, memoryview(b"".join(parts))[done:])
            self.fsync(fd)

    def swap_in(self, path: str, spare: str) -> None:
        """Swap the filled ``spare`` with ``path`` and fsync the folder: undone on failure.

        Where the exchange cannot be done (or ``path`` does not exist yet) the spare is
        renamed over it as :meth:`write_atomic` does.
        """
        try:
            self.exchange(spare, path)
        except OSError as exc:  # ENOENT: the first replace, so the spare becomes the file
            if exc.errno != errno.ENOENT and exc.errno not in _NO_EXCHANGE:
                raise
            self._install(spare, path)
            return
        try:
            self.fsync_dir(os.path.dirname(path))
        except BaseException:
            with contextlib.suppress(OSError):
                self.exchange(spare, path)  # the old file back: still whole, never torn
            # The disk may hold either mapping: the spare's file may still be the checkpoint
            # there, so it must never be overwritten in place. (Start removes spares too.)
            with contextlib.suppress(OSError):
                self.unlink(spare)
            raise

    def write_new(self, path: str, data: bytes) -> None:
        """Write ``data`` as a new file ``path`` and fsync it; removed on a failure."""
        fd = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            self.write_all(fd, data)
            self.fsync(fd)
        except BaseException:
            self.close(fd)
            self.unlink(path)
            raise
        self.close(fd)

    def _install(self, tmp: str, path: str) -> None:
        """Rename the fsynced ``tmp`` over ``path`` and fsync the folder; undone on failure."""
        link = temp_name(path)
        backup: str | None = link
        try:
            self.link(path, link)
        except FileNotFoundError:
            backup = None  # a new file: undoing it is removing it
        except BaseException:
            self.unlink(tmp)
            raise
        renamed = False
        try:
            self.rename(tmp, path)
            renamed = True
            self.fsync_dir(os.path.dirname(path))
        except BaseException:
            if renamed:
                try:
                    if backup is not None:
                        self.rename(backup, path)
                        backup = None
                    else:
                        self.unlink(path)
                except OSError:
                    pass  # the new file stays: still a whole file, never a torn one
            else:
                self.unlink(tmp)
            raise
        finally:
            if backup is not None:
                self.unlink(backup)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` at the descriptor's position."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _lock(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` without waiting; ``False`` when it is held."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _kind(path: str) -> str:
    """What sits at ``path``, in words (for a log line)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "gone"
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file"


_KINDS = (
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


class NotRegularFile(OSError):
    """Raised by :func:`open_regular` for a symlink, FIFO, folder, socket or device."""


# ELOOP: a link (O_NOFOLLOW); EISDIR: a folder opened to write; ENXIO: a FIFO opened to
# write with no reader (O_NONBLOCK), or a socket; EOPNOTSUPP: a socket on some systems.
_NOT_REGULAR = (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP)


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = FILE_MODE) -> int:
    """Open a file of the data dir, never through a symlink, never blocked by a FIFO.

    A FIFO planted where the host opens a file would hang the event loop (and a signal
    with it); ``O_NONBLOCK`` keeps the open from waiting, and only a regular file is kept
    (its descriptor then blocks as usual). Raises ``FileNotFoundError`` when there is none
    (and ``flags`` do not create one), :class:`NotRegularFile` when it is something else.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno not in _NOT_REGULAR:
            raise
        raise NotRegularFile(exc.errno, f"{_kind(path)}, not a regular file", path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, f"{_kind(path)}, not a regular file", path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str) -> bytes:
    """Read the whole of a file of the data dir (see :func:`open_regular`)."""
    fd = open_regular(path)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_whole(path: str) -> bytes:
    """Read a file that :meth:`FileSystem.write_swap` replaces, never mid-overwrite.

    A process beside the host (``hostview inspect``) may open the checkpoint just before it
    becomes the spare; the shared lock keeps the next save from overwriting it in place.
    """
    with open(path, "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
        return f.read()


def temp_name(path: str) -> str:
    """Return a fresh temp path beside ``path``; every temp name ends in ``.tmp``."""
    return f"{path}.{os.urandom(6).hex()}.tmp"
