"""Per-session locks, taken in arrival order, and the state of each call.

A call's coroutine takes its session's lock before its first read and keeps it until its
last write. The lock wakes waiters first in, first out, and the endpoint starts each
call's task in the order its line arrived, so calls on one session apply in that order.
Once a call holds a lock it is *started*: ``$/cancelRequest`` no longer stops it.

Each call also leaves a :class:`Ticket` in its session's arrival queue. The holder of the
lock may do the work of the tickets queued right behind it, if they carry a *rider*
(group commit: appends that arrive while one is being written share its fsync); those
calls count as started, and the holder lets them go with their work done, all at once.

The lock is the queue itself: the ticket at its head holds it, and leaving wakes the next
(first in, first out, as ``asyncio.Lock`` would, but riders leave without a turn).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class CallState:
    """What the endpoint and the service share about one request."""

    method: str
    running: bool = False  # its task has taken its first step
    started: bool = False
    cancel_requested: bool = False
    task: asyncio.Task[object] | None = field(default=None, repr=False)
    pending: bool = False  # counted in UNSTARTED

    def created(self) -> None:
        """Its task exists; it counts in :data:`UNSTARTED` until it runs or ends."""
        self.pending = True
        UNSTARTED[0] += 1

    def ran(self, *_: object) -> None:
        """Its task took its first step (or ended without one)."""
        if self.pending:
            self.pending = False
            UNSTARTED[0] -= 1


UNSTARTED = [0]
"""Calls (of every connection) whose tasks exist but have not taken their first step: a
group-commit leader yields once when there are any, so those already read queue behind it.
"""


CURRENT_CALL: contextvars.ContextVar[CallState | None] = contextvars.ContextVar(
    "CURRENT_CALL", default=None
)


@dataclass(slots=True, eq=False)
class Ticket:
    """One call's place in its session's arrival queue; the ticket at its head holds it."""

    rider: Any = None
    call: CallState | None = None
    turn: asyncio.Future[None] | None = None  # resolved when it reaches the head
    gone: bool = False  # left the queue (or its work was done by the holder ahead of it)


@dataclass(slots=True)
class _Slot:
    queue: deque[Ticket] = field(default_factory=deque)


def _wake(t: Ticket) -> None:
    if t.turn is not None and not t.turn.done():
        t.turn.set_result(None)


class _Hold:
    """``async with table.hold(sid)``: a class, not a generator: appends take it per call."""

    __slots__ = ("session_id", "slot", "table", "ticket")

    def __init__(self, table: LockTable, session_id: str, slot: _Slot, ticket: Ticket) -> None:
        self.table = table
        self.session_id = session_id
        self.slot = slot
        self.ticket = ticket

    async def __aenter__(self) -> Ticket:
        t = self.ticket
        if self.slot.queue[0] is not t:
            t.turn = asyncio.get_running_loop().create_future()
            try:
                await t.turn
            except BaseException:
                self.table._leave(self.session_id, self.slot, t)
                raise
        if t.call is not None:
            t.call.started = True
        return t

    async def __aexit__(self, *exc: object) -> None:
        self.table._leave(self.session_id, self.slot, self.ticket)


class LockTable:
    """One lock per session id, created on demand and dropped when nobody wants it."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self.on_idle: Callable[[str], None] | None = None
        """Told when a session's last holder or waiter leaves (its transcript may close)."""

    def hold(self, session_id: str, rider: Any = None) -> _Hold:
        """Hold the session's lock (``async with``); the call counts as started once it has it.

        The call's ticket joins the session's queue here, when the hold is made.
        """
        slot = self._slots.get(session_id)
        if slot is None:
            slot = self._slots[session_id] = _Slot()
        ticket = Ticket(rider, CURRENT_CALL.get())
        slot.queue.append(ticket)
        return _Hold(self, session_id, slot, ticket)

    @contextlib.asynccontextmanager
    async def hold_with_twins(self, session_id: str) -> AsyncIterator[Ticket]:
        """Hold the session's lock and the one shared by every id that differs from it
        only in case (``session.create`` and ``session.delete``).

        Two ids a case-insensitive file system stores as one file are then never created
        and deleted at once. Both tickets are queued now, so the call keeps its place among
        the session's calls. The shared lock is entered first; no two calls can wait for
        each other, since any two that share both locks queued in both in the same order.
        Its key is no legal id (``/`` is in none), so it is no session's own lock.
        """
        folded = self.hold("/" + session_id.lower())
        own = self.hold(session_id)
        try:
            async with folded, own:
                yield own.ticket
        finally:
            self._leave(session_id, own.slot, own.ticket)  # if never entered: still queued

    def _leave(self, session_id: str, slot: _Slot, ticket: Ticket) -> None:
        if ticket.gone:
            return
        ticket.gone = True
        queue = slot.queue
        was_head = queue[0] is ticket
        queue.remove(ticket)
        if not queue:
            del self._slots[session_id]
            if self.on_idle is not None:
                self.on_idle(session_id)
        elif was_head:
            _wake(queue[0])

    def release(self, session_id: str, riders: list[Ticket]) -> None:
        """Let riders whose work the holder did go at once, without taking the lock."""
        if not riders:
            return
        for t in riders:
            t.gone = True
            _wake(t)
        slot = self._slots[session_id]
        slot.queue = deque(t for t in slot.queue if not t.gone)

    def followers(self, session_id: str, ticket: Ticket, limit: int) -> list[Ticket]:
        """Take the riders queued right behind ``ticket`` (at most ``limit``); they start."""
        out: list[Ticket] = []
        queue = self._slots[session_id].queue
        behind = False
        for t in queue:
            if t is ticket:
                behind = True
                continue
            if not behind:
                continue
            if t.rider is None or len(out) >= limit:
                break
            if t.call is not None:
                if t.call.cancel_requested:
                    break  # being cancelled: it and everything behind it wait their turn
                t.call.started = True
            out.append(t)
        return out

    def __len__(self) -> int:
        return len(self._slots)

    def users(self, session_id: str) -> int:
        """How many calls hold or wait for the session's lock."""
        slot = self._slots.get(session_id)
        return len(slot.queue) if slot else 0
