"""In-process helpers: a real Host on real files, called through its handler table.

For tests that need to pause a call inside its lock or to crash the store at its Nth file
operation; everything protocol-shaped is tested over the real subprocess in tests/e2e.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from host import FileSystem, Host
from host._errors import to_error_object
from host._wire import DECODERS


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


class Client:
    """Calls a Host's handlers the way the endpoint does: params decoded from JSON."""

    def __init__(self, host: Host) -> None:
        self.host = host

    async def __call__(self, method: str, **params: Any) -> Any:
        p = DECODERS[method].decode(json.dumps(params).encode())
        result = await self.host.handlers[method](p)
        return json.loads(msgspec.json.encode(result))

    async def error(self, method: str, **params: Any) -> dict[str, Any]:
        """The error object the endpoint would answer for this call."""
        try:
            await self(method, **params)
        except Exception as exc:
            return to_error_object(exc, method)
        raise AssertionError(f"{method} did not fail")


@contextlib.asynccontextmanager
async def open_host(data_dir: str, fs: FileSystem | None = None) -> AsyncIterator[Client]:
    os.makedirs(data_dir, exist_ok=True)
    async with Host.open(data_dir, fs) as host:
        yield Client(host)


def msg(mid: str, role: str = "assistant", content: str = "text", **extra: Any) -> dict[str, Any]:
    return {"id": mid, "role": role, "content": content, **extra}
