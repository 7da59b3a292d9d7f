"""Each session's queue of calls, in arrival order, and the state of each call.

The endpoint reads a request and hands it to the service, which puts a :class:`Ticket`
in its session's queue at once, in the read callback, before any call of that read
runs: calls on one session apply in the order their lines arrived. The ticket at the
head of the queue holds the session: its call runs from its first read to its last
write, and leaving wakes the next (first in, first out). Once a call holds its session
it is *started*: ``$/cancelRequest`` no longer stops it.

The holder may do the work of the tickets queued right behind it if they carry a
*rider* (group commit: adjacent appends share one write and one fsync); those calls
count as started, and the holder lets them go with their work done, all at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from host._call import CallState


@dataclass(slots=True, eq=False)
class Ticket:
    """One call's place in its session's queue; the ticket at the head holds the session."""

    table: LockTable
    key: str
    rider: Any = None  # work the holder ahead may do for it (then ``done``)
    call: CallState | None = None
    turn: asyncio.Future[None] | None = None  # resolved when it reaches the head
    gone: bool = False  # left the queue (or its work was done by the holder ahead of it)
    done: bool = False  # its work was done by the holder ahead of it
    holds: bool = False  # at the head, and its call has begun to work on the session
    out: bool = False  # stepped out while its call waits at its connection's gate

    def ready(self) -> bool:
        """Whether this ticket holds its session now (or its work is done): then it need
        not :meth:`wait`. A call cancelled before it got there raises ``CancelledError``."""
        if self.done:
            return True
        if self.call is not None and self.call.cancel_requested:
            raise asyncio.CancelledError("$/cancelRequest")
        if self.table.queue(self.key)[0] is not self:
            return False
        self.holds = True
        if self.call is not None:
            self.call.started = True
        return True

    async def wait(self) -> None:
        """Return once this ticket holds its session (or its work is done)."""
        while not self.ready():
            self.turn = asyncio.get_running_loop().create_future()
            await self.turn

    def leave(self) -> None:
        """Leave the queue (idempotent); the next ticket holds the session."""
        if not self.gone:
            self.gone = True
            self.table._leave(self)
        self.call = None  # no cycle left for the collector

    def step_out(self) -> None:
        """Leave the queue until :meth:`step_in` (its call waits at its client's gate)."""
        self.table.step_out(self)

    def step_in(self) -> None:
        """Queue again, last."""
        self.table.step_in(self)


def _wake(t: Ticket) -> None:
    if t.turn is not None and not t.turn.done():
        t.turn.set_result(None)


class LockTable:
    """One queue per session id, created on demand and dropped when it empties."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Ticket]] = {}
        self.on_free: Callable[[str], None] | None = None
        """Told when a session's holder leaves (its transcript may close)."""

    def enqueue(self, key: str, call: CallState | None = None, rider: Any = None) -> Ticket:
        """Put a call in ``key``'s queue, now: its place is its arrival."""
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        ticket = Ticket(self, key, rider, call)
        queue.append(ticket)
        if call is not None:
            call.places.append(ticket)
        return ticket

    def queue(self, key: str) -> deque[Ticket]:
        return self._queues[key]

    @contextlib.asynccontextmanager
    async def hold(self, key: str, call: CallState | None = None) -> AsyncIterator[Ticket]:
        """Hold a session for work of the host's own (start-up, ``recoverInflightMessages``),
        queued behind every call already read for it. ``call``: the call doing it, which
        counts as started once it holds the session (a cancel no longer stops it)."""
        ticket = self.enqueue(key, call)
        try:
            if not ticket.ready():
                await ticket.wait()
            yield ticket
        finally:
            ticket.leave()

    def _leave(self, ticket: Ticket) -> None:
        queue = self._queues[ticket.key]
        was_head = queue[0] is ticket
        queue.remove(ticket)
        if not queue:
            del self._queues[ticket.key]
        elif was_head:
            _wake(queue[0])
        if ticket.holds and self.on_free is not None:
            self.on_free(ticket.key)

    def step_out(self, ticket: Ticket) -> None:
        """Take a ticket out of its queue until :meth:`step_in` (``gone`` meanwhile)."""
        if not ticket.gone:
            self._leave(ticket)
            ticket.out = True

    def step_in(self, ticket: Ticket) -> None:
        """Put a ticket taken out back in its queue, last."""
        if ticket.out:
            ticket.out = ticket.gone = False
            queue = self._queues.get(ticket.key)
            if queue is None:
                queue = self._queues[ticket.key] = deque()
            queue.append(ticket)

    def followers(
        self, ticket: Ticket, limit: int, take: Callable[[Any], Any | None]
    ) -> list[Ticket]:
        """Take the riders queued right behind ``ticket``, at most ``limit``; they start.

        ``take`` turns a rider into the work to do for it, or ``None``: that call, and every
        one behind it, waits for its own turn (it will fail on its own).
        """
        out: list[Ticket] = []
        queue = self._queues[ticket.key]
        for i in range(1, min(len(queue), limit + 1)):
            t = queue[i]
            if t.rider is None or (t.call is not None and t.call.cancel_requested):
                break  # not a rider, or being cancelled: it waits its turn
            work = take(t.rider)
            if work is None:
                break
            t.rider = work
            if t.call is not None:
                t.call.started = True
            out.append(t)
        return out

    def release(self, riders: list[Ticket]) -> None:
        """Let riders whose work the holder did go at once, without taking the session."""
        if not riders:
            return
        for t in riders:
            t.gone = t.done = True
            _wake(t)
        key = riders[0].key
        self._queues[key] = deque(t for t in self._queues[key] if not t.gone)

    def __len__(self) -> int:
        return len(self._queues)

    def users(self, key: str) -> int:
        """How many calls hold or wait for the session."""
        queue = self._queues.get(key)
        return len(queue) if queue else 0

    def held(self, key: str) -> bool:
        """Whether a call holds the session now (calls only queued for it do not)."""
        queue = self._queues.get(key)
        return queue is not None and queue[0].holds
