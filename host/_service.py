"""The host service: the data dir opened, recovered and served by one handler table.

``Host.open`` creates the data dir's folders (0700), opens the index, runs start-up
recovery before any request is read, and closes everything in reverse. The caller
(``serve``) holds the data dir's lock around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from msgspec import structs

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
from host._locks import Method, Scope, Ticket
from host._organise import ForkMethod, Organise
from host._recovery import Report, recover
from host._search import Search
from host._sessions import GROUP, SessionMethods
from host._store import Registry
from host._turns import TurnMethods
from host._wire import CreateParams, EmptyParams, ForkParams, ShutdownResult, StatsResult

log = logging.getLogger("host")
ASKERS = frozenset({"session.watch", "session.unwatch"})
"""Methods whose handler is given the connection that asks (issue 34)."""


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
        none, twins = Scope.NONE, Scope.TWINS
        self.handlers: dict[str, Method] = {
            "session.create": Method(s.create, twins),
            "session.delete": Method(s.delete, twins),
            "session.get": Method(s.get),
            "session.appendMessage": Method(s.append_message, group=GROUP),
            "session.updateMessage": Method(s.update_message),
            "session.deleteMessages": Method(s.delete_messages),
            "session.replaceMessages": Method(s.replace_messages),
            "session.beginTurn": Method(t.begin_turn),
            "session.endTurn": Method(t.end_turn),
            "session.saveInflightMessage": Method(t.save_inflight),
            "session.recoverInflightMessages": Method(t.recover_inflight, none),
            "session.saveRevision": Method(h.save_revision),
            "session.listRevisions": Method(h.list_revisions),
            "session.saveActiveRevision": Method(h.save_active_revision),
            "session.activateRevision": Method(h.activate_revision),
            "session.truncateFrom": Method(h.truncate_from),
            "host.stats": Method(self.host_stats, none),
            "host.shutdown": Method(self.host_shutdown, none),
        }
        w = registry.watch
        self.handlers["session.watch"] = Method(w.watch)
        self.handlers["session.unwatch"] = Method(w.unwatch, none)
        self.handlers["session.publish"] = Method(w.publish)
        """Each method's handler, the queues its calls enter, and its group commit."""
        # issue 35: find and organise (host/_search.py, host/_organise.py)
        self.search = Search(registry.index, registry.layout, registry.archive)
        self.organise = o = Organise(registry, self.search)
        self.handlers |= {
            "session.list": Method(o.list_sessions, none),
            "session.update": Method(o.update),
            "session.fork": ForkMethod(o.fork),
            "session.search": Method(o.search_sessions, none),
        }
        self.methods = frozenset(self.handlers)
        self.big_results = frozenset(
            {"session.get", "session.list", "session.listRevisions", "session.search"}
        )
        """Methods whose answer its request does not bound: a connection runs one at a time."""
        self.requests = RequestBudget(REQUEST_BYTES)
        """The long request lines every connection holds together (docs/protocol.md)."""

    def submit(self, method: str, params: Any, origin: Any = None) -> Ticket:
        """Put a decoded call in the queues its method names (``host._locks.Scope``), now."""
        m = self.handlers[method]
        if method in ASKERS:  # a watch is its connection's
            asker: Any = m.handler
            m = dataclasses.replace(m, handler=functools.partial(asker, origin=origin))
        if isinstance(params, CreateParams) and not isinstance(params.session_id, str):
            params = structs.replace(params, session_id=uuid.uuid4().hex)
        if isinstance(params, ForkParams) and not isinstance(params.new_session_id, str):
            params = structs.replace(params, new_session_id=uuid.uuid4().hex)  # issue 35
        return self.registry.locks.enqueue(m.queues(params), m, params)

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
                stack.push_async_callback(registry.watch.aclose)
                try:
                    host = await cls._recover(registry, limits, full)
                except sqlite3.DatabaseError as exc:
                    if busy(exc):
                        raise IndexBusy(layout.index, exc) from None
                    if attempt == 2 or disk_trouble(exc):  # full or failing: no damage
                        raise
                    problem = f"damaged ({exc})"  # beyond what the first look saw
                    continue
                async with host.search.running():  # issue 35: the search indexer
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
        counters["requests.heldBytes"] = self.requests.held
        counters.update(await self.search.counters())  # issue 35
        return StatsResult(
            uptime_seconds=time.monotonic() - self.stats.started,
            counters=counters,
            methods=self.stats.per_method(),
        )

    async def host_shutdown(self, p: EmptyParams) -> ShutdownResult:
        self.shutdown_requested.set()
        return ShutdownResult(shutting_down=True)


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
