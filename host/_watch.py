"""Watches: clients follow a session as it changes, and resume from a cursor.

A watcher gets ``session.event`` notifications for one session, in the order its changes
were applied, each with the cursor just after it. A *cursor* is a position in what is on
disk, ``epoch.lines.turns.checkpoint``: the transcript's epoch (:mod:`host._epochs`) and
line count, the turn log's byte size, and a tag (CRC-32) of the checkpoint the watcher
was sent. So a cursor outlives the connection and the process: ``session.watch`` with
``after`` replays from the files what came after it (lines, then turn changes, then the
checkpoint), then goes live. A watcher's events are exactly what follows its cursor,
once, in order; when that cannot be (the transcript was rewritten, the cursor's epoch is
gone, its client fell too far behind) its last event is ``reset``, with the cursor to go
on from (docs/protocol.md, "Watching").

Three parts:

- :class:`WatchHub`, the registry's (``Registry.watch``, its :class:`~host._epochs.Epochs`):
  the hooks a :class:`~host._session.Session` calls where a change is applied, the three
  methods, and the replays. What it knows of a watched session is the session's own
  (:class:`Watched`, ``Session.watched``).
- :class:`Outlet`, one per connection that watches: each of its watchers' queue of
  events, handed to the connection (behind its answers) only while its client takes them.
  Bounded: a watcher past its bound is dropped (``reset``, ``overflow``), so a client that
  does not read never slows a writer or another watcher.
- :class:`Watcher`: one watch.

A hook only notes the change (its cursor and its event, not encoded) on its session, with
the watchers live then: when the call lets go of the session, the fan-out runs after its
answer is written, in one pass of the loop, each change encoded once for all its watchers,
each connection handed its lines in one write (at once past ``DRAIN_STEP``). A watcher
catching up holds its session only to read a chunk, and reads it only once its connection
handed on everything before, one catch-up of a connection at a time: the files are its
buffer, not memory, and a client that takes nothing makes the host read nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgspec
from msgspec import UNSET, Raw

from host._epochs import Epochs
from host._errors import Internal, InvalidParams, LimitExceeded, NotFound
from host._fs import on_thread
from host._limits import (
    DRAIN_STEP,
    LIVE_DATA,
    REPLAY_CHUNK,
    WATCH_BYTES,
    WATCH_EVENTS,
    WATCH_QUEUE,
    WATCHERS_PER_SESSION,
    WATCHES_PER_CONNECTION,
)
from host._turnlog import TurnRecord
from host._wire import (
    ENCODER,
    AppendedEvent,
    CheckpointEvent,
    DeletedEvent,
    Event,
    LiveEvent,
    PublishParams,
    PublishResult,
    ResetEvent,
    TurnEvent,
    UnwatchParams,
    UnwatchResult,
    WatchParams,
    WatchResult,
)

if TYPE_CHECKING:
    from host._session import NewLine, Session
    from host._store import Registry

log = logging.getLogger("host.watch")
ROWS_PER_READ = 256  # lines a catching-up watcher reads in one hold, at most
_HEAD = b'{"jsonrpc":"2.0","method":"session.event","params":{"watchId":'


class Cursor(NamedTuple):
    """A position in what a session holds on disk (see the module's doc)."""

    epoch: str
    lines: int
    turns: int
    tag: int

    def text(self) -> str:
        return f"{self.epoch}.{self.lines}.{self.turns}.{self.tag}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """Read a cursor the wire type's pattern let through (``host._wire.Cursor``)."""
        epoch, lines, turns, tag = text.split(".")
        return cls(epoch, int(lines), int(turns), int(tag))


def tag_of(message: bytes | memoryview | Raw) -> int:
    """The checkpoint tag of a message's bytes: never 0, which means "none"."""
    return zlib.crc32(memoryview(message)) or 1


def _tail(cursor: Cursor, event: Event) -> bytes:
    """What follows the ``watchId`` in a ``session.event`` line, newline included: the
    same for every watcher of one change, so made once for them all."""
    return b"".join(
        (b',"cursor":"', cursor.text().encode(), b'","event":', ENCODER.encode(event), b"}}\n")
    )


class Connection(Protocol):
    """What an outlet needs of its connection (``host._endpoint.Connection`` is one): it
    tells the outlet when its client stops taking lines, takes them again, or leaves."""

    outlet: Any

    @property
    def writable(self) -> bool: ...
    def notify(self, data: bytes) -> None: ...


class Watcher:
    """One watch of one session by one connection."""

    __slots__ = (
        "delivered",
        "ending",
        "head",
        "id",
        "outlet",
        "pos",
        "queue",
        "queued",
        "session_id",
        "task",
    )

    def __init__(self, wid: str, session_id: str, outlet: Outlet, start: Cursor) -> None:
        self.id = wid
        self.head = _HEAD + ENCODER.encode(wid)  # its lines' start
        self.session_id = session_id
        self.outlet = outlet
        self.queue: deque[tuple[bytes, Cursor]] = deque()  # (tail, cursor after it)
        self.queued = 0  # bytes of its lines in queue
        self.pos = start  # after the last event queued
        self.delivered = start  # after the last event handed to the connection
        self.ending = False  # its last event is queued: gone once that is written
        self.task: asyncio.Task[None] | None = None  # its catch-up from the files


class Outlet:
    """One connection's watchers and their queues (see the module's doc)."""

    def __init__(self, conn: Connection, hub: WatchHub) -> None:
        self.conn = conn
        self.hub = hub
        self.watchers: dict[str, Watcher] = {}
        self.ready: deque[Watcher] = deque()  # with lines queued, in turn
        self.parts: list[bytes] = []  # lines of watchers with none queued, for one write
        self.size = 0  # ... and their bytes
        self.open = conn.writable  # its client takes more (kept by the connection's hooks)
        self.scheduled = False
        self.closed = False
        self.starting = 0  # session.watch calls not yet answered (their places are taken)
        self.reading = asyncio.Lock()  # one catch-up of the connection reads at a time
        self.waiter: asyncio.Future[None] | None = None  # that one, waiting for room

    def push(self, w: Watcher, tail: bytes, cursor: Cursor, *, bounded: bool = True) -> None:
        """Queue an event for ``w``; past its bound, drop what it has queued (a reset).

        Only what waits for a client that takes no more is bounded: a burst (a group
        commit's events) for one that reads is handed on in the same pass, and a
        catch-up's chunk (``bounded=False``) is read only into an empty queue.
        """
        if w.ending:
            return
        size = len(w.head) + len(tail)
        w.queue.append((tail, cursor))
        w.queued += size
        self.hub.queued += size
        w.pos = cursor
        if len(w.queue) == 1:
            self.ready.append(w)
        if (
            bounded
            and not self.open
            and len(w.queue) > 1
            and (w.queued > WATCH_QUEUE or len(w.queue) > WATCH_EVENTS)
        ):
            self.overflow(w)
        elif self.hub.queued > WATCH_BYTES:
            self.hub.shed()
        if not self.scheduled and not self.closed:
            self.scheduled = True
            self.hub.outlets.append(self)

    def flush(self) -> None:
        """Write the lines handed straight on (a connection paused by it stops taking them)."""
        if self.parts:
            data, self.parts, self.size = b"".join(self.parts), [], 0
            self.conn.notify(data)

    def end(self, w: Watcher, event: Event, cursor: Cursor) -> None:
        """Queue ``w``'s last event: nothing more is queued for it."""
        self.hub.detach(w)
        self.push(w, _tail(cursor, event), cursor, bounded=False)
        w.ending = True
        self.hub.fan_out_soon()

    def overflow(self, w: Watcher) -> None:
        """Drop ``w``'s queued events; its last is a reset to resume from what it was given."""
        log.info("watch %s of %s: its client fell behind: reset (overflow)", w.id, w.session_id)
        self.hub.registry.count("watch.overflows")
        self._drop_queue(w)
        self.end(w, ResetEvent(reason="overflow", total_lines=w.delivered.lines), w.delivered)

    def _drop_queue(self, w: Watcher) -> None:
        self.hub.queued -= w.queued
        w.queue.clear()
        w.queued = 0
        if w in self.ready:
            self.ready.remove(w)
            self._wake()

    def drain(self) -> None:
        """Hand queued lines to the connection in one write, a watcher at a time, while
        its client takes more."""
        self.scheduled = False
        if not self.open:
            return
        out: list[bytes] = []
        sent = 0
        while self.ready and sent < DRAIN_STEP:
            w = self.ready.popleft()
            tail, w.delivered = w.queue.popleft()
            out += (w.head, tail)
            size = len(w.head) + len(tail)
            w.queued -= size
            self.hub.queued -= size
            sent += size
            if w.queue:
                self.ready.append(w)
            elif w.ending:
                self.watchers.pop(w.id, None)
        if out:
            self.conn.notify(b"".join(out))
        if self.ready:  # more than a step: the next pass goes on (or the writable hook)
            self.scheduled = True
            self.hub.outlets.append(self)
            self.hub.fan_out_soon()
        self._wake()

    async def room(self, w: Watcher) -> None:
        """Return once nothing of the connection's watchers waits to be handed on and its
        client takes more: a catch-up (holding :attr:`reading`) reads a chunk then."""
        while self.ready or not self.open:
            if self.closed or w.ending:
                raise asyncio.CancelledError("the watch ended")
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done() and not self.ready and self.open:
            self.waiter.set_result(None)

    def paused(self) -> None:
        """The client takes no more for now: what its watchers are sent waits, bounded."""
        self.open = False

    def writable(self) -> None:
        """The client reads again: go on."""
        self.open = True
        if self.ready and not self.scheduled:
            self.scheduled = True
            self.hub.outlets.append(self)
            self.hub.fan_out_soon()
        self._wake()

    def remove(self, w: Watcher) -> None:
        """End ``w`` without an event (``session.unwatch``, the connection gone)."""
        self.hub.detach(w)
        self._drop_queue(w)
        self.watchers.pop(w.id, None)
        w.ending = True
        if w.task is not None:
            w.task.cancel()

    def gone(self) -> None:
        """The client left, or its input ended: every watch of it ends."""
        self.closed = True
        self.open = False
        for w in list(self.watchers.values()):
            self.remove(w)


class Watched:
    """A watched session: where its durable state stands, and who watches it."""

    __slots__ = ("epoch", "lines", "live", "noted", "settling", "tag", "turns", "watchers")

    def __init__(self, epoch: str, lines: int, turns: int, tag: int) -> None:
        self.epoch = epoch
        self.lines = lines
        self.turns = turns
        self.tag = tag
        self.watchers: list[Watcher] = []
        self.live: list[Watcher] = []
        """Those told of each change (the others catch up from the files). Both lists are
        replaced, never changed in place: a change noted goes to the watchers live then."""
        self.settling = False
        self.noted: list[tuple[list[Watcher], Cursor, Event]] = []
        """Its changes noted while a call holds it: fanned out once that call lets go."""

    def cursor(self) -> Cursor:
        return Cursor(self.epoch, self.lines, self.turns, self.tag)


class WatchHub(Epochs):
    """Every watch of one host: the methods, the sessions' hooks, the catch-ups."""

    def __init__(self, registry: Registry) -> None:
        super().__init__(registry.layout, registry.fs, registry.sessions)
        self.registry = registry
        self.queued = 0  # event bytes queued in every outlet
        self.notes: list[tuple[list[Watcher], Cursor, Event]] = []  # changes to fan out
        self.outlets: deque[Outlet] = deque()  # with lines to hand on, in turn
        self._soon = False
        self.tasks: set[asyncio.Task[None]] = set()
        self._ids = 0

    # -- the sessions' hooks: what happened to a session ------------------------------

    def _note(self, session_id: str) -> Watched | None:
        """The watched session, if its epoch still stands (else it waits for its reset)."""
        s = self.sessions.get(session_id)
        st = s.watched if s is not None else None
        if st is None or s is None or s.epoch != st.epoch:
            return None
        return st

    def appended(self, session_id: str, lines: Sequence[NewLine], first_line: int) -> None:
        """Lines were appended durably (not yet answered), from line ``first_line`` on."""
        if (st := self._note(session_id)) is None:
            return
        for i, nl in enumerate(lines, first_line):
            st.lines = i + 1
            self._emit(st, AppendedEvent(line=i, message=Raw(nl.data)))

    def turn(self, session_id: str, record: TurnRecord, log_size: int) -> None:
        """A turn change was logged durably; the log is ``log_size`` bytes now."""
        if (st := self._note(session_id)) is None:
            return
        st.turns = log_size
        self._emit(st, _turn_event(record))

    def checkpoint(self, session_id: str, turn_id: str, message: Raw) -> None:
        """A checkpoint was installed durably."""
        if (st := self._note(session_id)) is None:
            return
        st.tag = tag_of(message)
        self._emit(st, CheckpointEvent(turn_id=turn_id, message=message))

    def deleted(self, s: Session) -> None:
        """The session was deleted (its epoch was forgotten before)."""
        st, s.watched = s.watched, None
        if st is not None:
            self._out(st)  # what was noted before goes first
            self.fan_out()
            for w in st.watchers:
                w.outlet.end(w, DeletedEvent(), w.pos)

    def _emit(self, st: Watched, event: Event) -> None:
        """Note a change for its watchers: fanned out once its call lets go of the session
        (:meth:`released`), so after that call's answer."""
        if st.live:
            st.noted.append((st.live, st.cursor(), event))

    def _out(self, st: Watched) -> None:
        """Hand the session's noted changes to the next fan-out."""
        if st.noted:
            self.notes += st.noted
            st.noted = []
            self.fan_out_soon()

    def released(self, session_id: str) -> None:
        """A call let go of the session: its changes go out (after its answer, written in
        the next pass), and if its epoch ended meanwhile, its watchers are reset."""
        s = self.sessions.get(session_id)
        st = s.watched if s is not None else None
        if st is not None:
            self._out(st)
        if s is None or st is None or st.settling or s.epoch == st.epoch:
            return
        st.settling = True
        self._spawn(self._settle(session_id))

    # -- the fan-out ------------------------------------------------------------------

    def fan_out_soon(self) -> None:
        """Fan out in a pass of the loop after the one that made the changes (so after
        the answers written then, which a call's answer schedules in its own pass)."""
        if not self._soon:
            self._soon = True
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self.fan_out)

    def fan_out(self) -> None:
        """Hand each noted change to its watchers, encoded once, then each connection its
        lines in one write: straight on for a watcher with nothing queued whose client
        takes more (the common case, and the cheap one), else through its queue."""
        self._soon = False
        notes, self.notes = self.notes, []
        direct: list[Outlet] = []
        for watchers, cursor, event in notes:
            tail = _tail(cursor, event)
            for w in watchers:
                o = w.outlet
                if o.open and not w.queue and not w.ending:
                    if not o.parts:
                        direct.append(o)
                    o.parts += (w.head, tail)
                    o.size += len(w.head) + len(tail)
                    w.pos = w.delivered = cursor
                    if o.size >= DRAIN_STEP:  # written now: a client that reads no more
                        o.flush()  # pauses it, and the rest of a burst waits, bounded
                else:
                    o.push(w, tail, cursor)  # behind what it has queued (or not at all)
        for o in direct:
            o.flush()
        for _ in range(len(self.outlets)):
            self.outlets.popleft().drain()

    # -- methods ----------------------------------------------------------------------

    async def watch(self, p: WatchParams, origin: Any = None) -> WatchResult:
        """``session.watch``: see docs/protocol.md, "Watching".

        Its place among the connection's watches is taken before it waits for its session:
        a client that sends many at once gets no more than one at a time would.
        """
        outlet = self._outlet(origin)
        if len(outlet.watchers) + outlet.starting >= WATCHES_PER_CONNECTION:
            raise LimitExceeded(
                f"a connection may hold {WATCHES_PER_CONNECTION} watches at once",
                limit=WATCHES_PER_CONNECTION,
            )
        outlet.starting += 1
        try:
            return await self._watch(outlet, p)
        finally:
            outlet.starting -= 1

    async def _watch(self, outlet: Outlet, p: WatchParams) -> WatchResult:
        sid = p.session_id
        s = await self.registry.open(sid)
        epoch = await self._epoch(sid)
        after = None if isinstance(p.after, msgspec.UnsetType) else self._after(sid, p.after, epoch)
        st = self._watched(s, epoch)
        now = st.cursor()
        start = Cursor(epoch, now.lines, 0, 0) if after is None else after
        self._ids += 1
        w = Watcher(f"w{self._ids}", sid, outlet, start)
        if outlet.closed:  # its input ended: the watch ends with it, at once
            if not st.watchers:
                s.watched = None
        elif start.epoch != epoch or start.lines > now.lines or start.turns > now.turns:
            outlet.watchers[w.id] = w
            start = Cursor(epoch, now.lines, 0, 0)
            outlet.end(w, ResetEvent(reason="expired", total_lines=now.lines), start)
            if not st.watchers:
                s.watched = None
            self.registry.count("watch.expired")
        else:
            outlet.watchers[w.id] = w
            st.watchers = [*st.watchers, w]
            self.registry.count("watch.started")
            if start.lines == now.lines and start.turns == now.turns:
                self._go_live(w, s, st)
            else:
                w.task = self._spawn(self._catch_up(w))
        return WatchResult(watch_id=w.id, cursor=start.text(), total_lines=start.lines)

    def _after(self, sid: str, text: str, epoch: str) -> Cursor:
        """The cursor ``text``, or ``INVALID_PARAMS`` for one the host could not have given."""
        after = Cursor.parse(text)
        if after.tag > 0xFFFFFFFF:
            raise InvalidParams("cursor: its checkpoint tag is no CRC-32 (not one the host gave)")
        if after.epoch == epoch and not self.registry.turnlog.ends_a_record(sid, after.turns):
            raise InvalidParams("cursor: its turn offset is inside a record of the turn log")
        return after

    def _watched(self, s: Session, epoch: str) -> Watched:
        """The session's watch state at ``epoch``, made if it has none, with room for one
        more watcher (else ``LIMIT_EXCEEDED``)."""
        st = s.watched
        if st is not None and st.epoch != epoch:
            self._reset_all(st, s, epoch)  # its rewrite's reset had not gone out yet
            st = None
        if st is None:
            st = s.watched = Watched(epoch, s.line_count, *self._turns_tag(s))
        if len(st.watchers) >= WATCHERS_PER_SESSION:
            raise LimitExceeded(
                f"a session may have {WATCHERS_PER_SESSION} watchers at once",
                limit=WATCHERS_PER_SESSION,
            )
        return st

    async def unwatch(self, p: UnwatchParams, origin: Any = None) -> UnwatchResult:
        """``session.unwatch``: end one of this connection's watches (never a turn)."""
        outlet = self._outlet(origin)
        w = outlet.watchers.get(p.watch_id)
        if w is None or w.ending:
            return UnwatchResult(unwatched=False)
        outlet.remove(w)
        return UnwatchResult(unwatched=True)

    async def publish(self, p: PublishParams) -> PublishResult:
        """``session.publish``: hand ``data`` to the session's watchers, stored nowhere."""
        if len(p.data) > LIVE_DATA:
            raise LimitExceeded(
                f"session.publish: data of {len(p.data)} bytes is over {LIVE_DATA}",
                limit=LIVE_DATA,
            )
        if (st := self._note(p.session_id)) is None:
            return PublishResult(watchers=0)
        self._emit(st, LiveEvent(turn_id=p.turn_id, data=p.data))
        return PublishResult(watchers=len(st.live))

    # -- helpers ------------------------------------------------------------------------

    def _outlet(self, conn: Any) -> Outlet:
        if conn is None:
            raise Internal("a watch needs the connection that asks for it")
        if conn.outlet is None:
            conn.outlet = Outlet(conn, self)
        outlet: Outlet = conn.outlet
        return outlet

    async def _epoch(self, sid: str) -> str:
        """The session's epoch, made (durably, on a thread) if it has none yet."""
        known = self.known(sid)
        return known if known is not None else await on_thread(self.current, sid)

    def _turns_tag(self, s: Session) -> tuple[int, int]:
        """A newly watched session's turn log size and checkpoint tag (small reads)."""
        cp = s.checkpoint()
        return self.registry.turnlog.size(s.id), tag_of(cp.message) if cp is not None else 0

    def _go_live(self, w: Watcher, s: Session, st: Watched) -> None:
        """``w`` has every change so far but the checkpoint: queue that unless its cursor
        says it has it, and tell it of every change from now on."""
        if st.tag and st.tag != w.pos.tag:
            cp = s.checkpoint()
            st.tag = tag_of(cp.message) if cp is not None else 0
            if cp is not None:
                event = CheckpointEvent(turn_id=cp.turn_id, message=cp.message)
                w.outlet.push(w, _tail(st.cursor(), event), st.cursor())
                self.fan_out_soon()
        st.live = [*st.live, w]

    def detach(self, w: Watcher) -> None:
        """Stop telling ``w`` of changes; forget its session once nobody watches it."""
        s = self.sessions.get(w.session_id)
        st = s.watched if s is not None else None
        if s is not None and st is not None and w in st.watchers:
            st.watchers = [x for x in st.watchers if x is not w]
            st.live = [x for x in st.live if x is not w]
            if not st.watchers and not st.settling:
                s.watched = None

    def shed(self) -> None:
        """Past :data:`WATCH_BYTES` queued in all: end the watcher with the most queued."""
        worst = max(
            (w for s in self.sessions.values() if s.watched for w in s.watched.watchers),
            key=lambda w: w.queued,
            default=None,
        )
        if worst is not None and worst.queued:
            worst.outlet.overflow(worst)

    def _reset_all(self, st: Watched, s: Session, epoch: str) -> None:
        """The transcript was rewritten: each watcher's last event is a reset, whose cursor
        is the new epoch's lines as they are and the turn changes it was given."""
        self._out(st)  # what was noted before goes first
        self.fan_out()
        st.settling = False
        for w in st.watchers:
            at = Cursor(epoch, s.line_count, w.pos.turns, 0)
            w.outlet.end(w, ResetEvent(reason="rewritten", total_lines=s.line_count), at)
        s.watched = None
        self.registry.count("watch.resets")

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def aclose(self) -> None:
        """Stop every catch-up and reset (the host is closing)."""
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks))

    # -- background work ----------------------------------------------------------------

    async def _settle(self, sid: str) -> None:
        """Reset the watchers of a session whose transcript was rewritten (or deleted)."""
        try:
            async with self.registry.hold(sid):
                held = self.sessions.get(sid)
                st = held.watched if held is not None else None
                if held is None or st is None or held.epoch == st.epoch:
                    return
                try:
                    s = await self.registry.open(sid)
                except NotFound:  # its transcript is gone
                    self.deleted(held)
                    return
                self._reset_all(st, s, await self._epoch(sid))
        except Exception:
            log.exception("session %s: its watchers could not be reset", sid)
            held = self.sessions.get(sid)
            st = held.watched if held is not None else None
            if held is not None:
                held.watched = None
            for w in st.watchers if st is not None else []:  # told, never dropped silently
                w.outlet.end(w, ResetEvent(reason="rewritten", total_lines=w.pos.lines), w.pos)

    async def _catch_up(self, w: Watcher) -> None:
        """Replay from the files what follows ``w``'s cursor, a chunk at a time, then go live."""
        outlet, sid = w.outlet, w.session_id
        try:
            while True:
                async with outlet.reading:
                    await outlet.room(w)
                    async with self.registry.hold(sid):
                        if w.ending or await self._chunk(w):
                            return
        except NotFound:
            if not w.ending:
                outlet.end(w, DeletedEvent(), w.pos)
        except Exception as exc:
            log.error("watch %s of %s: catching up failed: %s", w.id, sid, exc)
            if not w.ending:
                outlet.end(w, ResetEvent(reason="expired", total_lines=w.pos.lines), w.pos)

    async def _chunk(self, w: Watcher) -> bool:
        """Queue one chunk of what ``w`` lacks (under its session); ``True`` once live."""
        sid = w.session_id
        s = await self.registry.open(sid)
        st, epoch = s.watched, s.epoch
        if st is None or epoch != st.epoch or epoch != w.pos.epoch:
            if st is not None and w in st.watchers:
                self._reset_all(st, s, await self._epoch(sid))
            return True
        if w.pos.lines < s.line_count:
            rows = await s.rows(w.pos.lines, min(s.line_count, w.pos.lines + ROWS_PER_READ))
            size = 0
            for n, r in enumerate(rows):
                size += r.length
                if size > REPLAY_CHUNK and n:
                    rows = rows[:n]
                    break
            self.registry.count("watch.chunks")
            for r, data in zip(rows, await s.read_rows(rows), strict=True):
                at = Cursor(st.epoch, r.line + 1, w.pos.turns, w.pos.tag)
                event = AppendedEvent(line=r.line, message=Raw(data))
                w.outlet.push(w, _tail(at, event), at, bounded=False)
        elif w.pos.turns < st.turns:
            for record, end in self.registry.turnlog.chunk(sid, w.pos.turns, st.turns):
                at = Cursor(st.epoch, w.pos.lines, end, w.pos.tag)
                if record is None:  # not a turn change (edited by hand): passed over
                    w.pos = at
                else:
                    w.outlet.push(w, _tail(at, _turn_event(record)), at, bounded=False)
        else:
            self._go_live(w, s, st)
            return True
        self.fan_out_soon()
        return False


def _turn_event(record: TurnRecord) -> TurnEvent:
    return TurnEvent(
        turn_id=record.turn_id,
        status=record.status,
        at=record.at,
        prompt_id=record.prompt_id if record.prompt_id is not None else UNSET,
    )
