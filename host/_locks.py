"""Per-session ``asyncio.Lock``s, taken in arrival order, and the state of each call.

A call's coroutine takes its session's lock before its first read and keeps it until its
last write. ``asyncio.Lock`` wakes waiters first in, first out, and the endpoint starts
each call's task in the order its line arrived, so calls on one session apply in that
order. Once a call holds a lock it is *started*: ``$/cancelRequest`` no longer stops it.

Each call also leaves a :class:`Ticket` in its session's arrival queue. The holder of the
lock may do the work of the tickets queued right behind it, if they carry a *rider*
(group commit: appends that arrive while one is being written share its fsync); those
calls count as started, and find their work done when their turn comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import AsyncIterator
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


CURRENT_CALL: contextvars.ContextVar[CallState | None] = contextvars.ContextVar(
    "CURRENT_CALL", default=None
)


@dataclass(slots=True, eq=False)
class Ticket:
    """One call's place in its session's arrival queue."""

    rider: Any = None
    call: CallState | None = None


@dataclass(slots=True)
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: deque[Ticket] = field(default_factory=deque)


class LockTable:
    """One lock per session id, created on demand and dropped when nobody wants it."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    @contextlib.asynccontextmanager
    async def hold(self, session_id: str, rider: Any = None) -> AsyncIterator[Ticket]:
        """Hold the session's lock; the current call counts as started once it has it."""
        slot = self._slots.get(session_id)
        if slot is None:
            slot = self._slots[session_id] = _Slot()
        ticket = Ticket(rider, CURRENT_CALL.get())
        slot.queue.append(ticket)
        try:
            async with slot.lock:
                if ticket.call is not None:
                    ticket.call.started = True
                yield ticket
        finally:
            slot.queue.remove(ticket)
            if not slot.queue:
                del self._slots[session_id]

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
