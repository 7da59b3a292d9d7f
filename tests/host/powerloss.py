"""A file system that knows what a power cut would keep: only what was fsynced.

A file's bytes survive as of its last ``fsync``; a name in a folder survives as of the
folder's last ``fsync`` (so a create, rename, link or unlink is durable only then). The
store's every file operation goes through the ``FileSystem`` seam, so this class sees
them all. ``image()`` writes the data dir as it would be found after the cut: unsynced
bytes dropped (or torn: half of an unsynced append kept), unsynced names undone.

SQLite is outside the seam; the index is derived, and an image can carry either the
index as it is or the one from before the write (SQLite with ``synchronous=NORMAL`` may
lose its last commits on a power cut; start-up must cope with both).
"""

from __future__ import annotations

import os
import shutil
import traceback
from collections.abc import Sequence

from host import FileSystem
from host._fs import Buffer
from tests.host.inproc import FS_CALLS, Crash, tick_before

INDEX_FILES = ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm")


class PowerLossFileSystem(FileSystem):
    """Tracks durability; may crash at its Nth operation or skip its Kth fsync."""

    def __init__(self, root: str, crash_at: int = 0, skip_fsync: int = 0) -> None:
        self.root = os.path.abspath(root)
        self.crash_at = crash_at
        self.skip_fsync = skip_fsync
        self.calls = 0
        self.fsyncs = 0
        self.callers: list[str] = []  # the store function behind each counted fsync
        self.armed = False
        self._next_uid = 0
        self.uid: dict[int, int] = {}  # inode -> identity of the file now using it
        self.data: dict[int, bytes] = {}  # identity -> bytes as of its last fsync
        self.names: dict[str, dict[str, int]] = {}  # folder -> {name: identity} as synced
        self.dirs: set[str] = set()
        self.index_before: dict[str, bytes] = {}
        for folder, _dirs, files in os.walk(self.root):
            self.dirs.add(folder)
            self.names[folder] = {}
            for name in files:
                path = os.path.join(folder, name)
                uid = self._new_uid(os.stat(path).st_ino)
                with open(path, "rb") as f:
                    self.data[uid] = f.read()
                self.names[folder][name] = uid

    def arm(self) -> None:
        """Start counting operations (and remember the index as it was)."""
        self.armed = True
        for name in INDEX_FILES:
            path = os.path.join(self.root, name)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    self.index_before[name] = f.read()

    def _skipped(self, kind: str) -> bool:
        """Count an fsync of the write under test; whether it is the one to leave out."""
        if not self.armed:
            return False
        self.fsyncs += 1
        frames = [f for f in traceback.extract_stack()[:-2] if "/host/" in f.filename]
        site = f"{os.path.basename(frames[-1].filename)[:-3]}.{frames[-1].name}" if frames else "?"
        self.callers.append(f"{site}/{kind}")  # the line of code that asked for it
        return self.fsyncs == self.skip_fsync

    def _new_uid(self, ino: int) -> int:
        self._next_uid += 1
        self.uid[ino] = self._next_uid
        return self._next_uid

    def _tick(self, what: str = "") -> None:
        if not self.armed:
            return
        self.calls += 1
        if self.crash_at and self.calls >= self.crash_at:
            raise Crash(f"power cut at file operation {self.calls}")

    # -- the operations that change what would survive --------------------------------

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        self._tick()
        existed = os.path.exists(path)
        fd = super().open(path, flags, mode)
        ino = os.fstat(fd).st_ino
        if not existed or ino not in self.uid:
            self.data.setdefault(self._new_uid(ino), b"")
        return fd

    def fsync(self, fd: int) -> None:
        self._tick()
        super().fsync(fd)
        if self._skipped("fsync"):
            return  # this fsync "did not happen": nothing becomes durable
        uid = self.uid[os.fstat(fd).st_ino]
        with open(f"/proc/self/fd/{fd}", "rb") as f:  # fd may be write-only
            self.data[uid] = f.read()

    def write_synced(self, fd: int, parts: Sequence[Buffer]) -> None:
        self._tick()
        FileSystem.write_synced(self, fd, parts)
        if self._skipped("write_synced"):
            return  # its flush "did not happen": the bytes are only in the page cache
        uid = self.uid[os.fstat(fd).st_ino]
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            self.data[uid] = f.read()

    def fsync_dir(self, path: str) -> None:
        self._tick()
        super().fsync_dir(path)
        if self._skipped("fsync_dir"):
            return
        folder = os.path.abspath(path)
        entries = {}
        for name in os.listdir(folder):
            full = os.path.join(folder, name)
            if os.path.isfile(full):
                ino = os.stat(full).st_ino
                entries[name] = self.uid[ino] if ino in self.uid else self._new_uid(ino)
        self.names[folder] = entries

    def mkdir(self, path: str) -> None:
        self._tick()
        super().mkdir(path)
        for folder, _dirs, _files in os.walk(os.path.abspath(path)):
            if folder not in self.dirs:
                self.dirs.add(folder)
                self.names.setdefault(folder, {})

    # -- the image ------------------------------------------------------------------

    def image(self, target: str, *, torn: bool = False, stale_index: bool = False) -> None:
        """Write the data dir as a power cut now would leave it."""
        os.makedirs(target)
        for folder in sorted(self.dirs):
            rel = os.path.relpath(folder, self.root)
            out = os.path.join(target, rel)
            os.makedirs(out, exist_ok=True)
            for name, uid in self.names.get(folder, {}).items():
                if name in INDEX_FILES and folder == self.root:
                    continue
                data = self.data.get(uid, b"")
                if torn:
                    live = os.path.join(folder, name)
                    current = _read(live) if os.path.exists(live) else b""
                    if current.startswith(data) and len(current) > len(data):
                        data = current[: len(data) + (len(current) - len(data)) // 2]
                with open(os.path.join(out, name), "wb") as f:
                    f.write(data)
        for name in INDEX_FILES:
            src = os.path.join(self.root, name)
            dst = os.path.join(target, name)
            if stale_index:
                if name in self.index_before:
                    with open(dst, "wb") as f:
                        f.write(self.index_before[name])
            elif os.path.exists(src):
                shutil.copyfile(src, dst)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


tick_before(
    PowerLossFileSystem,
    tuple(n for n in FS_CALLS if n not in ("open", "write_synced", "fsync", "fsync_dir", "mkdir")),
)
