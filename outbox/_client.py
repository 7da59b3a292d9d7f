"""The host client: spawn ``python -m host serve`` (or connect to its socket) and call it.

Responses are matched by id and may come back in any order. Every call has a deadline
(130 s by default); when it passes the client sends ``$/cancelRequest`` and raises
:class:`CallTimeout`. When the host dies every pending call fails with :class:`HostGone`.
``watch`` follows a session's changes (``session.event`` notifications, issue 34) as an
async iterator that re-reads after a reset and resumes from its cursor after a reconnect
(:mod:`outbox._watch`).

Answers are read as the host reads JSON (``outbox._read``): a stored message holding half a
surrogate pair (JavaScript clients write ``\ud83d``) comes back with U+FFFD in its place. An
answer that cannot be read even so fails the calls it answers at once, with a
:class:`ClientError`, never after their deadline: the host writes every answer as
``{"jsonrpc":"2.0","id":N,...`` (a batch's as a list of them), so its first id is found
by a look at the line's start, without decoding it; a line that shows none fails every
call waiting, since any of them could be the one.

    ClientError
    ├── HostGone        the host process or socket went away
    ├── CallTimeout     a call's deadline passed (a cancel was sent)
    └── RemoteError     the host answered with a JSON-RPC error (``code``, ``name``, ``data``)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from outbox._files import open_append
from outbox._read import deep, read

if TYPE_CHECKING:
    from outbox._watch import Watch

log = logging.getLogger("outbox.client")
PROTOCOL_VERSION = 11
DEFAULT_DEADLINE = 130.0
_ENC = msgspec.json.Encoder()
_DEC = msgspec.json.Decoder()
# The start of every answer the host writes (host/_endpoint.py, _result and _error), and of
# a batch's: whose answer a line is, without decoding it.
_ANSWER = re.compile(rb'\s*(\[)?\s*\{"jsonrpc":"2\.0","id":(\d+)[,}]')


class ClientError(Exception):
    """Base of the client's errors."""


class HostGone(ClientError):
    """Raised when the host went away before answering."""


class CallTimeout(ClientError):
    """Raised when a call's deadline passed; ``$/cancelRequest`` was sent."""


class RemoteError(ClientError):
    """Raised when the host answered a call with an error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('message')} ({error.get('code')})")
        self.code: int = error.get("code", 0)
        self.data: dict[str, Any] = error.get("data") or {}
        self.name: str = self.data.get("code", "")


INBOX_BYTES = 16 * 1024 * 1024
"""Event bytes a watch's inbox holds unread; past it they are dropped for one ``reset``."""


class Inbox:
    """One watch's events as the connection read them, until its iterator takes them.

    Bounded as the host bounds a watcher: an event that would take it past
    :data:`INBOX_BYTES` unread is dropped, with every one after it, for an ``overflow``
    reset after the last one it holds (the reader never stops for it: the connection's
    answers must keep coming); the watch then resumes from there.
    """

    def __init__(self, start: str) -> None:
        self.items: collections.deque[tuple[dict[str, Any], int]] = collections.deque()
        self.bytes = 0
        self.taken = start  # the cursor of the last event taken
        self.changed = asyncio.Event()
        self.closed = False
        self.gone = False

    def fail(self) -> None:
        """The connection is gone: :meth:`get` raises ``HostGone`` once what came is taken."""
        self.gone = True
        self.changed.set()

    def put(self, params: dict[str, Any], size: int) -> None:
        if self.closed:
            return
        if self.items and self.bytes + size > INBOX_BYTES:
            # what it holds stays (so it moves on), the rest is dropped: read again from
            # the host's files, after the last event it holds
            at = self.items[-1][0].get("cursor", self.taken)
            reset = {"kind": "reset", "reason": "overflow", "totalLines": -1}
            self.items.append(({"cursor": at, "event": reset}, 0))
            self.closed = True
        else:
            self.items.append((params, size))
            self.bytes += size
        self.changed.set()

    async def get(self) -> dict[str, Any]:
        """The next event (waits for one)."""
        while not self.items:
            if self.gone:
                raise HostGone("the host went away while watching")
            self.changed.clear()
            await self.changed.wait()
        params, size = self.items.popleft()
        self.bytes -= size
        if isinstance(cursor := params.get("cursor"), str):
            self.taken = cursor
        return params


class HostClient:
    """One connection to a host."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        proc: asyncio.subprocess.Process | None = None,
        deadline: float = DEFAULT_DEADLINE,
        spawn_args: tuple[str, str | None] | None = None,
        socket_path: str | None = None,
    ) -> None:
        self.spawn_args = spawn_args
        self.spawn_extra: tuple[str, ...] = ()
        self.socket_path = socket_path
        self._reader = reader
        self._writer = writer
        self.proc = proc
        self.deadline = deadline
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._batches: dict[int, tuple[int, ...]] = {}  # a batch's call id -> all of its ids
        self._watching: set[int] = set()  # ids of session.watch calls in flight
        self.inboxes: dict[str, Inbox] = {}
        """Each watch's events (``session.event``) as they arrive, by ``watchId``."""
        self._task = asyncio.create_task(self._read_loop())
        self.gone = asyncio.Event()

    @classmethod
    async def spawn(
        cls,
        data_dir: str,
        *,
        log_path: str | None = None,
        deadline: float = DEFAULT_DEADLINE,
        args: tuple[str, ...] = (),
    ) -> HostClient:
        """Start ``python -m host serve --data-dir`` and connect over its pipes.

        ``args``: more ``serve`` arguments (``("--also-socket", PATH)``: watchers beside).
        """
        stderr = open_append(log_path) if log_path else None  # never a link's or FIFO's
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "host",
                "serve",
                "--data-dir",
                data_dir,
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr if stderr else None,
                limit=1 << 26,
                # Its own session: a Ctrl-C (or a signal to the app's process group) is the
                # app's to handle. The app quits first (ADR 0153 §3: turns settled while
                # the host is alive), then ends the host's input; a host killed with the
                # app would fail that quit's last calls and leave it waiting on them.
                start_new_session=True,
            )
        finally:
            if stderr is not None:
                os.close(stderr)
        assert proc.stdout is not None and proc.stdin is not None
        writer = proc.stdin
        client = cls(proc.stdout, writer, proc, deadline, (data_dir, log_path))
        client.spawn_extra = args
        return client

    @classmethod
    async def connect(cls, socket_path: str, *, deadline: float = DEFAULT_DEADLINE) -> HostClient:
        """Connect to a host serving on a Unix socket."""
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=1 << 26)
        return cls(reader, writer, None, deadline, socket_path=socket_path)

    async def handshake(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Handshake with protocol version 11.

        The host answers once its start-up recovery is done, which on a big data dir (or a
        busy machine) can outlast a call's deadline: ``timeout`` bounds this wait instead.
        """
        result: dict[str, Any] = await self.call(
            "handshake",
            {"protocolVersion": PROTOCOL_VERSION, "client": {"name": "outbox"}},
            timeout=timeout,
        )
        return result

    def _fail_unreadable(self, line: bytes, exc: BaseException) -> None:
        """Fail the calls an answer this client cannot decode belongs to, at once.

        Dropping it would leave them waiting out their whole deadline. Its start names the
        call (or the first of a batch's, which stands for the batch); a line whose start
        names none fails every call waiting.
        """
        head = _ANSWER.match(line)
        if head is None:
            ids: tuple[int, ...] = tuple(self._pending)
        else:
            rid = int(head[2])
            ids = self._batches.get(rid, (rid,)) if head[1] else (rid,)
        for rid in ids:
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(ClientError(f"the host's answer cannot be read here: {exc}"))

    async def _read_loop(self) -> None:
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                try:
                    msg = deep(read, _DEC, line)
                except (msgspec.DecodeError, RecursionError) as exc:
                    log.error("host sent a line this client cannot read: %r", line[:200])
                    self._fail_unreadable(line, exc)
                    continue
                for item in msg if isinstance(msg, list) else [msg]:
                    if isinstance(item, dict):
                        self._take(item, len(line))
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            log.warning("host connection lost: %s", exc)
        finally:
            self.gone.set()
            for inbox in self.inboxes.values():
                inbox.fail()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(HostGone("the host went away before answering"))
            self._pending.clear()

    def _take(self, item: dict[str, Any], size: int) -> None:
        """One message from the host: an event, or the answer a call waits for."""
        if item.get("method") == "session.event":
            self._event(item.get("params"), size)
            return
        rid = item.get("id")
        if not isinstance(rid, int):
            return
        fut = self._pending.pop(rid, None)
        if rid in self._watching:
            self._watching.discard(rid)
            self._watch_started(item)
        if fut is not None and not fut.done():
            fut.set_result(item)

    def _watch_started(self, answer: dict[str, Any]) -> None:
        """A watch's answer: its events, which follow it at once, have an inbox now."""
        result = answer.get("result")
        if isinstance(result, dict) and isinstance(wid := result.get("watchId"), str):
            self.inboxes.setdefault(wid, Inbox(str(result.get("cursor"))))

    def _event(self, params: Any, size: int) -> None:
        if isinstance(params, dict) and (inbox := self.inboxes.get(params.get("watchId", ""))):
            inbox.put(params, size)

    def watch(
        self,
        session_id: str,
        *,
        after: str | None = None,
        reconnect: Callable[[], Awaitable[HostClient]] | None = None,
    ) -> Watch:
        """Follow ``session_id`` (an async iterator of its events; see :class:`Watch`).

        Without ``after`` it starts with a ``snapshot`` of the session's lines; with it,
        after that cursor. When the connection is lost it resumes on ``reconnect()``'s
        client (by default, for a socket client, a new connection to the same socket).
        """
        from outbox._watch import Watch

        return Watch(self, session_id, after=after, reconnect=reconnect)

    async def start_watch(self, session_id: str, after: str | None) -> dict[str, Any]:
        """Call ``session.watch``; its events go to ``self.watches[watchId]``, buffered
        until the caller takes them over (:meth:`watch` does)."""
        params: dict[str, Any] = {"sessionId": session_id}
        if after is not None:
            params["after"] = after
        rid = next(self._ids)
        self._watching.add(rid)
        try:
            return await self._call_id(rid, "session.watch", params, None)  # type: ignore[no-any-return]
        finally:
            self._watching.discard(rid)

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a notification: no answer, nothing to wait for (``session.publish``)."""
        self._send({"jsonrpc": "2.0", "method": method, "params": params or {}})

    def _send(self, obj: Any) -> None:
        if self.gone.is_set():
            raise HostGone("the host is gone")
        self._writer.write(_ENC.encode(obj) + b"\n")

    async def _await(self, rid: int, fut: asyncio.Future[Any], timeout: float | None) -> Any:
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout or self.deadline)
        except TimeoutError:
            self._pending.pop(rid, None)
            with contextlib.suppress(ClientError, ConnectionError):
                self._send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": rid}})
            raise CallTimeout(f"call {rid} got no answer within its deadline") from None

    async def call(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> Any:
        """Call ``method`` and return its result, or raise."""
        return await self._call_id(next(self._ids), method, params, timeout)

    async def _call_id(
        self, rid: int, method: str, params: dict[str, Any] | None, timeout: float | None
    ) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            self._pending.pop(rid, None)
            raise HostGone(str(exc)) from None
        reply = await self._await(rid, fut, timeout)
        if "error" in reply:
            raise RemoteError(reply["error"])
        return reply.get("result")

    # -- find and organise (issue 35) ------------------------------------------------

    async def search(
        self, query: str, *, timeout: float | None = None, **params: Any
    ) -> dict[str, Any]:
        """``session.search``: one page of hits (``sessionId``, ``limit``, ``cursor``,
        ``tools`` as keywords); ``cursor`` in the answer when more may follow."""
        result: dict[str, Any] = await self.call(
            "session.search", {"query": query, **params}, timeout=timeout
        )
        return result

    async def list_sessions(
        self, *, timeout: float | None = None, **params: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """Every session, page by page (``limit``, ``order``, ``pinnedFirst`` as keywords)."""
        cursor: str | None = None
        while True:
            page = await self.call(
                "session.list",
                {**params, **({"cursor": cursor} if cursor else {})},
                timeout=timeout,
            )
            for row in page["sessions"]:
                yield row
            cursor = page.get("cursor")
            if cursor is None:
                return

    async def update_session(
        self, session_id: str, *, timeout: float | None = None, **params: Any
    ) -> dict[str, Any]:
        """``session.update``: ``title=`` and/or ``meta=`` (a key set to ``None`` goes)."""
        result: dict[str, Any] = await self.call(
            "session.update", {"sessionId": session_id, **params}, timeout=timeout
        )
        return result

    async def fork_session(
        self,
        session_id: str,
        at_message_id: str,
        new_session_id: str | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """``session.fork``: a new session of the lines up to ``at_message_id``."""
        params = {"sessionId": session_id, "atMessageId": at_message_id}
        if new_session_id is not None:
            params["newSessionId"] = new_session_id
        result: dict[str, Any] = await self.call("session.fork", params, timeout=timeout)
        return result

    async def batch(
        self, calls: list[tuple[str, dict[str, Any]]], *, timeout: float | None = None
    ) -> list[Any]:
        """Send calls as one JSON-RPC batch; return each result or its ``RemoteError``."""
        loop = asyncio.get_running_loop()
        ids = [next(self._ids) for _ in calls]
        futs = []
        for rid in ids:
            fut: asyncio.Future[Any] = loop.create_future()
            self._pending[rid] = fut
            futs.append(fut)
        body = [
            {"jsonrpc": "2.0", "id": rid, "method": m, "params": p}
            for rid, (m, p) in zip(ids, calls, strict=True)
        ]
        every = tuple(ids)
        self._batches.update((rid, every) for rid in ids)
        try:
            return await self._batch(body, ids, futs, timeout)
        finally:
            for rid in ids:
                self._batches.pop(rid, None)

    async def _batch(
        self,
        body: list[dict[str, Any]],
        ids: list[int],
        futs: list[asyncio.Future[Any]],
        timeout: float | None,
    ) -> list[Any]:
        """Send ``body`` and wait, one deadline for all, for the answers of ``futs``."""
        self._send(body)
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise HostGone(str(exc)) from None
        # One deadline for the whole batch; every call still unanswered then is cancelled.
        await asyncio.wait(futs, timeout=timeout or self.deadline)  # cancels nothing
        if any(not f.done() for f in futs):
            for rid, fut in zip(ids, futs, strict=True):
                if not fut.done():
                    self._pending.pop(rid, None)
                    fut.cancel()
                    with contextlib.suppress(ClientError, ConnectionError):
                        self._send(
                            {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": rid}}
                        )
            raise CallTimeout(f"batch of {len(ids)} got no full answer within its deadline")
        failed = [e for e in (f.exception() for f in futs) if e is not None]  # each one read
        if failed:  # HostGone if the host died; an answer this client cannot read
            raise failed[0]
        out: list[Any] = []
        for fut in futs:
            reply = fut.result()
            out.append(RemoteError(reply["error"]) if "error" in reply else reply.get("result"))
        return out

    async def close(self, timeout: float = 10.0) -> None:
        """End input (the host finishes in-flight calls and exits 0), then wait for it."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.close()
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                log.error("host did not exit within %.0f s of end of input: killed", timeout)
                self.proc.kill()
                await self.proc.wait()
        await self._task

    async def respawn(self) -> HostClient:
        """Start a new host like this one (after it died) and handshake it."""
        if self.spawn_args is None:
            raise ClientError("this client did not spawn its host: connect again instead")
        if self.proc is not None and self.proc.returncode is None:
            self.kill()
            await self.proc.wait()
        data_dir, log_path = self.spawn_args
        client = await HostClient.spawn(
            data_dir, log_path=log_path, deadline=self.deadline, args=self.spawn_extra
        )
        await client.handshake()
        return client

    def kill(self) -> None:
        """Kill the host process (tests and crash drills)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, 9)
