"""One session's transcript file: ``sessions/<id>.jsonl``, the truth.

Appends write whole lines with ``os.write`` on the loop (the page cache is fast) and fsync
in a thread; rewrites build a temp file from kernel-side copies of the old file's ranges
plus the new bytes, fsync it, rename it over the transcript and fsync the folder. The old
descriptor is kept until the index has followed, so a rewrite can still be undone.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from host._fs import FileSystem, temp_name

Piece = bytes | tuple[int, int]
"""A piece of a rewritten file: new bytes, or ``(offset, length)`` copied from the old one."""


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What the index remembers of a transcript file to notice any change behind its back."""

    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)


class Transcript:
    """An open transcript: one descriptor for appends and positioned reads."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.fs = fs
        self.path = path
        self.fd = fs.open(path, os.O_RDWR | os.O_APPEND)

    @classmethod
    def create(cls, fs: FileSystem, path: str) -> Transcript:
        """Create an empty transcript durably (file and folder entry fsynced)."""
        fd = fs.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.fsync_dir(os.path.dirname(path))
        return cls(fs, path)

    def close(self) -> None:
        """Close the descriptor."""
        if self.fd >= 0:
            self.fs.close(self.fd)
            self.fd = -1

    def stamp(self) -> FileStamp:
        """Return the file's identity, size and mtime."""
        return FileStamp.of(os.fstat(self.fd))

    def write(self, data: bytes) -> None:
        """Append whole lines to the page cache; not durable until :meth:`sync`."""
        self.fs.write_all(self.fd, data)

    def sync(self) -> None:
        """Make every appended byte durable."""
        self.fs.fsync(self.fd)

    def cut(self, size: int) -> None:
        """Cut the file back to ``size`` bytes, durably (rollback and truncation)."""
        self.fs.ftruncate(self.fd, size)
        self.fs.fsync(self.fd)

    def read(self, offset: int, size: int) -> bytes:
        """Read ``size`` bytes at ``offset``."""
        return self.fs.pread(self.fd, size, offset)

    def rewrite(self, pieces: Sequence[Piece]) -> Rewrite:
        """Replace the file atomically by ``pieces``; the old descriptor stays open."""
        folder = os.path.dirname(self.path)
        tmp = temp_name(self.path)
        # Not O_APPEND while it is filled: copy_file_range refuses (EBADF) a destination
        # opened for appending. It becomes the append descriptor once filled.
        fd = self.fs.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            for piece in pieces:
                if isinstance(piece, tuple):
                    if piece[1] > 0:
                        self.fs.copy_range(self.fd, fd, piece[0], piece[1])
                else:
                    self.fs.write_all(fd, piece)
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
            self.fs.fsync(fd)
            self.fs.rename(tmp, self.path)
        except BaseException:
            self.fs.close(fd)
            self.fs.unlink(tmp)
            raise
        old, self.fd = self.fd, fd
        try:
            self.fs.fsync_dir(folder)
        except BaseException:
            Rewrite(self, old).undo()
            raise
        return Rewrite(self, old)


class Rewrite:
    """A rewrite that has replaced the file, until the index follows (or it is undone)."""

    def __init__(self, transcript: Transcript, old_fd: int) -> None:
        self.transcript = transcript
        self.old_fd = old_fd

    def commit(self) -> None:
        """Forget the old file."""
        self.transcript.fs.close(self.old_fd)

    def undo(self) -> None:
        """Put the old file's bytes back in place atomically."""
        t = self.transcript
        size = os.fstat(self.old_fd).st_size
        new_fd = t.fd
        t.fd = self.old_fd
        try:
            t.rewrite([(0, size)]).commit()
        finally:
            t.fs.close(new_fd)


def iter_lines(
    fs: FileSystem, fd: int, offset: int, chunk: int = 1 << 20
) -> Iterator[tuple[int, bytes, bool]]:
    """Yield ``(offset, line, complete)`` for each line from ``offset`` to end of file.

    ``complete`` is false only for a last line with no newline (a torn tail).
    """
    buf = bytearray()
    pos = offset  # the file offset of buf[0]
    scanned = 0  # buf[:scanned] holds no newline: a long line is searched once, not per chunk
    while True:
        data = fs.pread(fd, chunk, pos + len(buf))
        if not data:
            if buf:
                yield pos, bytes(buf), False
            return
        buf += data
        start = 0
        while (nl := buf.find(b"\n", max(start, scanned))) >= 0:
            yield pos + start, bytes(buf[start:nl]), True
            start = nl + 1
        del buf[:start]  # in place: a growing line is never copied whole per chunk
        pos += start
        scanned = len(buf)
