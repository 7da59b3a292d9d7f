"""Follow a session as it changes (``session.watch``, issue 34), across resets and reconnects.

:meth:`HostClient.watch` returns a :class:`Watch`: an async iterator of the session's
events, each a dict with its ``kind`` and the ``cursor`` just after it. What it yields
rebuilds the session exactly: a ``snapshot`` (every line, read with ``session.get``) to
start from, then ``appended`` lines, ``turn`` changes, ``checkpoint``\\ s and ``live``
data as the host applies them, and a new ``snapshot`` whenever the host says ``reset``
(the transcript was rewritten). Nothing is yielded twice and nothing is skipped:

- a snapshot is taken at a cursor: the watch asks for the cursor, reads the lines before
  it, then watches from it; the host honours that cursor only if no rewrite came between
  (the same epoch), else it answers with a newer one and the watch reads again;
- a ``reset`` for an ``overflow`` (the client fell behind) needs no read: the watch
  resumes from the cursor it was given, and the host replays what was dropped;
- when the connection is lost, the watch resumes on a new one (``reconnect``) from the
  cursor of the last event it yielded; a host restart or power cut in between changes
  nothing to that (the cursor names what is on disk).

A ``deleted`` event ends the iteration; so does :meth:`Watch.aclose` (or leaving an
``async for`` with ``break``), which ends the watch on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from outbox._client import ClientError, HostGone, RemoteError

if TYPE_CHECKING:
    from outbox._client import HostClient, Inbox

log = logging.getLogger("outbox.watch")
PAGE = 512  # lines a snapshot reads per session.get
RECONNECT_FOR = 60.0
"""Seconds the default reconnect keeps trying the socket before it gives up (HostGone)."""


def reconnect_to(
    path: str, deadline: float, patience: float | None = RECONNECT_FOR
) -> Callable[[], Awaitable[HostClient]]:
    """A reconnect that dials ``path`` again (and handshakes) until it answers, for at most
    ``patience`` seconds (``None``: for ever, as ``tail -F``)."""

    async def again() -> HostClient:
        from outbox._client import HostClient

        loop = asyncio.get_running_loop()
        give_up = None if patience is None else loop.time() + patience
        delay = 0.02
        while True:
            try:
                client = await HostClient.connect(path, deadline=deadline)
                try:
                    await client.handshake(timeout=RECONNECT_FOR)  # a long start-up recovery
                except HostGone:  # it died again while starting: dial again
                    await client.close()
                    raise ConnectionResetError("the host went away before answering") from None
                except ClientError:
                    await client.close()
                    raise
                return client
            except OSError as exc:
                if give_up is not None and loop.time() > give_up:
                    raise HostGone(f"no host on {path} for {patience:.0f} s: {exc}") from None
                await asyncio.sleep(delay)  # a restarting host: try again, backing off
                delay = min(1.0, delay * 2)

    return again


async def read_lines(client: HostClient, session_id: str, total: int) -> list[dict[str, Any]]:
    """The session's first ``total`` lines, a page at a time from the end."""
    out: list[dict[str, Any]] = []
    end, page = total, PAGE
    while end > 0:
        try:
            got = await client.call(
                "session.get", {"sessionId": session_id, "beforeLine": end, "limit": min(page, end)}
            )
        except RemoteError as exc:
            if exc.name == "LIMIT_EXCEEDED" and page > 1:  # big lines: smaller pages
                page //= 2
                continue
            raise
        if not got["messages"]:
            break  # shorter than the cursor says: the watch from it will say reset
        out[:0] = got["messages"]
        end = got["startLine"]
    return out


class Watch:
    """One session followed (see the module's doc); iterate it with ``async for``."""

    def __init__(
        self,
        client: HostClient,
        session_id: str,
        *,
        after: str | None = None,
        reconnect: Callable[[], Awaitable[HostClient]] | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.cursor = after
        """The cursor after the last event yielded: resume from it (``after=``)."""
        if reconnect is None and client.socket_path is not None:
            reconnect = reconnect_to(client.socket_path, client.deadline)
        self.reconnect = reconnect
        self.resets = 0  # snapshots read again after a reset (for tests and logs)
        self.overflows = 0  # resumes after falling behind (the host's or the inbox's bound)
        self.reconnects = 0
        self._reread = after is None
        self._total = 0
        self._wid: str | None = None
        self._inbox: Inbox | None = None
        self._yielded = False
        self._done = False
        self._owned: HostClient | None = None  # a client it connected itself: it closes it

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while not self._done:
            try:
                if self._inbox is None:
                    snapshot = await self._start()
                    if snapshot is not None:
                        return self._out(snapshot)
                    continue
                params = await self._inbox.get()
            except HostGone:
                await self._reconnected()
                continue
            except RemoteError as exc:
                if exc.name != "NOT_FOUND" or not self._yielded:
                    raise
                self._done = True
                return self._out({"kind": "deleted", "cursor": self.cursor})
            event = {**params["event"], "cursor": params["cursor"]}
            kind = event["kind"]
            if kind == "reset":
                await self._drop()
                self.cursor = params["cursor"]
                self._reread = event["reason"] != "overflow"
                self._total = event["totalLines"]
                self.resets += self._reread
                self.overflows += not self._reread
                continue
            self.cursor = params["cursor"]
            if kind == "deleted":
                await self._drop()
                self._done = True
            return self._out(event)
        await self._close_owned()
        raise StopAsyncIteration

    def _out(self, event: dict[str, Any]) -> dict[str, Any]:
        self._yielded = True
        return event

    async def _start(self) -> dict[str, Any] | None:
        """Watch from the cursor, reading the lines before it first when they must be;
        return the snapshot once the host honoured its cursor."""
        client, sid = self.client, self.session_id
        messages: list[dict[str, Any]] = []
        if self._reread:
            if self.cursor is None:  # where the session stands now, to read it at
                fresh = await client.start_watch(sid, None)
                client.inboxes.pop(fresh["watchId"], None)
                await client.call("session.unwatch", {"watchId": fresh["watchId"]})
                self.cursor, self._total = fresh["cursor"], fresh["totalLines"]
            messages = await read_lines(client, sid, self._total)
        res = await client.start_watch(sid, self.cursor)
        self._wid = res["watchId"]
        self._inbox = client.inboxes[self._wid]
        if not self._reread:
            return None
        if res["cursor"] != self.cursor:  # rewritten meanwhile: its reset comes first
            return None
        self._reread = False
        return {
            "kind": "snapshot",
            "messages": messages,
            "totalLines": self._total,
            "cursor": self.cursor,
        }

    async def _drop(self) -> None:
        """Forget the host's watch (ended by its reset, or by us)."""
        wid, self._wid, self._inbox = self._wid, None, None
        if wid is None:
            return
        self.client.inboxes.pop(wid, None)
        if not self.client.gone.is_set():
            with contextlib.suppress(ClientError):
                await self.client.call("session.unwatch", {"watchId": wid})

    async def _reconnected(self) -> None:
        self._wid, self._inbox = None, None
        if self.reconnect is None:
            raise HostGone("the host went away and this watch has no way to reconnect")
        log.info("watch of %s: connection lost, resuming after %s", self.session_id, self.cursor)
        await self._close_owned()
        self.client = self._owned = await self.reconnect()
        self.reconnects += 1

    async def aclose(self) -> None:
        """End the watch (on the host too); iteration stops."""
        self._done = True
        await self._drop()
        await self._close_owned()

    async def _close_owned(self) -> None:
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.close()
