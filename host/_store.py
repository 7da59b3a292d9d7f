"""The transcript store: each session's file and index rows kept in step.

Every write follows one order. Append: whole lines written, fsync, the answer, then the
index rows in a batch (see :mod:`host._index`); a failed write or fsync cuts the file
back. Rewrite: temp file, fsync, rename, folder fsync, then the index; a failed index
commit puts the old bytes back.
Callers hold the session's lock (see :mod:`host._locks`) around all of it.

A session whose file no longer matches what the index recorded (inode, size, mtime) is
reconciled before it is served: at start, and after any write that failed half-way.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from msgspec import Raw

from host._archive import Archive
from host._checkpoints import Checkpoint, Checkpoints
from host._errors import NotFound, StorageError
from host._fs import FileSystem
from host._index import Index, Row, now_iso
from host._intents import Intents
from host._layout import Layout, UnsafeFolder
from host._limits import OPEN_TRANSCRIPTS
from host._locks import LockTable
from host._messages import Message, display_capped, pager_json, valid_line
from host._recovery import quarantine, reconcile
from host._transcript import FileStamp, Piece, Rewrite, Transcript
from host._turnlog import TurnLog, TurnRecord, TurnStatus

log = logging.getLogger("host.store")
BIG_WRITE = 1 << 20  # durable writes larger than this are made off the loop
RATE = 256 << 20
"""Bytes a second a fast disk takes in: what a durable write's bytes are excused of its
time before it counts for :class:`FsyncPolicy` (a 1 MB replace's 2 ms is its bytes)."""
T = TypeVar("T")
ROOM_WAIT = 30.0
"""Seconds a call waits for an open transcript to close before it opens one more."""


@dataclass(slots=True, eq=False)
class OpenSession:
    """A session being served, which its call reaches storage through while it holds it:
    its transcript and size, its rows and turns in the index, and its checkpoint."""

    session_id: str
    transcript: Transcript
    line_count: int
    size: int
    store: Store = field(repr=False)

    # -- rows -----------------------------------------------------------------------

    def lookup(self, message_id: str) -> Coroutine[Any, Any, Row | None]:
        return self.store.index.lookup(self.session_id, message_id)

    def lookup_now(self, message_ids: Sequence[str]) -> dict[str, int]:
        return self.store.index.lookup_now(self.session_id, message_ids)

    def rows(self, start: int = 0, end: int | None = None) -> Coroutine[Any, Any, list[Row]]:
        return self.store.index.rows(self.session_id, start, end)

    def last_user(self, before: int | None = None) -> Coroutine[Any, Any, Row | None]:
        return self.store.index.last_user(self.session_id, before)

    def next_user_line(self, after: int) -> Coroutine[Any, Any, int | None]:
        return self.store.index.next_user_line(self.session_id, after)

    def mark_dirty(self) -> Coroutine[Any, Any, None]:
        return self.store.index.mark_dirty(self.session_id)

    def read_rows(self, rows: Sequence[Row]) -> Coroutine[Any, Any, list[bytes]]:
        return self.store.read_rows(self, rows)

    def read_raw(self, rows: Sequence[Row]) -> Coroutine[Any, Any, list[Raw]]:
        return self.store.read_raw(self, rows)

    async def read_row(self, row: Row) -> bytes:
        return (await self.store.read_rows(self, [row]))[0]

    def read_capped(
        self, row: Row, cap: int, host_fields: dict[str, bytes]
    ) -> Coroutine[Any, Any, bytes]:
        return self.store.read_capped(self, row, cap, host_fields)

    def append(
        self, lines: Sequence[NewLine], *, defer_index: bool = False
    ) -> Coroutine[Any, Any, list[int]]:
        return self.store.append(self, lines, defer_index=defer_index)

    def rewrite(
        self, pieces: Sequence[Piece], rows: Sequence[Row], *, keep_from: int = 0
    ) -> Coroutine[Any, Any, None]:
        return self.store.rewrite(self, pieces, rows, keep_from=keep_from)

    def rewrite_line(self, row: Row, new: Row, data: bytes) -> Coroutine[Any, Any, None]:
        return self.store.rewrite_line(self, row, new, data)

    # -- turns ----------------------------------------------------------------------

    def turn(self, turn_id: str) -> str | None:
        return self.store.index.turn(self.session_id, turn_id)

    def running_turn(self) -> Coroutine[Any, Any, str | None]:
        return self.store.index.running_turn(self.session_id)

    def has_prompt(self, turn_id: str) -> Coroutine[Any, Any, bool]:
        return self.store.index.has_prompt(self.session_id, turn_id)

    def prompt_stored(self, turn_id: str) -> Coroutine[Any, Any, None]:
        return self.store.index.prompt_stored(self.session_id, turn_id)

    def record_turn(
        self, turn_id: str, status: TurnStatus, prompt_id: str | None = None
    ) -> Coroutine[Any, Any, None]:
        return self.store.record_turn(self.session_id, turn_id, status, prompt_id)

    # -- checkpoint -----------------------------------------------------------------

    def checkpoint_holds(self, message_id: str) -> bool:
        """Whether its checkpoint is of ``message_id`` (no system call when it has none)."""
        if self.session_id not in self.store.checkpoints.present:
            return False
        try:
            ids = self.checkpoint_ids()
        except ValueError:
            return False  # a corrupt checkpoint is quarantined by its settlement, not here
        return ids is not None and ids[1] == message_id

    def checkpoint_ids(self) -> tuple[str, str] | None:
        """The (turn id, message id) of its checkpoint; ``ValueError`` when corrupt."""
        return self.store.checkpoints.ids(self.session_id)

    def checkpoint(self) -> Checkpoint | None:
        """Its checkpoint; a corrupt one is quarantined and removed (blocking, small)."""
        return self.store.read_checkpoint(self.session_id)

    async def save_checkpoint(self, turn_id: str, message_id: str, message: Raw) -> None:
        cps = self.store.checkpoints
        args = (self.session_id, turn_id, message_id, message)
        await self.store.durably(len(message), cps.save, *args)

    def remove_checkpoint(self) -> Coroutine[Any, Any, None]:
        return asyncio.to_thread(self.store.checkpoints.remove, self.session_id)


@dataclass(slots=True)
class NewLine:
    """A line to append: the stored bytes (no newline) and what the index keeps of it."""

    data: bytes
    message_id: str
    role: str
    turn_id: str | None
    status: str
    pager: str | None = None

    @classmethod
    def of(cls, msg: Message, turn_id: str | None, pager: dict[str, Raw] | None = None) -> NewLine:
        """Build the line for ``msg`` as the host stores it, with the stored ``pager``."""
        pager = pager or {}
        data = msg.stored_line(turn_id=turn_id, pager=pager)
        return cls(data, msg.id, msg.head.role, turn_id, msg.head.status, pager_json(pager))

    def row(self, line: int, offset: int) -> Row:
        return Row(
            line,
            self.message_id,
            offset,
            len(self.data),
            self.role,
            self.turn_id,
            self.status,
            self.pager,
        )


def _write_synced(transcript: Transcript, data: bytes) -> FileStamp:
    """Append ``data`` and fsync; return the file's stamp (an fsync changes none of it)."""
    transcript.write(data)
    stamp = transcript.stamp()
    transcript.sync()
    return stamp


def _timed(write: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``write(*args)``, and the seconds it took."""
    t0 = time.perf_counter()
    done = write(*args)
    return done, time.perf_counter() - t0


class FsyncPolicy:
    """Where durable writes run: on the loop while fsyncs are fast, else on a thread.

    A hop to a thread and back costs two wake-ups, the worker's and then the loop's; on a
    virtual machine that is 0.1 to 0.2 ms, as much as a fast fsync. An fsync on the loop
    holds up every other request while it runs (those that arrive meanwhile form the next
    group), so fsyncs stay on the loop only while their moving average is under
    :attr:`SLOW`: a slow disk moves them to a thread, where the loop serves other sessions.
    """

    SLOW = 0.002

    def __init__(self) -> None:
        self.average = 0.0

    @property
    def inline(self) -> bool:
        return self.average < self.SLOW

    def note(self, seconds: float) -> None:
        """Count a durable write whose latency (its time less its bytes') was ``seconds``."""
        self.average += (seconds - self.average) / 8


class Store:
    """Sessions' files and index rows, and the primitives every method is built from."""

    def __init__(
        self,
        layout: Layout,
        index: Index,
        fs: FileSystem | None = None,
        *,
        open_transcripts: int = OPEN_TRANSCRIPTS,
    ) -> None:
        self.layout = layout
        self.index = index
        self.fs = fs or FileSystem()
        self.locks = LockTable()
        self.archive = Archive(layout, self.fs)
        self.checkpoints = Checkpoints(layout, self.fs)
        self.intents = Intents(layout, self.fs, self.archive)
        self.turnlog = TurnLog(layout, self.fs)
        self._open: dict[str, OpenSession] = {}  # least recently used first
        self.open_transcripts = open_transcripts
        """How many transcripts are open at most: to open another, the least recently
        used idle one is closed, or the call waits for one to be idle (each holds a
        descriptor: 10,000 sessions must fit in ``ulimit -n 256``)."""
        self._opening = 0  # transcripts being opened (their room is taken)
        self._room: deque[asyncio.Future[None]] = deque()  # calls waiting to open one
        self.locks.on_free = self._free
        self.fsyncs = FsyncPolicy()
        self.counters: dict[str, int] = {}

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to a ``host.stats`` counter."""
        self.counters[name] = self.counters.get(name, 0) + n

    # -- sessions -------------------------------------------------------------------

    async def open_session(self, session_id: str) -> OpenSession:
        """Return the open session (call under its lock), or raise ``NotFound``."""
        lags = False  # its index lags its file: reconciled whatever the stamps say
        if self.index.stale:
            await self.index.settle()  # every queued row of this session is through
            if session_id in self.index.stale:
                self.index.reconciling(session_id)
                self.forget(session_id)  # its index lacks answered lines: reconcile
                lags = True
        if session_id in self.intents.unfinished:
            self.forget(session_id)
            await asyncio.to_thread(self.finish_change, session_id)
            lags = True
        s = self._open.pop(session_id, None)
        if s is not None:
            self._open[session_id] = s  # the most recently used now
            return s
        row = await self.index.session(session_id)
        if row is None:
            raise NotFound("session", session_id)
        await self._make_room()
        self._opening += 1
        try:
            transcript = Transcript(self.fs, self.layout.transcript(session_id))
        except FileNotFoundError:
            raise NotFound("session", session_id) from None
        finally:
            self._opening -= 1
        if lags or not row.matches(transcript.stamp()):
            # Changed behind the index's back (a write that failed half-way): the file is
            # the truth, so index it again, and reopen it (a quarantine replaces it).
            transcript.close()
            await reconcile(self, session_id, full=lags)
            row = await self.index.session(session_id)
            assert row is not None
            await self._make_room()
            transcript = Transcript(self.fs, self.layout.transcript(session_id))
        s = OpenSession(session_id, transcript, row.line_count, row.byte_size, self)
        self._open[session_id] = s
        return s

    def index_lags(self, session_id: str) -> None:
        """A change is made in the file but the index could not follow (a full disk): the
        session is rebuilt from its file before it is served again, as after a failed batch.
        """
        self.index.stale.add(session_id)
        self.forget(session_id)

    def finish_change(self, session_id: str) -> None:
        """Finish a change that failed past its point of no return (blocking).

        Its intent is on disk: its file steps are made as at a start (a manifest to commit,
        a cut to make), then it is removed; the caller has closed the session. ``OSError``
        while the disk still fails: the session stays unserved until then (or until the
        next start finishes it).
        """
        intent = self.intents.read(session_id)
        if intent is not None:
            self.intents.apply_to_transcript(intent)
            self.intents.finish(intent)
            log.warning("session %s: a change cut short by the disk is finished", session_id)
        self.intents.unfinished.discard(session_id)

    async def _make_room(self) -> None:
        """Return once a transcript may be opened within :attr:`open_transcripts`.

        The least recently used idle session's is closed for it: only a session no call
        holds, since a call keeps its ``OpenSession`` (and a rewrite its old descriptor)
        from its first read to its last write; a call only queued for it opens it again
        when its turn comes. When every open one is held, wait (in turn) until one is let
        go: a call holding a session never waits for anything but the disk and the index,
        so one soon is. Bounded, and said so: past :data:`ROOM_WAIT` the transcript is
        opened anyway.
        """
        while len(self._open) + self._opening >= self.open_transcripts:
            victim = next((sid for sid in self._open if not self.locks.held(sid)), None)
            if victim is not None:  # least recently used first: most often the very first
                self.forget(victim)
                self.count("transcripts.closed")
                continue
            turn = asyncio.get_running_loop().create_future()
            self._room.append(turn)
            try:
                async with asyncio.timeout(ROOM_WAIT):
                    await turn
            except TimeoutError:
                log.warning(
                    "%d transcripts open and busy for %.0f s: opening one more",
                    len(self._open),
                    ROOM_WAIT,
                )
                return
            finally:
                if turn in self._room:
                    self._room.remove(turn)

    def _free(self, session_id: str) -> None:
        """A session's holder left: a call waiting for room may close it now."""
        if session_id in self._open:
            self._next_room()

    def _next_room(self) -> None:
        while self._room:
            turn = self._room.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    def is_open(self, s: OpenSession) -> bool:
        """Whether ``s`` is still the served state (a failed undo forgets it)."""
        return self._open.get(s.session_id) is s

    @property
    def open_count(self) -> int:
        """How many transcripts are open."""
        return len(self._open)

    def forget(self, session_id: str) -> None:
        """Close a session's file; it is reopened (and reconciled if need be) on next use."""
        s = self._open.pop(session_id, None)
        if s is not None:
            s.transcript.close()
            self._next_room()

    def close(self) -> None:
        """Close every open transcript."""
        for sid in list(self._open):
            self.forget(sid)

    # -- reads ----------------------------------------------------------------------

    async def read_rows(self, s: OpenSession, rows: Sequence[Row]) -> list[bytes]:
        """Read the stored lines of ``rows`` (contiguous, in order) with one read."""
        data, spans = await self._read_range(s, rows)
        return [data[a:b] for a, b in spans]

    async def read_raw(self, s: OpenSession, rows: Sequence[Row]) -> list[Raw]:
        """:meth:`read_rows` as views of the one read, not copies (a page to answer)."""
        data, spans = await self._read_range(s, rows)
        view = memoryview(data)
        return [Raw(view[a:b]) for a, b in spans]

    async def _read_range(
        self, s: OpenSession, rows: Sequence[Row]
    ) -> tuple[bytes, list[tuple[int, int]]]:
        """Read ``rows`` (contiguous, in order) with one read, each checked still a line;
        return the bytes and where each line is in them."""
        if not rows:
            return b"", []
        start = rows[0].offset
        data = await self._read(s, start, rows[-1].offset + rows[-1].length + 1 - start)
        ascii = data.isascii()  # then no line needs a UTF-8 decode (a copy) to check it
        spans = []
        with memoryview(data) as view:
            for r in rows:
                a = r.offset - start
                b = a + r.length
                if data[b : b + 1] != b"\n" or not valid_line(view[a:b], utf8=ascii):
                    await self._damaged(s, r.line)
                spans.append((a, b))
        return data, spans

    @staticmethod
    async def _read(s: OpenSession, offset: int, size: int) -> bytes:
        """Read ``size`` bytes of the transcript: off the loop past :data:`BIG_WRITE`."""
        if size > BIG_WRITE:
            return await asyncio.to_thread(s.transcript.read, offset, size)
        return s.transcript.read(offset, size)

    async def _damaged(self, s: OpenSession, line: int) -> None:
        """A line changed on disk behind the host's back: rescan, quarantine, refuse."""
        log.error("session %s: line %d is damaged on disk: rescanning", s.session_id, line)
        self.forget(s.session_id)
        await reconcile(self, s.session_id, full=True)
        raise StorageError(
            f"line {line} of session {s.session_id!r} was damaged on disk; damaged lines"
            " were moved to its quarantine file: read again",
            sessionId=s.session_id,
        )

    def read_checkpoint(self, session_id: str) -> Checkpoint | None:
        """A session's checkpoint; a corrupt one is quarantined and removed (blocking)."""
        try:
            return self.checkpoints.read(session_id)
        except ValueError as exc:
            raw = self.checkpoints.read_raw(session_id)
            quarantine(self, session_id, [(-1, 0, raw, f"checkpoint file: {exc}")])
            self.checkpoints.remove(session_id)
            return None

    async def read_capped(
        self, s: OpenSession, row: Row, cap: int, host_fields: dict[str, bytes]
    ) -> bytes:
        """Read one stored line as its display-capped copy (:func:`display_capped`).

        The copy costs what it returns, not the line: the line is read (off the loop when
        big) but not scanned whole; what the copy holds is checked, and a line that proves
        not to be a message is damaged, as :meth:`read_rows` finds it.
        """
        data = await self._read(s, row.offset, row.length + 1)
        try:
            if data[-1:] != b"\n":
                raise ValueError("the line does not end where the index says")
            return display_capped(data, cap, host_fields)  # its newline is JSON space
        except ValueError:
            await self._damaged(s, row.line)
            raise  # pragma: no cover - _damaged always raises

    # -- writes ---------------------------------------------------------------------

    async def append(
        self, s: OpenSession, lines: Sequence[NewLine], *, defer_index: bool = False
    ) -> list[int]:
        """Append lines durably, then index them; return their line numbers.

        ``defer_index``: queue the rows for a batch commit after the answer instead (the
        transcript already holds the lines durably; a failed batch is reconciled).
        """
        if not lines:
            return []
        offset = s.size
        data = b"".join(nl.data + b"\n" for nl in lines)
        rows, pos = self._rows(s, lines)
        count = s.line_count + len(lines)
        try:
            stamp = await self.durably(len(data), _write_synced, s.transcript, data)
            self.count("fsyncs")
            if not defer_index:
                await self.index.append(s.session_id, rows, stamp, count, now_iso())
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self._cut_back, s, offset))
            raise
        if defer_index:
            self.index.queue_append(s.session_id, rows, stamp, count)
        s.size = pos
        s.line_count = count
        self.count("appends", len(rows))
        return [r.line for r in rows]

    async def durably(self, size: int, write: Callable[..., T], *args: Any) -> T:
        """Run a durable write of ``size`` bytes: on the loop up to :data:`BIG_WRITE` while
        fsyncs are fast (:class:`FsyncPolicy`), else on a thread.

        Every one is timed for the policy, where it runs, less what its bytes take at
        :data:`RATE`: what is left is the disk's latency (a 1 MB checkpoint takes 2 ms on a
        disk whose fsync takes 0.2, and counted whole it sent every write to a thread). So
        a disk that turns slow while a reply sends only big snapshots is still learned, and
        so is one fast again.
        """
        if self.fsyncs.inline and size <= BIG_WRITE:
            done, took = _timed(write, *args)
        else:  # timed on the thread: a busy loop's delay in taking it back is not the disk's
            done, took = await asyncio.to_thread(_timed, write, *args)
        self.fsyncs.note(max(0.0, took - size / RATE))
        return done

    async def record_turn(
        self, session_id: str, turn_id: str, status: TurnStatus, prompt_id: str | None = None
    ) -> None:
        """Log a turn change durably (the answer's fsync), then apply it to the index.

        When the index refuses it, the log's line is taken back: a failed call changes
        nothing (and if even that fails, the next start replays the line: it is durable).
        """
        rec = TurnRecord(turn_id, status, now_iso(), prompt_id)
        before, after = await self.durably(0, self.turnlog.append, session_id, rec)
        try:
            await self.index.record_turns(session_id, [rec], after)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self._take_back_turn, session_id, before))
            raise

    def _take_back_turn(self, session_id: str, size: int) -> None:
        try:
            self.turnlog.cut(session_id, size)
        except OSError as exc:
            log.error("session %s: a failed turn change stays in its log: %s", session_id, exc)

    @staticmethod
    def _rows(s: OpenSession, lines: Sequence[NewLine]) -> tuple[list[Row], int]:
        """The index rows of ``lines`` appended to ``s``, and the file's size after them."""
        rows = []
        pos = s.size
        for i, nl in enumerate(lines):
            rows.append(nl.row(s.line_count + i, pos))
            pos += len(nl.data) + 1
        return rows, pos

    def _cut_back(self, s: OpenSession, size: int) -> None:
        try:
            s.transcript.cut(size)
        except OSError as exc:
            log.error("session %s: could not cut a failed append back: %s", s.session_id, exc)
        self.forget(s.session_id)

    async def rewrite(
        self,
        s: OpenSession,
        pieces: Sequence[Piece],
        rows: Sequence[Row],
        *,
        keep_from: int = 0,
    ) -> None:
        """Replace the file by ``pieces`` and the rows from line ``keep_from`` by ``rows``."""
        line_count = keep_from + len(rows)
        stamp = await self._rewrite(
            s,
            pieces,
            lambda st: self.index.replace_rows(
                s.session_id, rows, st, line_count, now_iso(), keep_from=keep_from
            ),
        )
        s.size, s.line_count = stamp.size, line_count

    async def rewrite_line(self, s: OpenSession, row: Row, new: Row, data: bytes) -> None:
        """Rewrite exactly one line; every other line is copied byte for byte."""
        end = row.offset + row.length + 1
        pieces: list[Piece] = [(0, row.offset), data + b"\n", (end, s.size - end)]
        delta = len(data) - row.length
        stamp = await self._rewrite(
            s,
            pieces,
            lambda st: self.index.update_line(
                s.session_id, new, delta, st, s.line_count, now_iso()
            ),
        )
        s.size = stamp.size

    async def _rewrite(
        self,
        s: OpenSession,
        pieces: Sequence[Piece],
        index: Callable[[FileStamp], Coroutine[Any, Any, None]],
    ) -> FileStamp:
        """The session marked dirty, its file replaced by ``pieces``, then ``index`` given
        the new file's stamp; when the index refuses, the old file is put back."""
        await self.index.mark_dirty(s.session_id)
        rw = await asyncio.to_thread(self._rewrite_file, s, pieces)
        self.count("rewrites")
        try:
            stamp = s.transcript.stamp()
            await index(stamp)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self._undo, s, rw))
            raise
        rw.commit()
        return stamp

    def _rewrite_file(self, s: OpenSession, pieces: Sequence[Piece]) -> Rewrite:
        self.layout.transcript(s.session_id)  # its temp file goes into no linked folder
        self.intents.settle(s.session_id)  # never a stale intent over a rewritten file
        return s.transcript.rewrite(pieces)

    def cut_file(self, s: OpenSession, size: int) -> None:
        """Cut the transcript to ``size`` bytes: a plain truncation (blocking)."""
        self.intents.settle(s.session_id)  # never a stale intent over a shortened file
        s.transcript.cut(size)

    def _undo(self, s: OpenSession, rw: Rewrite) -> None:
        try:
            rw.undo()
        except OSError as exc:
            log.error("session %s: could not undo a failed rewrite: %s", s.session_id, exc)
            self.forget(s.session_id)

    def bury(self, session_id: str) -> None:
        """Rename the session's transcript aside, durably: the commit of its delete.

        A session is its transcript. When the folder's fsync fails, the name is put back.
        """
        transcript, buried = self.layout.transcript(session_id), self.layout.buried(session_id)
        self.fs.rename(transcript, buried)
        try:
            self.fs.fsync_dir(self.layout.sessions)
        except BaseException:
            self.unbury(session_id)
            raise

    def unbury(self, session_id: str) -> None:
        """Undo :meth:`bury` (its index rows could not be deleted)."""
        self.fs.rename(self.layout.buried(session_id), self.layout.transcript(session_id))
        self.fs.fsync_dir(self.layout.sessions)

    def remove_files(self, session_id: str) -> None:
        """Remove every file of a session, transcript first; not fsynced.

        After :meth:`bury` this is tidying: what a crash or a power cut leaves of a buried
        session goes at the next start (:meth:`remove_leftovers`), never to be read as a
        new session's of the same id. After a failed create, a power cut may bring the
        new session back: a failed call may leave the new state.
        """
        self.checkpoints.forget(session_id)  # first: an unlink may fail
        for path in [*self.layout.session_files(session_id), self.layout.quarantine(session_id)]:
            self.fs.unlink(path)
        try:  # rmtree follows no link inside, but would go through a linked folder above
            folder = self.layout.checked(self.layout.revisions(session_id))
        except UnsafeFolder as exc:
            log.warning("session %s: its archive is left alone: %s", session_id, exc)
            return
        shutil.rmtree(folder, ignore_errors=True)

    def remove_leftovers(self) -> None:
        """Remove the files of sessions whose transcript is gone (start-up, before serving).

        Not fsynced: what a power cut brings back is removed again at the next start.
        """
        for sid, path in self.layout.leftovers():
            self.checkpoints.forget(sid)
            self.fs.unlink(path)
            log.warning("session %s: %s removed: its transcript is gone", sid, path)
