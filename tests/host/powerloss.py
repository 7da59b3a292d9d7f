"""A file system that knows what a power cut would keep: only what was fsynced.

A file's bytes survive as of its last ``fsync`` (or the ``pwritev`` with ``RWF_DSYNC``
that wrote them); a name in a folder survives as of the folder's last ``fsync`` (so a
create, rename, link or unlink is durable only then). The store's every file operation
goes through the ``FileSystem`` seam, so this class sees them all, to crash at one or
leave one fsync out; but what became durable is judged from the system calls ``host._fs``
made (:mod:`tests.powercut`), never from which seam method ran: the model must not trust
the code it judges. ``image()`` writes the data dir as it would be found after the cut:
unsynced bytes dropped (or torn: half of an unsynced append kept), unsynced names undone.

SQLite is outside the seam, so the model keeps what SQLite's documented rule makes
durable (sqlite.org/pragma.html#pragma_synchronous, sqlite.org/wal.html): in WAL mode,
``synchronous=FULL`` syncs the WAL at every commit, and with it every commit before;
``NORMAL`` syncs it only at a checkpoint, so a power cut may take back *every* commit since
the last sync, several calls back, or any later prefix of them (the WAL's frames are
checksummed in order: recovery stops at the first one lost). The index calls
``FileSystem.sqlite_committed`` after each commit with the level SQLite reported in force;
the model copies the index files there, and an image picks the last synced copy, a later
one, or the current files. The ``-shm`` file is never kept: it is shared memory, rebuilt
from the WAL.

Inode numbers: an image's files are new files, with new numbers. ext4 hands a freed
inode number to the next file at once, so a transcript rewritten twice can have the number
the index remembers for an older file; the model assumes the worst and gives every
index row the number of the file now at its session's path. A file's mtime is as of its
last fsync (what the journal commits with its data), or of its last ``RWF_DSYNC`` write
that grew it (``fdatasync`` logs the inode only when the size changed).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import traceback
from collections.abc import Iterator, Sequence

import host._fs
from host import FileSystem
from host._fs import Buffer
from tests.host.inproc import FS_CALLS, Crash, tick_before
from tests.powercut import Disk, watch

watch(host._fs)  # the seam's system calls are judged, not its method names

INDEX_FILES = ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm")


class PowerLossFileSystem(FileSystem, Disk):
    """Tracks durability; may crash at its Nth operation or skip its Kth fsync.

    What is durable is decided by :class:`tests.powercut.Disk` from the system calls
    ``host._fs`` makes (``fsync``, ``pwritev`` with ``RWF_DSYNC``), never by the seam's
    method names: a ``write_synced`` that forgets its flag keeps nothing here.
    """

    def __init__(self, root: str, crash_at: int = 0, skip_fsync: int = 0) -> None:
        Disk.__init__(self, root)
        self.crash_at = crash_at
        self.skip_fsync = skip_fsync
        self.calls = 0
        self.fsyncs = 0
        self.callers: list[str] = []  # the store function behind each counted fsync
        self.armed = False
        self._leaving_out = threading.local()  # the seam call whose syncs "did not happen"
        self.index_synced: dict[str, bytes] = {}  # the index as of SQLite's last sync
        self.index_commits: list[dict[str, bytes]] = []  # after each commit since then
        self.commits = self.synced_commits = 0
        # What a clean stop left (its last checkpoint synced it): durable.
        self.index_synced = self._index_files()

    def arm(self) -> None:
        """Start counting operations."""
        self.armed = True

    def _index_files(self) -> dict[str, bytes]:
        out = {}
        for name in INDEX_FILES[:2]:  # the database and its WAL; never the -shm
            path = os.path.join(self.root, name)
            if os.path.exists(path):
                out[name] = _read(path)
        return out

    def sqlite_committed(self, synchronous: int) -> None:
        self.commits += 1
        files = self._index_files()
        if synchronous >= 2:  # FULL or EXTRA: the WAL is synced before the commit returns
            self.index_synced, self.index_commits = files, []
            self.synced_commits += 1
        else:  # NORMAL: in the page cache until a checkpoint
            self.index_commits.append(files)

    def counts(self) -> bool:
        return not getattr(self._leaving_out, "now", False)

    @contextlib.contextmanager
    def _unless(self, skipped: bool) -> Iterator[None]:
        """Run a seam call; when ``skipped``, whatever it syncs "did not happen"."""
        outer = getattr(self._leaving_out, "now", False)
        self._leaving_out.now = outer or skipped
        try:
            yield
        finally:
            self._leaving_out.now = outer

    def _skipped(self, kind: str) -> bool:
        """Count an fsync of the write under test; whether it is the one to leave out."""
        if not self.armed:
            return False
        self.fsyncs += 1
        frames = [f for f in traceback.extract_stack()[:-2] if "/host/" in f.filename]
        site = f"{os.path.basename(frames[-1].filename)[:-3]}.{frames[-1].name}" if frames else "?"
        self.callers.append(f"{site}/{kind}")  # the line of code that asked for it
        return self.fsyncs == self.skip_fsync

    def _tick(self, what: str = "") -> None:
        if not self.armed:
            return
        self.calls += 1
        if self.crash_at and self.calls >= self.crash_at:
            raise Crash(f"power cut at file operation {self.calls}")

    # -- the seam calls that ask for durability (the system calls decide what they got) -

    def fsync(self, fd: int) -> None:
        self._tick()
        with self._unless(self._skipped("fsync")):
            super().fsync(fd)

    def write_synced(self, fd: int, parts: Sequence[Buffer]) -> None:
        self._tick()
        with self._unless(self._skipped("write_synced")):
            FileSystem.write_synced(self, fd, parts)

    def fsync_dir(self, path: str) -> None:
        self._tick()
        with self._unless(self._skipped("fsync_dir")):
            super().fsync_dir(path)

    def mkdir(self, path: str) -> None:
        self._tick()
        super().mkdir(path)
        for folder, _dirs, _files in os.walk(os.path.abspath(path)):
            if folder not in self.dirs:
                self.dirs.add(folder)
                self.names.setdefault(folder, {})

    # -- the image ------------------------------------------------------------------

    def image(self, target: str, *, torn: bool = False, index: str = "current") -> None:
        """Write the data dir as a power cut now would leave it.

        ``index``: ``"current"`` (every commit survived), ``"synced"`` (every commit since
        SQLite's last sync lost) or ``"middle"`` (the first half of those survived).
        """
        os.makedirs(target)
        self.image_files(
            target,
            torn=torn,
            skip=lambda folder, name: name in INDEX_FILES and folder == self.root,
        )
        files = self._index_files()
        if index == "synced":
            files = self.index_synced
        elif index == "middle" and self.index_commits:
            files = self.index_commits[(len(self.index_commits) - 1) // 2]
        for name, data in files.items():
            with open(os.path.join(target, name), "wb") as f:
                f.write(data)
        _reuse_inodes(target)


def _reuse_inodes(data_dir: str) -> None:
    """Give every index row the inode number of its session's file (ext4's reuse, at worst)."""
    path = os.path.join(data_dir, INDEX_FILES[0])
    if not os.path.exists(path):
        return
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sessions'").fetchone():
            return
        for (sid,) in conn.execute("SELECT session_id FROM sessions").fetchall():
            transcript = os.path.join(data_dir, "sessions", f"{sid}.jsonl")
            if os.path.exists(transcript):
                ino = os.stat(transcript).st_ino
                conn.execute("UPDATE sessions SET file_ino = ? WHERE session_id = ?", (ino, sid))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


tick_before(
    PowerLossFileSystem,
    tuple(n for n in FS_CALLS if n not in ("write_synced", "fsync", "fsync_dir", "mkdir")),
)
