"""What a power cut keeps, judged from the system calls the code under test made.

A fault model must never trust the code it judges: a function that says "this write is
durable" is taken at its word by a model that hooks the function. So the models here hook
the ``os`` module the code calls (``watch(module)`` puts :data:`SYSCALLS` in its place) and
count bytes as durable only when they see the call that makes them so:

- ``fsync(fd)`` or ``fdatasync(fd)`` of a file: its bytes as they were when the call began
  (a write that lands while an fsync runs is not covered by it: POSIX promises only what
  was written before; Linux's ``fsync`` writes back the pages dirty when it starts);
- ``pwritev(fd, ..., RWF_DSYNC or RWF_SYNC)``: that write's bytes and the size they need
  (``O_DSYNC`` for one call: pwritev2(2)), nothing else the file holds unsynced;
- ``fsync`` of a folder: the names in it, as they are (a create, rename or unlink is
  durable only then: fsync(2), "fsync on the file does not ensure that the entry in the
  directory containing the file has also reached disk").

Everything else (a ``write`` alone, a ``pwritev`` without the flag, an ``ftruncate`` never
synced, a ``rename`` whose folder was never synced) is lost at the cut: the image shows the
file as of its last sync, so an unsynced cut comes back and an unsynced rename is undone.
An unsynced append may also come back torn (``image(torn=True)``: half of it), as ext4
writes pages back in any order. Inode numbers are reused at once (ext4, tmpfs), so a file
created where none existed gets a new identity whatever its number.

A :class:`Disk` tracks one folder tree; the newest one for a root hears its calls.
"""

from __future__ import annotations

import functools
import os
import stat
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

SYNC_FLAGS = getattr(os, "RWF_DSYNC", 0) | getattr(os, "RWF_SYNC", 0)

_DISKS: dict[str, weakref.ref[Disk]] = {}  # root -> the disk tracking it now
_LOCK = threading.RLock()  # a collected disk is forgotten from wherever the GC runs


def _path_of(fd: int) -> str:
    path = os.readlink(f"/proc/self/fd/{fd}")
    return path.removesuffix(" (deleted)")


def _disk_of(path: str) -> Disk | None:
    """The disk tracking ``path``: the one of the deepest root holding it."""
    with _LOCK:
        roots = [r for r in _DISKS if path == r or path.startswith(r + os.sep)]
        ref = _DISKS[max(roots, key=len)] if roots else None
    return ref() if ref is not None else None


def _forget(root: str, ref: weakref.ref[Disk]) -> None:
    """A disk was collected: its root is no longer tracked (unless a newer disk took it)."""
    with _LOCK:
        if _DISKS.get(root) is ref:
            del _DISKS[root]


def _fsync(fd: int) -> None:
    disk = _disk_of(_path_of(fd))
    if disk is None:
        return os.fsync(fd)
    disk.flush(fd, os.fsync)


def _fdatasync(fd: int) -> None:
    disk = _disk_of(_path_of(fd))
    if disk is None:
        return os.fdatasync(fd)
    disk.flush(fd, os.fdatasync)


def _pwritev(fd: int, buffers: Sequence[Any], offset: int, flags: int = 0) -> int:
    n = os.pwritev(fd, buffers, offset, flags)
    if flags & SYNC_FLAGS and (disk := _disk_of(_path_of(fd))) is not None:
        data = b"".join(bytes(memoryview(b)) for b in buffers)[:n]
        disk.range_synced(fd, offset, data)
    return n


def _open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
    existed = flags & os.O_CREAT and os.path.lexists(path)
    fd = os.open(path, flags, mode, **kw)
    if flags & os.O_CREAT and not existed and (disk := _disk_of(_path_of(fd))) is not None:
        disk.created(fd)
    return fd


SYSCALLS = types.ModuleType("os", "The os module, with the calls that make bytes durable watched.")
SYSCALLS.__dict__.update(
    # everything else is os's own, looked up at each use (a test may patch os meanwhile)
    __getattr__=lambda name: getattr(os, name),
    fsync=_fsync,
    fdatasync=_fdatasync,
    pwritev=_pwritev,
    open=_open,
)


def watch(module: types.ModuleType) -> None:
    """Make ``module`` call :data:`SYSCALLS` for ``os`` (for good: it forwards every call).

    Only files under the root of a live :class:`Disk` are judged; any other call is os's.
    """
    module.os = SYSCALLS  # type: ignore[attr-defined]


class Disk:
    """The durable state of the files under ``root``, as system calls made it.

    Every file there when it is made counts as durable as it is (a clean stop synced it).
    ``hold``, when set, is called inside every file sync, after its bytes were chosen and
    before it returns: a test makes an fsync slow there (in the thread that runs it).
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.hold: Callable[[str], None] | None = None
        self._next_uid = 0
        self.uid: dict[int, int] = {}  # inode -> identity of the file now using it
        self.data: dict[int, bytes] = {}  # identity -> bytes as of its last sync
        self.names: dict[str, dict[str, int]] = {}  # folder -> {name: identity} as synced
        self.dirs: set[str] = set()
        self.mtime: dict[int, int] = {}  # identity -> mtime as of its last sync
        self.syncs = 0  # the syncs this disk heard (a test checks it is watching)
        for folder, _dirs, files in os.walk(self.root):
            self.dirs.add(folder)
            self.names[folder] = {}
            for name in files:
                path = os.path.join(folder, name)
                st = os.stat(path)
                uid = self._new_uid(st.st_ino)
                self.data[uid] = _read(path)
                self.mtime[uid] = st.st_mtime_ns
                self.names[folder][name] = uid
        with _LOCK:
            _DISKS[self.root] = weakref.ref(self, functools.partial(_forget, self.root))

    def counts(self) -> bool:
        """Whether the sync now running makes anything durable (a model may say no)."""
        return True

    def _new_uid(self, ino: int) -> int:
        self._next_uid += 1
        self.uid[ino] = self._next_uid
        self.data.setdefault(self._next_uid, b"")
        return self._next_uid

    def _identity(self, ino: int) -> int:
        return self.uid[ino] if ino in self.uid else self._new_uid(ino)

    # -- what the watched calls report ------------------------------------------------

    def created(self, fd: int) -> None:
        """A file was made: a new identity, nothing of it durable yet."""
        self._new_uid(os.fstat(fd).st_ino)

    def flush(self, fd: int, real: Callable[[int], None]) -> None:
        """Run ``real`` (fsync or fdatasync) on ``fd``; keep what it covered once it returns."""
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            folder = _path_of(fd)
            real(fd)
            if self.counts():
                self._names_synced(folder)
            return
        counts = self.counts()  # asked in the calling thread, before anything can wait
        snapshot = _read(f"/proc/self/fd/{fd}")  # fd may be write-only
        if self.hold is not None:
            self.hold(_path_of(fd))
        real(fd)
        self.syncs += 1
        if counts:
            uid = self._identity(st.st_ino)
            self.data[uid] = snapshot
            self.mtime[uid] = st.st_mtime_ns

    def range_synced(self, fd: int, offset: int, data: bytes) -> None:
        """A write with RWF_DSYNC: its bytes are durable, and the size reaching their end."""
        self.syncs += 1
        if not self.counts():
            return
        st = os.fstat(fd)
        uid = self._identity(st.st_ino)
        old = self.data.get(uid, b"")
        self.data[uid] = old[:offset].ljust(offset, b"\0") + data + old[offset + len(data) :]
        if offset + len(data) > len(old):  # the size changed: the inode was logged with it
            self.mtime[uid] = st.st_mtime_ns

    def _names_synced(self, folder: str) -> None:
        self.dirs.add(folder)
        entries = {}
        for name in os.listdir(folder):
            full = os.path.join(folder, name)
            if os.path.isfile(full) and not os.path.islink(full):
                entries[name] = self._identity(os.stat(full).st_ino)
        self.names[folder] = entries

    # -- the image ------------------------------------------------------------------

    def image_files(
        self, target: str, *, torn: bool = False, skip: Callable[[str, str], bool] | None = None
    ) -> None:
        """Write the files as a power cut now would leave them, under ``target``.

        ``torn``: an unsynced append keeps its first half. ``skip(folder, name)``: files the
        caller writes itself.
        """
        os.makedirs(target, exist_ok=True)
        for folder in sorted(self.dirs):
            out = os.path.join(target, os.path.relpath(folder, self.root))
            os.makedirs(out, exist_ok=True)
            for name, uid in self.names.get(folder, {}).items():
                if skip is not None and skip(folder, name):
                    continue
                data = self.data.get(uid, b"")
                if torn:
                    live = os.path.join(folder, name)
                    current = _read(live) if os.path.exists(live) else b""
                    if current.startswith(data) and len(current) > len(data):
                        data = current[: len(data) + (len(current) - len(data)) // 2]
                path = os.path.join(out, name)
                with open(path, "wb") as f:
                    f.write(data)
                if uid in self.mtime:
                    os.utime(path, ns=(self.mtime[uid], self.mtime[uid]))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
