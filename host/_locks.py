"""The scheduler: each session's queue of calls, which alone decides when a call runs.

A call enters the queues its method names (:class:`Scope`) when its connection admits it,
in the read callback, before any call of that read runs: calls on one session apply in
the order they were admitted (one connection's in the order their lines arrived). The
:class:`Ticket` at the head of every queue it is in holds them: its call is *started*
from then on and runs to its end (``$/cancelRequest`` no longer stops it), from its first
read to its last write; leaving wakes the next (first in, first out).

Group commit is the holder's (LevelDB's ``DBImpl::Write`` and ``BuildBatchGroup``): a
holder whose method groups takes the calls of that method queued right behind it, runs
them with its own in one handler call (one write, one fsync), and ends their waits with
their answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from host._errors import RequestCancelled


class Scope(enum.Enum):
    """The queues a method's calls enter."""

    NONE = "none"
    """None: it starts once admitted (``session.list``, ``host.*``; ``recoverInflightMessages``
    holds each session in turn with :meth:`LockTable.hold`)."""
    SESSION = "session"
    """Its session's."""
    TWINS = "twins"
    """The one every id differing from its session's only in case shares, then its
    session's: two ids a case-insensitive file system stores as one file are never created
    and deleted at once (that key, with its ``/``, is no legal id)."""


@dataclass(frozen=True, slots=True)
class Method:
    """How the scheduler runs one method's calls."""

    handler: Callable[[Any], Awaitable[Any]]
    scope: Scope = Scope.SESSION
    group: int = 1
    """More than 1: the holder takes up to ``group - 1`` calls of this method queued right
    behind it, and ``handler`` takes their params as one list, its own first, and returns
    an answer (a result or an exception) for each."""

    def queues(self, params: Any) -> tuple[str, ...]:
        if self.scope is Scope.NONE:
            return ()
        sid: str = params.session_id
        return (sid,) if self.scope is Scope.SESSION else ("/" + sid.lower(), sid)


class Ticket:
    """One call's place in the queues it entered."""

    __slots__ = ("blocked", "keys", "method", "params", "started", "table", "turn")

    def __init__(self, table: LockTable, keys: tuple[str, ...], method: Any, params: Any) -> None:
        self.table = table
        self.keys = keys  # the queues it is in; () once it left them
        self.method: Method = method
        self.params = params
        self.blocked = 0  # queues it is in whose head it is not
        self.started = False
        self.turn: asyncio.Future[Any] | None = None
        """What it waits on when it had to wait: resolved with ``None`` once it holds its
        queues, else with its answer, given by the holder ahead (group commit), or with
        the error that ends its wait (``RequestCancelled``)."""

    async def run(self) -> Any:
        """Wait for its turn, then run its call (with those its group takes from behind
        it, whose waits it ends with their answers); leave its queues however it ends."""
        try:
            answer = None if self.turn is None else await self.turn
            if answer is None:
                method = self.method
                if method.group == 1:
                    return await method.handler(self.params)
                behind = self._behind(method.group - 1)
                try:
                    answers = await method.handler([self.params, *(t.params for t in behind)])
                except BaseException as exc:
                    for t in behind:
                        t._end_wait(exc)
                    raise
                for t, answer in zip(behind, answers[1:], strict=True):
                    t._end_wait(answer)
                answer = answers[0]
            if isinstance(answer, BaseException):
                raise answer
            return answer
        finally:
            self.leave()

    def _behind(self, most: int) -> list[Ticket]:
        """Take the calls of its method queued right behind it, at most ``most``: they
        start, and leave the queue (their work is its own now)."""
        queue = self.table.queue(self.keys[0])
        queue.popleft()  # this ticket, put back below
        taken: list[Ticket] = []
        while queue and len(taken) < most and queue[0].method is self.method:
            t = queue.popleft()
            t.keys, t.started = (), True
            taken.append(t)
        queue.appendleft(self)
        return taken

    def cancel(self) -> bool:
        """Leave the queues if the call has not started (its wait ends with
        ``REQUEST_CANCELLED``); whether it did."""
        if self.started or not self.keys:
            return False
        self.leave()
        self._end_wait(RequestCancelled("cancelled before it started"))
        return True

    def leave(self) -> None:
        """Leave the queues (idempotent); the next in each may hold it."""
        keys, self.keys = self.keys, ()
        for key in keys:
            self.table._leave(self, key)

    def _start(self) -> None:
        self.started = True
        self._end_wait(None)

    def _end_wait(self, answer: Any) -> None:
        if self.turn is not None and not self.turn.done():  # not if its task was cancelled
            self.turn.set_result(answer)


class LockTable:
    """One queue per session id, created on demand and dropped when it empties."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Ticket]] = {}
        self.on_free: Callable[[str], None] | None = None
        """Told when a session's holder leaves (its transcript may close)."""

    def enqueue(
        self, keys: tuple[str, ...], method: Method | None = None, params: Any = None
    ) -> Ticket:
        """Put a call in the queues ``keys``, now: its place is its arrival."""
        ticket = Ticket(self, keys, method, params)
        for key in keys:
            queue = self._queues.get(key)
            if queue is None:
                self._queues[key] = deque((ticket,))
            else:
                queue.append(ticket)
                ticket.blocked += 1
        if ticket.blocked:
            ticket.turn = asyncio.get_running_loop().create_future()
        else:
            ticket.started = True  # it holds its queues now: nothing to wait for
        return ticket

    def queue(self, key: str) -> deque[Ticket]:
        return self._queues[key]

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold a session for work of the host's own (start-up, ``recoverInflightMessages``),
        queued behind every call already admitted to it."""
        ticket = self.enqueue((key,))
        try:
            if ticket.turn is not None:
                await ticket.turn
            yield
        finally:
            ticket.leave()

    def _leave(self, ticket: Ticket, key: str) -> None:
        queue = self._queues[key]
        if queue[0] is not ticket:
            queue.remove(ticket)  # cancelled while it waited
            return
        queue.popleft()
        if not queue:
            del self._queues[key]
        else:
            head = queue[0]
            head.blocked -= 1
            if not head.blocked:
                head._start()
        if ticket.started and self.on_free is not None:
            self.on_free(key)

    def __len__(self) -> int:
        return len(self._queues)

    def users(self, key: str) -> int:
        """How many calls hold or wait for the session."""
        queue = self._queues.get(key)
        return len(queue) if queue else 0

    def held(self, key: str) -> bool:
        """Whether a call holds the session now (calls only queued for it do not)."""
        queue = self._queues.get(key)
        return queue is not None and queue[0].started
