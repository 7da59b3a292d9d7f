"""Each session's turn log, ``sessions/<id>.turns.log``: what the turn table is derived from.

A turn change (begin, end, and the start's settlements) is one JSON line appended and
fsynced before its answer: one fsync per change, and nothing else to wait for, since the
index's turn table follows it in the same call without a sync of its own. So an answered
turn change survives a power cut that takes the index's last commits with it, and a lost
or rebuilt index (the start replays the logs).

The log is only ever appended to: a line once written never changes, so the index keeps
how many of its bytes it holds (``sessions.turns_size``) and a start replays only what
lies past that, never the whole history, unless the log is not what the index saw (it is
shorter: a rebuilt data dir). A last line without its newline was never answered: it is
cut at start.

A ``beginTurn`` with a prompt logs the turn with its prompt's id first, then appends the
prompt. A start that finds a running turn whose prompt is not in the transcript (the
host died between the two) logs it ``void`` and forgets it: the call left nothing, as
if it had never run.

Every open is the guarded one (``FileSystem.open``). A link, FIFO or folder at a log is
set aside (``.odd-<hex>``, reported) and a fresh log started: while serving by the change
that meets it, at start by :func:`host._recovery.reconcile_turns`, which keeps the turns the
index holds (issue 36: a FIFO there hung the host, one at start stopped every start).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from typing import Literal

import msgspec

from host._fs import FileSystem, NotRegularFile
from host._layout import Layout
from host._transcript import iter_lines

log = logging.getLogger("host.turnlog")
TurnStatus = Literal["running", "completed", "aborted", "error", "void"]


class TurnRecord(msgspec.Struct, omit_defaults=True, rename="camel"):
    """One turn change."""

    turn_id: str
    status: TurnStatus
    at: str
    prompt_id: str | None = None


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(TurnRecord).decode
CHUNK = 64 * 1024
"""Bytes of the log a catching-up watcher reads in one hold of its session."""


class TurnLog:
    """Appends to and reads the turn logs of one data dir's sessions."""

    def __init__(self, layout: Layout, fs: FileSystem) -> None:
        self.layout = layout
        self.fs = fs

    def _path(self, session_id: str) -> str:
        return self.layout.turns(session_id)

    def append(self, session_id: str, record: TurnRecord) -> tuple[int, int]:
        """Append ``record`` durably; return the log's size before and after it.

        A new log's name is made durable too (its folder fsynced): a session made by
        ``session.create`` already has its log, so this costs one fsync a change.
        """
        path = self._path(session_id)
        fs = self.fs
        created = False
        try:
            fd = fs.open(path, os.O_WRONLY | os.O_APPEND)
        except (FileNotFoundError, NotRegularFile) as exc:
            if isinstance(exc, NotRegularFile):  # the index keeps the turns it had
                fs.set_aside(path)
            fd = fs.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL)
            created = True
        line = _encode(record) + b"\n"
        try:
            before = os.fstat(fd).st_size
            try:
                fs.write_all(fd, line)  # all of it, or it raises
                fs.fsync(fd)
            except BaseException:
                fs.ftruncate(fd, before)  # a failed change leaves no half line behind
                raise
            after = before + len(line)
        finally:
            fs.close(fd)
        if created:
            fs.fsync_dir(os.path.dirname(path))
        return before, after

    def cut(self, session_id: str, size: int) -> None:
        """Take back what was appended past ``size`` (its change failed in the index)."""
        fd = self.fs.open(self._path(session_id), os.O_WRONLY)
        try:
            self.fs.ftruncate(fd, size)
            self.fs.fsync(fd)
        finally:
            self.fs.close(fd)

    def create(self, session_id: str) -> None:
        """Make an empty log for a new session (its folder is fsynced by the caller)."""
        path = self._path(session_id)
        fd = self.fs.open_own(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.fs.fsync(fd)
        finally:
            self.fs.close(fd)

    def size(self, session_id: str) -> int:
        """The log's size; 0 when there is none, :class:`NotRegularFile` when it is no file.

        One ``lstat``: a link's size is its target's name's, a folder's its blocks', so
        either looked like a grown log.
        """
        path = self._path(session_id)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return 0
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        return st.st_size

    def ends_a_record(self, session_id: str, offset: int) -> bool:
        """Whether ``offset`` is where a record ends (as in every cursor the host gives),
        the log's start, or past its end: not inside a record (one byte read)."""
        if offset == 0:
            return True
        try:
            fd = self.fs.open(self._path(session_id), os.O_RDONLY)
        except FileNotFoundError:  # no log
            return True
        try:
            return os.pread(fd, 1, offset - 1) in (b"\n", b"")
        finally:
            self.fs.close(fd)

    def chunk(self, session_id: str, start: int, end: int) -> list[tuple[TurnRecord | None, int]]:
        """The records from byte ``start`` (at most :data:`CHUNK` bytes of them, at least
        one), each with the byte it ends at; ``None`` for one that is not a record. A
        catching-up watcher reads one a hold of its session; nothing is cut or changed."""
        fd = self.fs.open(self._path(session_id), os.O_RDONLY)
        try:
            data = os.pread(fd, min(end - start, CHUNK), start)
            if b"\n" not in data:  # one line longer than a read: read it whole
                data = os.pread(fd, end - start, start)
        finally:
            self.fs.close(fd)
        out: list[tuple[TurnRecord | None, int]] = []
        pos = start
        for raw in data.split(b"\n")[:-1]:
            pos += len(raw) + 1
            try:
                out.append((_decode(raw), pos))
            except msgspec.DecodeError:
                out.append((None, pos))
        return out or [(None, end)]  # no whole line (cut by hand): passed over, not re-read

    def set_aside(self, session_id: str) -> None:
        """Rename a log that is no regular file aside; the next change starts a new one."""
        self.fs.set_aside(self._path(session_id))

    def read(self, session_id: str, offset: int = 0) -> tuple[list[TurnRecord], int]:
        """The records from ``offset`` on, and the size of the whole lines read.

        A torn last line (no newline) is cut off: it was never answered. A line that is
        not a record (edited by hand) is logged and skipped; the file keeps its bytes.
        :class:`NotRegularFile` when the log is no regular file.
        """
        try:
            fd = self.fs.open(self._path(session_id), os.O_RDWR)
        except FileNotFoundError:
            return [], 0
        try:
            records: list[TurnRecord] = []
            end = offset
            for off, raw, complete in iter_lines(self.fs, fd, offset):
                if not complete:
                    self.fs.ftruncate(fd, off)
                    self.fs.fsync(fd)
                    break
                end = off + len(raw) + 1
                try:
                    records.append(_decode(raw))
                except msgspec.DecodeError as exc:
                    log.error(
                        "session %s: turn log byte %d is no turn change (%s)", session_id, off, exc
                    )
            return records, end
        finally:
            self.fs.close(fd)
