"""One session: everything the host holds of it, and every way its calls reach storage.

A :class:`Session` lives in the :class:`~host._store.Registry` from its creation (or the
start that found it) to its delete, which drops it whole: its transcript handle and
sizes, its rows' caches in memory (:class:`~host._index.RowCache`), what its checkpoint
holds, whether a recorded change waits to be made. A call reaches the transcript, the
index, the checkpoint, the turn log and the archive only through the session it holds
(its place at the head of the session's queue), from its first read to its last write.

Every write follows one order. Append: whole lines written, fsync, the answer, then the
index rows in a batch (see :mod:`host._index`); a failed write or fsync cuts the file
back. Every other change goes through the change engine (:mod:`host._intents`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from msgspec import Raw

from host._archive import Archive
from host._checkpoints import Checkpoint
from host._errors import StorageError
from host._fs import on_thread
from host._index import MetaRow, Row, RowCache, SessionRow, now_iso
from host._intents import Change
from host._messages import Message, display_capped, pager_json, valid_line
from host._recovery import quarantine, reconcile
from host._transcript import FileStamp, Piece, Transcript
from host._turnlog import TurnStatus

if TYPE_CHECKING:
    from host._store import Registry
    from host._watch import Watched

log = logging.getLogger("host.session")
T = TypeVar("T")
BIG_WRITE = 1 << 20  # durable writes and reads larger than this are made off the loop


@dataclass(slots=True, eq=False)
class Session:
    """One session and its state; its calls reach storage through it while they hold it."""

    id: str
    registry: Registry = field(repr=False)
    cache: RowCache = field(init=False, repr=False)
    transcript: Transcript | None = None
    """Open while it is served (the registry bounds how many are, and closes idle ones)."""
    line_count: int = 0
    size: int = 0
    has_checkpoint: bool = False  # a checkpoint file may be there
    checkpoint_of: tuple[str, str] | None = None
    """The (turn id, message id) of its checkpoint, once read or saved here: a 1 MB
    snapshot saved every few hundred milliseconds need not be read back to know."""
    unfinished: bool = False
    """A recorded change could not be made yet (the disk failed): made before it is served."""
    epoch: str | None = None
    """Its transcript's epoch as this process read or made it (:mod:`host._epochs`)."""
    watched: Watched | None = None
    """Its watchers and where its durable state stands for them, while it has any."""

    def __post_init__(self) -> None:
        self.cache = RowCache(self.id)

    @property
    def file(self) -> Transcript:
        """Its open transcript (a call holds the session, which its registry opened)."""
        assert self.transcript is not None, "a session is opened before it is used"
        return self.transcript

    @property
    def archive(self) -> Archive:
        """The revision archive (its own folder is ``revisions/<id>``)."""
        return self.registry.archive

    # -- rows -----------------------------------------------------------------------

    def lookup(self, message_id: str) -> Coroutine[Any, Any, Row | None]:
        return self.registry.index.lookup(self.id, message_id)

    def lookup_now(self, message_ids: Sequence[str]) -> dict[str, int]:
        return self.registry.index.lookup_now(self.cache, message_ids)

    def rows(self, start: int = 0, end: int | None = None) -> Coroutine[Any, Any, list[Row]]:
        return self.registry.index.rows(self.id, start, end)

    def last_user(self, before: int | None = None) -> Coroutine[Any, Any, Row | None]:
        return self.registry.index.last_user(self.id, before)

    def next_user_line(self, after: int) -> Coroutine[Any, Any, int | None]:
        return self.registry.index.next_user_line(self.id, after)

    def row(self) -> Coroutine[Any, Any, SessionRow | None]:
        return self.registry.index.session(self.id)

    async def write_meta(self, data: bytes, row: MetaRow) -> None:
        """Replace its ``meta.json`` with ``data`` (title and ``meta`` as ``row``): the
        index row marked first, synced, so a start after a cut reads the file again."""
        registry = self.registry
        await registry.index.mark_meta(self.id)
        await on_thread(registry.fs.write_atomic, registry.layout.meta(self.id), data)
        await registry.index.set_meta([row])

    # -- reads ----------------------------------------------------------------------

    async def read_rows(self, rows: Sequence[Row]) -> list[bytes]:
        """Read the stored lines of ``rows`` (contiguous, in order) with one read."""
        data, spans = await self._read_range(rows)
        return [data[a:b] for a, b in spans]

    async def read_row(self, row: Row) -> bytes:
        return (await self.read_rows([row]))[0]

    async def read_raw(self, rows: Sequence[Row]) -> list[Raw]:
        """:meth:`read_rows` as views of the one read, not copies (a page to answer)."""
        data, spans = await self._read_range(rows)
        view = memoryview(data)
        return [Raw(view[a:b]) for a, b in spans]

    async def _read_range(self, rows: Sequence[Row]) -> tuple[bytes, list[tuple[int, int]]]:
        """Read ``rows`` (contiguous, in order) with one read, each checked still a line;
        return the bytes and where each line is in them."""
        if not rows:
            return b"", []
        start = rows[0].offset
        data = await self._read(start, rows[-1].offset + rows[-1].length + 1 - start)
        ascii = data.isascii()  # then no line needs a UTF-8 decode (a copy) to check it
        spans = []
        with memoryview(data) as view:
            for r in rows:
                a = r.offset - start
                b = a + r.length
                if data[b : b + 1] != b"\n" or not valid_line(view[a:b], utf8=ascii):
                    await self._damaged(r.line)
                spans.append((a, b))
        return data, spans

    async def _read(self, offset: int, size: int) -> bytes:
        """Read ``size`` bytes of the transcript: off the loop past :data:`BIG_WRITE`."""
        if size > BIG_WRITE:
            return await on_thread(self.file.read, offset, size)
        return self.file.read(offset, size)

    async def _damaged(self, line: int) -> None:
        """A line changed on disk behind the host's back: rescan, quarantine, refuse."""
        log.error("session %s: line %d is damaged on disk: rescanning", self.id, line)
        self.registry.forget(self)
        await reconcile(self.registry, self.id, full=True)
        raise StorageError(
            f"line {line} of session {self.id!r} was damaged on disk; damaged lines"
            " were moved to its quarantine file: read again",
            sessionId=self.id,
        )

    async def read_capped(self, row: Row, cap: int, host_fields: dict[str, bytes]) -> bytes:
        """Read one stored line as its display-capped copy (:func:`display_capped`).

        The copy costs what it returns, not the line: the line is read (off the loop when
        big) but not scanned whole; what the copy holds is checked, and a line that proves
        not to be a message is damaged, as :meth:`read_rows` finds it.
        """
        data = await self._read(row.offset, row.length + 1)
        try:
            if data[-1:] != b"\n":
                raise ValueError("the line does not end where the index says")
            return display_capped(data, cap, host_fields)  # its newline is JSON space
        except ValueError:
            await self._damaged(row.line)
            raise  # pragma: no cover - _damaged always raises

    # -- appends --------------------------------------------------------------------

    async def append(self, lines: Sequence[NewLine], *, defer_index: bool = False) -> list[int]:
        """Append lines durably, then index them; return their line numbers.

        ``defer_index``: queue the rows for a batch commit after the answer instead (the
        transcript already holds the lines durably; a failed batch is reconciled).
        """
        if not lines:
            return []
        reg, t = self.registry, self.file
        data = b"".join(nl.data + b"\n" for nl in lines)
        rows = []
        pos = self.size
        for i, nl in enumerate(lines):
            rows.append(nl.row(self.line_count + i, pos))
            pos += len(nl.data) + 1
        count = self.line_count + len(lines)
        try:
            stamp = await reg.durably(len(data), _write_synced, t, data)
            reg.count("fsyncs")
            if not defer_index:
                await reg.index.append(self.cache, rows, stamp, count, now_iso())
        except BaseException:
            await on_thread(self._cut_back, self.size)
            raise
        if defer_index:
            reg.index.queue_append(self.cache, rows, stamp, count)
        self.size, self.line_count = pos, count
        reg.count("appends", len(rows))
        reg.watch.appended(self.id, lines, rows[0].line)
        return [r.line for r in rows]

    def _cut_back(self, size: int) -> None:
        try:
            self.file.cut(size)
        except OSError as exc:
            log.error("session %s: could not cut a failed append back: %s", self.id, exc)
        self.registry.forget(self)

    # -- changes (host._intents) ----------------------------------------------------

    async def rewrite(
        self, pieces: Sequence[Piece], rows: Sequence[Row], *, keep_from: int = 0
    ) -> None:
        """Replace the file by ``pieces`` and the rows from line ``keep_from`` by ``rows``."""
        await self.change(Change(self.id), self.prepare_file(pieces))
        await self.follow(rows, keep_from=keep_from)

    async def rewrite_line(self, row: Row, new: Row, data: bytes) -> None:
        """Rewrite exactly one line; every other line is copied byte for byte."""
        end = row.offset + row.length + 1
        await self.change(
            Change(self.id),
            self.prepare_file([(0, row.offset), data + b"\n", (end, self.size - end)]),
        )
        await self.follow_line(row, new, data)

    def prepare_file(self, pieces: Sequence[Piece]) -> Callable[[Change], None]:
        """What prepares the transcript replaced by ``pieces``, for :meth:`change`."""

        def prepare(change: Change) -> None:
            change.transcript = self.file.prepare(pieces)

        return prepare

    def reserve(self, offset: int, size: int) -> None:
        """Take the space for ``size`` bytes at ``offset`` of the transcript (blocking)."""
        self.registry.fs.reserve(self.file.fd, offset, size)

    async def change(
        self, change: Change, prepare: Callable[[Change], None], *, rewrites: bool = True
    ) -> None:
        """Make ``change`` (:mod:`host._intents`): the session marked dirty first (the index
        is rebuilt from the file after a crash), then ``prepare`` (blocking) writes its new
        files into ``change``, which is recorded, applied and finished in the same hop.

        An error before the record changes nothing. Past it the change is made: when the
        disk fails its apply, it is made before the session is served again. ``rewrites``:
        it replaces the transcript (else only the archive): the transcript's epoch ends.
        """
        reg = self.registry
        if rewrites:
            await reg.watch.before_change(self.id)  # its epoch ends first
        await reg.index.mark_dirty(self.id)

        def make() -> bool:
            reg.layout.transcript(self.id)  # its temp files go into no linked folder
            try:
                prepare(change)
            except BaseException:
                reg.intents.discard(change)
                raise
            try:
                done = reg.intents.commit(change)
            except BaseException:
                self.unfinished = reg.intents.recorded(self.id)
                raise
            if not done:  # set here, on the thread: a cancel of the call cannot lose it
                self.unfinished = True
            elif change.transcript is not None or change.cut is not None:
                self.file.reopen()
            return done

        try:
            done = await on_thread(make)
        except BaseException:  # the file may have changed: rebuilt from it before it is served
            self.lags()
            raise
        reg.count("rewrites")
        if not done:
            reg.forget(self)

    async def follow(self, rows: Sequence[Row], *, keep_from: int) -> None:
        """Make the index follow a change its file already holds: ``rows`` from line
        ``keep_from`` on, the rest of the rows gone.

        The change is made, so the call succeeds whatever the index does: one that cannot
        follow (a full disk fails its commit) lags, and the session is rebuilt from its file
        before it is served again, as after a failed batch of appends.
        """
        count = keep_from + len(rows)
        index = self.registry.index
        await self._follow(
            lambda st: index.replace_rows(self.cache, rows, st, count, now_iso(), keep_from),
            count,
        )

    async def follow_line(self, row: Row, new: Row, data: bytes) -> None:
        """:meth:`follow` a change of one line, ``row`` now ``new`` (``data``)."""
        delta, count, index = len(data) - row.length, self.line_count, self.registry.index
        await self._follow(
            lambda st: index.update_line(self.cache, new, delta, st, count, now_iso()), count
        )

    async def _follow(
        self, index: Callable[[FileStamp], Coroutine[Any, Any, None]], count: int
    ) -> None:
        if self.transcript is None:  # its change is not made yet: rebuilt once it is
            self.lags()
            return
        stamp = self.transcript.stamp()
        try:
            await index(stamp)
        except Exception as exc:
            log.error("session %s: the index did not follow a change (%s)", self.id, exc)
            self.lags()
            return
        self.size, self.line_count = stamp.size, count

    def lags(self) -> None:
        """Its files hold what its index does not (a full disk): it is rebuilt from them
        before it is served again (:meth:`Registry.open`), as after a failed batch."""
        self.registry.index.lag(self.cache)

    # -- turns ----------------------------------------------------------------------

    def turn(self, turn_id: str) -> str | None:
        return self.registry.index.turn(self.id, turn_id)

    def running_turn(self) -> Coroutine[Any, Any, str | None]:
        return self.registry.index.running_turn(self.id)

    def has_prompt(self, turn_id: str) -> Coroutine[Any, Any, bool]:
        return self.registry.index.has_prompt(self.id, turn_id)

    def prompt_stored(self, turn_id: str) -> Coroutine[Any, Any, None]:
        return self.registry.index.prompt_stored(self.id, turn_id)

    def record_turn(
        self, turn_id: str, status: TurnStatus, prompt_id: str | None = None
    ) -> Coroutine[Any, Any, None]:
        return self.registry.record_turn(self.id, turn_id, status, prompt_id)

    # -- checkpoint -----------------------------------------------------------------

    def checkpoint_holds(self, message_id: str) -> bool:
        """Whether its checkpoint is of ``message_id`` (no system call when it has none)."""
        if not self.has_checkpoint:
            return False
        try:
            ids = self.checkpoint_ids()
        except ValueError:
            return False  # a corrupt checkpoint is quarantined by its settlement, not here
        return ids is not None and ids[1] == message_id

    def checkpoint_ids(self) -> tuple[str, str] | None:
        """The (turn id, message id) of its checkpoint; ``ValueError`` when corrupt."""
        if self.has_checkpoint and self.checkpoint_of is None:
            self._read_checkpoint()
        return self.checkpoint_of

    def _read_checkpoint(self) -> Checkpoint | None:
        cp = self.registry.checkpoints.read(self.id)  # ValueError: corrupt
        if cp is None:
            self.has_checkpoint, self.checkpoint_of = False, None
        else:
            self.checkpoint_of = cp.turn_id, cp.message_id
        return cp

    def checkpoint(self) -> Checkpoint | None:
        """Its checkpoint; a corrupt one is quarantined and removed (blocking, small)."""
        if not self.has_checkpoint:
            return None
        try:
            return self._read_checkpoint()
        except ValueError as exc:
            checkpoints = self.registry.checkpoints
            raw = checkpoints.read_raw(self.id)
            quarantine(self.registry, self.id, [(-1, 0, raw, f"checkpoint file: {exc}")])
            checkpoints.remove(self.id)
            self.has_checkpoint, self.checkpoint_of = False, None
            return None

    async def save_checkpoint(self, turn_id: str, message_id: str, message: Raw) -> None:
        """Replace its checkpoint atomically (a failed swap may leave either file)."""
        self.has_checkpoint, self.checkpoint_of = True, None
        cps = self.registry.checkpoints
        await self.registry.durably(len(message), cps.save, self.id, turn_id, message)
        self.checkpoint_of = turn_id, message_id
        self.registry.watch.checkpoint(self.id, turn_id, message)

    async def remove_checkpoint(self) -> None:
        await on_thread(self.registry.checkpoints.remove, self.id)
        self.has_checkpoint, self.checkpoint_of = False, None


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


def timed(write: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``write(*args)``, and the seconds it took."""
    t0 = time.perf_counter()
    done = write(*args)
    return done, time.perf_counter() - t0
