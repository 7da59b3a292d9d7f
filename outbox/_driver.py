"""The turn driver: agent events in, durable rows and checkpoints out (ADR 0153).

Rows (the prompt aside, which ``beginTurn`` stores directly) go through the outbox.
The newest ``message_update`` snapshot is checkpointed at most every 1.5 s with a
trailing write; at ``message_end`` the finished snapshot is checkpointed, the session's
checkpoint state is settled only if no newer turn started during that write, and the
final row is enqueued. Tool rows and delegate replies are never checkpointed.

With ``publish=True`` every snapshot's new text also goes to the session's watchers at
once (``session.publish``, a notification: stored nowhere, answered never, issue 34), so
a second window follows a reply token by token, not from checkpoint to checkpoint:
``{"messageId", "delta"}`` when the text grew, ``{"messageId", "text"}`` when it changed
otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from outbox._client import ClientError, HostClient
from outbox._events import AgentEvent, Message, Notice, Outcome
from outbox._outbox import DrainTimeout, Outbox
from outbox._rows import RowRefused

log = logging.getLogger("outbox.driver")
CHECKPOINT_INTERVAL = 1.5
DRAIN_TIMEOUT = 10.0
QUIT_DRAIN = 2.0


class Clock(Protocol):
    """What the driver times its checkpoints with (tests pass a virtual one)."""

    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """The monotonic clock and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class Throttle:
    """Keep the newest snapshot; save at most every ``interval`` with a trailing write."""

    def __init__(
        self,
        save: Callable[[dict[str, Any]], Awaitable[None]],
        clock: Clock,
        interval: float = CHECKPOINT_INTERVAL,
    ) -> None:
        self._save = save
        self._clock = clock
        self.interval = interval
        self.latest: dict[str, Any] | None = None
        self._last = float("-inf")
        self._task: asyncio.Task[None] | None = None

    def update(self, snapshot: dict[str, Any]) -> None:
        """Note a newer snapshot; a write happens now or at the end of the interval."""
        self.latest = snapshot
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self.latest is not None:
            wait = self._last + self.interval - self._clock.now()
            if wait > 0:
                await self._clock.sleep(wait)
            snap, self.latest = self.latest, None
            if snap is None:
                return
            self._last = self._clock.now()
            await self._save(snap)

    async def flush(self) -> None:
        """Write the newest snapshot now, if one is waiting (quit)."""
        snap = self.latest
        self.cancel()
        if snap is not None:
            await self._save(snap)

    def cancel(self) -> None:
        """Drop a pending trailing write (``message_end`` writes the final one itself: a
        later flush must not write an older snapshot over it)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self.latest = None


@dataclass
class TurnState:
    """One running turn of the driver."""

    session_id: str
    turn_id: str
    throttle: Throttle
    stop: asyncio.Event = field(default_factory=asyncio.Event)


Emit = Callable[[Notice], None]


class TurnDriver:
    """Turns agent events into durable rows, checkpoints and turn ends.

    One driver serves every session of an app, one running turn per session:
    :meth:`begin` opens a turn (after the session's outbox drained), :meth:`run` consumes
    the runtime's events and ends the turn on the host, and ``emit`` hears a
    :class:`~outbox.Durable` notice for every message that may be shown as saved. The
    client must have run the connect sequence first (:meth:`Outbox.connect`; on a
    reconnect while turns run, with ``keep=driver.running()``).
    """

    def __init__(
        self,
        client: HostClient,
        outbox: Outbox,
        *,
        clock: Clock | None = None,
        emit: Emit | None = None,
        drain_timeout: float = DRAIN_TIMEOUT,
        publish: bool = False,
    ) -> None:
        self.client = client
        self.outbox = outbox
        self.clock = clock or RealClock()
        self.emit = emit or (lambda _e: None)
        self.drain_timeout = drain_timeout
        self.publish = publish
        self._shown: dict[str, tuple[str, str]] = {}  # session -> (message id, text) published
        self.active: dict[str, TurnState] = {}  # session -> its running turn
        self.inflight: dict[str, Throttle] = {}  # session -> the checkpoint state it keeps
        self._turn_ended = asyncio.Event()
        self.stats = {"checkpoints": 0, "turns": 0, "skipped_archives": 0, "rows": 0}

    def running(self) -> list[str]:
        """The sessions whose turn this driver still runs: a reconnect's
        ``session.recoverInflightMessages`` names them in ``keep`` (their finished rows are
        still to come; promoting their checkpoints would store the partials first)."""
        return sorted(self.active)

    async def enqueue(self, session_id: str, message: Message, turn_id: str) -> None:
        """Put a row of the turn in the outbox; return once it is durable there."""
        await self.outbox.enqueue(session_id, message, turn_id)
        self.stats["rows"] += 1
        self.emit({"event": "durable", "sessionId": session_id, "messageId": message["id"]})

    def _publish(self, st: TurnState, message: dict[str, Any]) -> None:
        """Send what the snapshot adds to the watchers (never waited for: see the doc)."""
        mid, text = str(message.get("id")), text_of(message)
        was_id, was = self._shown.get(st.session_id, ("", ""))
        if was_id == mid and text.startswith(was):
            if text == was:
                return
            data: dict[str, Any] = {"messageId": mid, "delta": text[len(was) :]}
        else:
            data = {"messageId": mid, "text": text}
        self._shown[st.session_id] = (mid, text)
        params = {"sessionId": st.session_id, "turnId": st.turn_id, "data": data}
        try:
            self.client.notify("session.publish", params)
        except ClientError as exc:
            log.debug("live text of %s not sent: %s", mid, exc)

    async def _checkpoint(self, st: TurnState, message: dict[str, Any]) -> None:
        try:
            res = await self.client.call(
                "session.saveInflightMessage",
                {"sessionId": st.session_id, "turnId": st.turn_id, "message": message},
            )
        except ClientError as exc:
            log.warning("checkpoint of %s not saved: %s", message.get("id"), exc)
            return
        if res.get("saved"):
            self.stats["checkpoints"] += 1
            self.emit(
                {
                    "event": "checkpoint",
                    "sessionId": st.session_id,
                    "messageId": message["id"],
                    "chars": len(text_of(message)),
                }
            )

    def _settle_if(self, st: TurnState) -> None:
        """Forget the session's checkpoint state unless a newer turn owns it now."""
        st.throttle.cancel()
        if self.inflight.get(st.session_id) is st.throttle:
            del self.inflight[st.session_id]

    async def begin(self, session_id: str, turn_id: str, prompt: Message | None) -> TurnState:
        """Open a turn after the session's outbox drained (no prompt ahead of a reply)."""
        await self.outbox.drain(self.drain_timeout, session_id)
        params: dict[str, Any] = {"sessionId": session_id, "turnId": turn_id}
        if prompt is not None:
            params["prompt"] = prompt
        await self.client.call("session.beginTurn", params)
        if prompt is not None:
            self.emit({"event": "durable", "sessionId": session_id, "messageId": prompt["id"]})
        st = TurnState(session_id, turn_id, Throttle(lambda m: self._checkpoint(st, m), self.clock))
        self.active[session_id] = st
        self.inflight[session_id] = st.throttle
        self.stats["turns"] += 1
        return st

    async def run(
        self, st: TurnState, events: AsyncIterator[AgentEvent], *, regenerate: bool = False
    ) -> Outcome:
        """Consume one turn's events, end the turn on the host; return how it ended.

        ``regenerate``: the turn replaces a cut reply (see :meth:`truncate_last_reply`);
        once it completes, its branch is archived (``session.saveActiveRevision``).

        A row ``enqueue`` refuses (:class:`~outbox._rows.RowRefused`: the host could never
        store it) ends the turn there: the runtime's stream is closed, the turn ended on the
        host as ``error`` (never left running, which would make the session ``AGENT_BUSY``),
        and the refusal raised, for the app to keep the row or tell the user. A row the
        journal cannot take (``OSError``: a full disk) ends it the same way, as a crash
        (``aborted``, its checkpoint promoted), and the error is raised.
        """
        try:
            return await self._run(st, events, regenerate)
        except (RowRefused, OSError) as exc:
            outcome: Outcome = "error" if isinstance(exc, RowRefused) else "crashed"
            log.error(
                "turn %s of session %s ends (%s): %s", st.turn_id, st.session_id, outcome, exc
            )
            aclose = getattr(events, "aclose", None)  # an async generator's: its cleanup runs
            if aclose is not None:
                await aclose()
            await self.end(st, outcome)
            raise

    async def _run(
        self, st: TurnState, events: AsyncIterator[AgentEvent], regenerate: bool
    ) -> Outcome:
        outcome: Outcome = "crashed"  # a stream that ends without agent_end: the runtime is gone
        async for ev in events:
            if ev["type"] == "message_update":
                self._update(st, ev.get("message"))
            elif ev["type"] == "message_end":
                if m := ev.get("message"):
                    if m.get("role") == "assistant" and not m.get("delegate"):
                        st.throttle.cancel()
                        await self._checkpoint(st, m)
                        self._settle_if(st)
                    await self.enqueue(st.session_id, m, st.turn_id)
            elif ev["type"] == "tool_execution_end":
                await self.enqueue(st.session_id, ev["row"], st.turn_id)
            elif ev["type"] == "agent_end":
                outcome = ev["reason"]
                break
        await self.end(st, outcome)
        if regenerate and outcome == "completed":
            await self.save_active(st.session_id)
        return outcome

    def _update(self, st: TurnState, m: Any) -> None:
        """A streaming reply's newest state: throttled to a checkpoint, and published."""
        if m and m.get("role") == "assistant" and not m.get("delegate"):
            if self.active.get(st.session_id) is st:
                # A later reply of the same turn (after a tool call or a retry,
                # the first one's message_end settled it): quit flushes it too.
                self.inflight[st.session_id] = st.throttle
            st.throttle.update(m)
            if self.publish:
                self._publish(st, m)

    async def end(self, st: TurnState, outcome: Outcome) -> None:
        """End the turn on the host as ``outcome`` says."""
        if outcome == "crashed":
            await st.throttle.flush()
            params = {"status": "aborted", "recoverInflight": True}
            # The promoted checkpoint is appended at once: the turn's rows still queued
            # (tool rows, its finished reply) must be stored first, or they land after it
            # and the finished reply is deduplicated behind an aborted copy. Not drained in
            # time: a plain abort, and the connect sequence settles it in order later.
            try:
                await self.outbox.drain(self.drain_timeout, st.session_id)
            except DrainTimeout:
                params = {"status": "aborted"}
        elif outcome == "stopped":
            params = {"status": "aborted"}
        elif outcome == "error":
            params = {"status": "error"}
        else:
            params = {"status": "completed"}
        self._settle_if(st)
        await self.client.call(
            "session.endTurn", {"sessionId": st.session_id, "turnId": st.turn_id, **params}
        )
        if self.active.get(st.session_id) is st:
            del self.active[st.session_id]
        self._turn_ended.set()

    async def save_active(self, session_id: str) -> None:
        """Archive a finished regenerate branch, after the drain (ADR 0060)."""
        try:
            await self.outbox.drain(self.drain_timeout, session_id)
        except DrainTimeout as exc:
            self.stats["skipped_archives"] += 1
            log.warning("archive of session %s skipped: %s", session_id, exc)
            return
        await self.client.call("session.saveActiveRevision", {"sessionId": session_id})

    async def truncate_last_reply(self, session_id: str) -> tuple[str, list[str]] | None:
        """Cut the last reply away for a regenerate; return ``(prompt id, cut ids)``.

        The session's outbox drains first: a reply row still in it would otherwise land
        after the cut, in the branch it was cut from. Its acks are then fsynced: a power
        cut that lost one would replay a cut row after the cut, where the host no longer
        has its id to see it is a repeat.
        """
        await self.outbox.drain(self.drain_timeout, session_id)
        await self.outbox.journal.sync_acks()
        page = await self.client.call("session.get", {"sessionId": session_id, "limit": 64})
        msgs = page["messages"]
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        if not users or users[-1] == len(msgs) - 1:
            return None
        root = users[-1]
        cut = [m["id"] for m in msgs[root + 1 :]]
        await self.client.call(
            "session.truncateFrom", {"sessionId": session_id, "fromMessageId": cut[0]}
        )
        self.emit({"event": "cut", "sessionId": session_id, "messageIds": cut})
        return msgs[root]["id"], cut

    async def quit(self, stop_agents: Callable[[], None], wait: float = QUIT_DRAIN) -> None:
        """Flush checkpoints, abort active turns, wait (bounded) for their rows to drain."""
        deadline = self.clock.now() + wait
        for throttle in list(self.inflight.values()):
            await throttle.flush()
        stop_agents()
        # The aborted rows are enqueued by the turns as they end: wait for them to end,
        # then for their rows to drain, all within the one bound.
        while self.active:
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    await self._turn_ended.wait()
            except TimeoutError:
                break
            self._turn_ended.clear()
        with contextlib.suppress(DrainTimeout):
            await self.outbox.drain(max(0.0, deadline - self.clock.now()))


def text_of(message: dict[str, Any]) -> str:
    """The text a message shows (string content, or its text blocks joined)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""
