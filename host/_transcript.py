"""One session's transcript file: ``sessions/<id>.jsonl``, the truth.

Appends write whole lines with ``os.write`` on the loop (the page cache is fast) and fsync
in a thread; rewrites build a temp file from kernel-side copies of the old file's ranges
plus the new bytes and fsync it, then rename it over the transcript and fsync the folder
(:mod:`host._intents`).
"""

from __future__ import annotations

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

    def prepare(self, pieces: Sequence[Piece]) -> str:
        """Write ``pieces`` to a new temp file beside the transcript, fsynced; return its
        name (removed on a failure). The change engine renames it in (``Intents.apply``)."""
        tmp = temp_name(self.path)
        # Not O_APPEND while it is filled: copy_file_range refuses (EBADF) a destination
        # opened for appending.
        fd = self.fs.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            for piece in pieces:
                if isinstance(piece, tuple):
                    if piece[1] > 0:
                        self.fs.copy_range(self.fd, fd, piece[0], piece[1])
                else:
                    self.fs.write_all(fd, piece)
            self.fs.fsync(fd)
        except BaseException:
            self.fs.close(fd)
            self.fs.unlink(tmp)
            raise
        self.fs.close(fd)
        return os.path.basename(tmp)

    def reopen(self) -> None:
        """Open the file now at the path (a change renamed a new one there)."""
        fd = self.fs.open(self.path, os.O_RDWR | os.O_APPEND)
        self.close()
        self.fd = fd


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
