"""Per-session ``asyncio.Lock``s, taken in arrival order, and the state of each call.

A call's coroutine takes its session's lock before its first read and keeps it until its
last write. ``asyncio.Lock`` wakes waiters first in, first out, and the endpoint starts
each call's task in the order its line arrived, so calls on one session apply in that
order. Once a call holds a lock it is *started*: ``$/cancelRequest`` no longer stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass(slots=True)
class CallState:
    """What the endpoint and the service share about one request."""

    method: str
    started: bool = False
    cancel_requested: bool = False
    task: asyncio.Task[object] | None = field(default=None, repr=False)


CURRENT_CALL: contextvars.ContextVar[CallState | None] = contextvars.ContextVar(
    "CURRENT_CALL", default=None
)


class LockTable:
    """One lock per session id, created on demand and dropped when nobody wants it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session's lock; the current call counts as started once it has it."""
        lock, users = self._locks.get(session_id, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                call = CURRENT_CALL.get()
                if call is not None:
                    call.started = True
                yield
        finally:
            lock, users = self._locks[session_id]
            if users == 1:
                del self._locks[session_id]
            else:
                self._locks[session_id] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
