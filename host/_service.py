"""The host service: the data dir opened, recovered and served by one handler table.

``Host.open`` creates the data dir's folders (0700), opens the index, runs start-up
recovery before any request is read, and closes everything in reverse. The caller
(``serve``) holds the data dir's lock around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from msgspec import Struct, structs

from host._call import CallState
from host._endpoint import Stats
from host._framing import RequestBudget
from host._fs import FileSystem, on_thread
from host._history import HistoryMethods
from host._index import (
    BUSY_TIMEOUT,
    Index,
    IndexBusy,
    busy,
    disk_trouble,
    index_problem,
    set_aside_index,
)
from host._layout import Layout
from host._limits import REQUEST_BYTES, Limits
from host._locks import Ticket
from host._recovery import Report, recover
from host._sessions import SessionMethods
from host._store import Registry
from host._turns import TurnMethods
from host._wire import CreateParams, EmptyParams, ShutdownResult, StatsResult

Handler = Callable[[Any], Coroutine[Any, Any, Struct]]
_TWINS = frozenset({"session.create", "session.delete"})
"""Methods that also hold the queue every id differing only in case shares."""

log = logging.getLogger("host")


class Host:
    """Everything one running host owns: the store, the handler table, the stats."""

    def __init__(self, registry: Registry, report: Report, limits: Limits | None = None) -> None:
        self.registry = registry
        self.report = report
        self.limits = limits or Limits()
        self.stats = Stats()
        self.shutdown_requested = asyncio.Event()
        self.sessions = SessionMethods(registry)
        self.turns = TurnMethods(registry, self.sessions)
        self.history = HistoryMethods(registry, self.sessions, self.turns)
        s, t, h = self.sessions, self.turns, self.history
        self.handlers: dict[str, Handler] = {
            "session.create": s.create,
            "session.list": s.list_sessions,
            "session.delete": s.delete,
            "session.get": s.get,
            "session.appendMessage": s.append_message,
            "session.updateMessage": s.update_message,
            "session.deleteMessages": s.delete_messages,
            "session.replaceMessages": s.replace_messages,
            "session.beginTurn": t.begin_turn,
            "session.endTurn": t.end_turn,
            "session.saveInflightMessage": t.save_inflight,
            "session.recoverInflightMessages": t.recover_inflight,
            "session.saveRevision": h.save_revision,
            "session.listRevisions": h.list_revisions,
            "session.saveActiveRevision": h.save_active_revision,
            "session.activateRevision": h.activate_revision,
            "session.truncateFrom": h.truncate_from,
            "host.stats": self.host_stats,
            "host.shutdown": self.host_shutdown,
        }
        self.methods = frozenset(self.handlers)
        self.big_results = frozenset({"session.get", "session.list", "session.listRevisions"})
        """Methods whose answer its request does not bound: a connection runs one at a time."""
        self.requests = RequestBudget(REQUEST_BYTES)
        """The long request lines every connection holds together (docs/protocol.md)."""

    def submit(self, method: str, params: Any, call: CallState) -> Coroutine[Any, Any, Struct]:
        """Queue a decoded call on its session, now, and return the coroutine that runs it.

        A call naming a session takes its place in that session's queue (``create`` and
        ``delete`` also in the one their case twins share: two ids a case-insensitive file
        system stores as one file are never created and deleted at once); the others
        (``list``, ``host.*``, ``recoverInflightMessages``) run as soon as they start.
        """
        handler = self.handlers[method]
        if isinstance(params, CreateParams) and not isinstance(params.session_id, str):
            params = structs.replace(params, session_id=uuid.uuid4().hex)
        sid = getattr(params, "session_id", None)
        if method == "session.recoverInflightMessages":  # holds each session in turn
            return self.turns.recover_inflight(params, call)
        if not isinstance(sid, str):
            return handler(params)
        locks = self.registry.locks
        rider = params if method == "session.appendMessage" else None
        # the twins' queue is entered first; its key is no legal id ("/" is in none)
        twin = [locks.enqueue("/" + sid.lower(), call)] if method in _TWINS else []
        ticket = locks.enqueue(sid, call, rider)
        return _in_turn(handler, params, [*twin, ticket], ticket)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        data_dir: str,
        fs: FileSystem | None = None,
        busy_timeout: float = BUSY_TIMEOUT,
        limits: Limits | None = None,
        *,
        full: bool = False,
    ) -> AsyncIterator[Host]:
        """Open, recover and yield the host of ``data_dir``; the caller holds its lock.

        ``busy_timeout``: seconds to wait for another program's lock on the index before
        giving up with :class:`IndexBusy`. ``full``: rescan every transcript, not only
        those whose stamp differs from the index's (``verify --repair``: the same recovery).
        """
        limits = limits or Limits()
        layout = Layout(data_dir)
        fs = fs or FileSystem()
        layout.check_no_links()
        for folder in (layout.root, layout.sessions, layout.revisions_root):
            fs.mkdir(folder)
            os.chmod(folder, 0o700)
        problem = index_problem(layout.index, busy_timeout)
        for attempt in (1, 2):
            if problem is not None:
                aside = set_aside_index(layout.index)
                log.error(
                    "index %s is %s: moved to %s, rebuilding it from the transcripts",
                    layout.index,
                    problem,
                    aside,
                )
            async with contextlib.AsyncExitStack() as stack:
                index = await stack.enter_async_context(Index.open(layout.index, fs, busy_timeout))
                registry = Registry(layout, index, fs, open_transcripts=limits.open_transcripts)
                stack.callback(registry.close)
                try:
                    host = await cls._recover(registry, limits, full)
                except sqlite3.DatabaseError as exc:
                    if busy(exc):
                        raise IndexBusy(layout.index, exc) from None
                    if attempt == 2 or disk_trouble(exc):  # full or failing: no damage
                        raise
                    problem = f"damaged ({exc})"  # beyond what the first look saw
                    continue
                yield host
                return

    @classmethod
    async def _recover(cls, registry: Registry, limits: Limits, full: bool) -> Host:
        layout = registry.layout
        for path in (layout.index, layout.index + "-wal", layout.index + "-shm"):
            if os.path.exists(path):
                os.chmod(path, 0o600)
        host = cls(registry, Report(), limits)
        host.report = report = await recover_data_dir(registry, full=full)
        log.info(
            "recovered %d session(s): %d reconciled, %d line(s) indexed, %d torn tail(s),"
            " %d line(s) quarantined, %d temp file(s) removed",
            report.sessions,
            report.reconciled,
            report.indexed_lines,
            report.torn_tails,
            report.quarantined_lines,
            report.temp_files_removed,
        )
        return host

    async def host_stats(self, p: EmptyParams) -> StatsResult:
        counters = self.registry.counters_now()
        counters["connections.paused"] = self.stats.paused
        counters["calls.waiting"] = self.stats.waiting
        counters["calls.inline"] = self.stats.inline
        counters["calls.queued"] = self.stats.queued
        counters["requests.heldBytes"] = self.requests.held
        return StatsResult(
            uptime_seconds=time.monotonic() - self.stats.started,
            counters=counters,
            methods=self.stats.per_method(),
        )

    async def host_shutdown(self, p: EmptyParams) -> ShutdownResult:
        self.shutdown_requested.set()
        return ShutdownResult(shutting_down=True)


async def _in_turn(handler: Handler, params: Any, tickets: list[Ticket], ticket: Ticket) -> Struct:
    """Run a call once it holds its session: from its first read to its last write."""
    try:
        for t in tickets:
            if not t.ready():
                await t.wait()
        if ticket.done:  # the holder ahead did its work (group commit)
            result: Struct = ticket.rider.answer()
            return result
        return await handler(params)
    finally:
        for t in tickets:
            t.leave()


async def recover_data_dir(registry: Registry, *, full: bool = False) -> Report:
    """Start-up recovery, the one path (``serve`` and ``verify --repair`` alike): leftovers
    removed, recorded changes made, transcripts reconciled with the index, running turns
    ended, every session registered, archives swept. ``full`` rescans every transcript."""
    await on_thread(registry.remove_leftovers)  # before anything reads them
    changed = await on_thread(registry.finish_recorded)
    report = await recover(registry, full=full, rescan=set(changed))
    await registry.settle_turns()
    await registry.register_all()
    await on_thread(registry.sweep_archives)
    return report
