"""The persistence outbox (ADR 0041): rows go to the journal first, then to the host.

``enqueue`` returns once the entry is durable in the journal. A background task drains
entries in order into ``session.appendMessage``, as JSON-RPC batches of up to
:data:`BATCH` entries, so a backlog costs a round trip per batch, not per row. The host
deduplicates by message id, so replaying after a crash is safe: at least once in,
exactly once stored.

Answers: ok -> acknowledged; ``NOT_FOUND`` (the session is gone), ``INVALID_PARAMS``,
``CONFLICT`` or ``PARSE_ERROR`` with the row's id (the entry can never succeed) -> dropped:
set aside into
``<journal>.rejected`` with the reason, logged and reported to ``on_set_aside``; anything
else (``STORAGE_ERROR``, the host down or slow) -> retried with backoff, the session's
later entries held back so that its rows stay in order. ``enqueue`` refuses a row the host
could never store (:class:`~outbox._rows.RowRefused`); one an older journal still holds is
set aside the same way before it is ever sent, and the rows behind it go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import msgspec

from outbox._client import ClientError, HostClient, RemoteError
from outbox._journal import Entry, Journal
from outbox._rows import RowRefused

log = logging.getLogger("outbox")
BATCH = 256
BATCH_BYTES = 32 * 1024 * 1024  # a batch line stays well under the host's 64 MiB limit
# PARSE_ERROR with the row's id: the host could not read that message (nested a level past
# what its stack left it, outbox._rows.MAX_DEPTH), and never will: retried, it would hold
# every later row of its session back for good.
DROP = {"NOT_FOUND", "INVALID_PARAMS", "CONFLICT", "PARSE_ERROR"}
_ENC = msgspec.json.Encoder()


class DrainTimeout(Exception):
    """Raised when ``drain`` could not see every earlier entry acknowledged in time."""


class Outbox:
    """The durable queue between the app and the host."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.client: HostClient | None = None
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.backoff = (0.05, 2.0)
        self.stats = {"enqueued": 0, "acked": 0, "dropped": 0, "retries": 0, "batches": 0}
        self.on_ack: Callable[[Entry], None] | None = None
        self.on_set_aside: Callable[[Entry, str], None] | None = None
        self._retrying: set[str] = set()  # sessions whose first pending row failed

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, path: str) -> AsyncIterator[Outbox]:
        """Open the journal at ``path`` and run the drain task until closed."""
        async with Journal.open(path) as journal:
            box = cls(journal)
            box._task = asyncio.create_task(box._drain_loop())
            try:
                yield box
            finally:
                box._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await box._task

    def attach(self, client: HostClient | None) -> None:
        """Drain into ``client`` from now on (``None``: the host is down)."""
        self.client = client
        self._wake.set()

    async def connect(
        self, client: HostClient, *, keep: Sequence[str] = (), timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """The connect sequence on ``client``, before anything reads a transcript: the
        handshake, this outbox drained into it, then ``session.recoverInflightMessages``;
        return the rows it recovered (ADR 0153's amendment: the finished rows land first).

        ``keep``: on a reconnect while turns run (``TurnDriver.running()``), the sessions
        whose checkpoints are left for the finished rows still to come.
        """
        await client.handshake()
        self.attach(client)
        await self.drain(timeout)
        params = {"keep": list(keep)} if keep else {}
        recovered = await client.call("session.recoverInflightMessages", params)
        return list(recovered["recovered"])

    @property
    def depth(self) -> int:
        return len(self.journal.pending)

    async def enqueue(
        self, session_id: str, message: dict[str, Any] | bytes, turn_id: str | None = None
    ) -> Entry:
        """Persist a row for the host; returns once it is durable on disk.

        Raises :class:`~outbox._rows.RowRefused` (a ``ValueError``: no id, a bad id, a role
        outside the contract, nested or sized past the host's bounds, a value JSON cannot
        hold) for a row the host could never store, before anything is written.
        """
        try:
            raw = message if isinstance(message, bytes) else _ENC.encode(message)
        except (TypeError, ValueError) as exc:  # half a surrogate pair in a str, a set, ...
            raise RowRefused(f"row refused, it cannot be written as JSON: {exc}") from None
        entry = await self.journal.append(session_id, raw, turn_id)
        self.stats["enqueued"] += 1
        self._wake.set()
        return entry

    async def drain(self, timeout: float, session_id: str | None = None) -> None:
        """Return once every entry enqueued before now (of ``session_id``) is acknowledged."""
        upto = self.journal.next_seq - 1

        def done() -> bool:
            return not any(
                e.seq <= upto and (session_id is None or e.session_id == session_id)
                for e in self.journal.pending.values()
            )

        self._wake.set()
        try:
            async with asyncio.timeout(timeout):
                async with self._progress:
                    await self._progress.wait_for(done)
        except TimeoutError:
            left = sum(
                1
                for e in self.journal.pending.values()
                if e.seq <= upto and (session_id is None or e.session_id == session_id)
            )
            raise DrainTimeout(
                f"outbox not drained within {timeout:.1f} s: {left} entr(ies) still pending"
            ) from None

    async def _drain_loop(self) -> None:
        delay = self.backoff[0]
        while True:
            if not self.journal.pending or self.client is None or self.client.gone.is_set():
                self._wake.clear()
                await self._wake.wait()
                continue
            client = self.client
            if self.journal.refused:  # written before enqueue checked: never sent
                await self._set_aside(
                    [(self.journal.pending[seq], why) for seq, why in self.journal.refused.items()]
                )
                continue
            entries = self._next_batch()
            try:
                results = await client.batch(
                    [("session.appendMessage", _params(e)) for e in entries]
                )
                self.stats["batches"] += 1
            except ClientError as exc:
                log.warning("outbox: host unavailable (%s); retrying in %.2f s", exc, delay)
                self.stats["retries"] += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])
                continue
            failed, refused = self._settle(entries, results)
            if refused:
                await self._set_aside(refused)
            async with self._progress:
                self._progress.notify_all()
            if failed:
                self.stats["retries"] += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])
            else:
                delay = self.backoff[0]

    def _next_batch(self) -> list[Entry]:
        """The next entries in order: at most BATCH of them and BATCH_BYTES of message.

        A session whose last attempt failed sends only its first pending row until that
        lands, so its later rows cannot be stored ahead of it.
        """
        out: list[Entry] = []
        size = 0
        seen: set[str] = set()
        for e in sorted(self.journal.pending.values(), key=lambda e: e.seq):
            n = len(e.message) + 256
            if e.session_id in self._retrying and e.session_id in seen:
                continue
            if out and (len(out) >= BATCH or size + n > BATCH_BYTES):
                break
            seen.add(e.session_id)
            out.append(e)
            size += n
        return out

    def _settle(
        self, entries: list[Entry], results: list[Any]
    ) -> tuple[bool, list[tuple[Entry, str]]]:
        """Ack what landed; return whether a session is held back, and what to set aside."""
        held: set[str] = set()
        refused: list[tuple[Entry, str]] = []
        for entry, result in zip(entries, results, strict=True):
            if entry.session_id in held:
                continue
            if isinstance(result, RemoteError):
                if result.name in DROP:
                    refused.append((entry, f"the host refused it: {result}"))
                    self._retrying.discard(entry.session_id)
                    continue
                else:
                    log.warning("outbox: entry %d will be retried: %s", entry.seq, result)
                    held.add(entry.session_id)
                    self._retrying.add(entry.session_id)
                    continue
            else:
                self.stats["acked"] += 1
                self._retrying.discard(entry.session_id)
            self.journal.ack(entry.seq)
            if self.on_ack is not None:
                self.on_ack(entry)
        return bool(held), refused

    async def _set_aside(self, entries: list[tuple[Entry, str]]) -> None:
        """Move rows that can never be stored out of the queue, bytes kept, and report them.

        When the rejected file cannot be written (a full disk), they stay queued: the next
        pass tries again, and the rows behind them wait, as behind any failing write.
        """
        try:
            await self.journal.set_aside(entries)
        except OSError as exc:
            log.error("outbox: %d entr(ies) not set aside (%s): retried", len(entries), exc)
            await asyncio.sleep(self.backoff[1])
            return
        for entry, reason in entries:
            log.warning(
                "outbox: entry %d for session %s dropped, set aside in %s.rejected: %s",
                entry.seq,
                entry.session_id,
                self.journal.path,
                reason,
            )
            self.stats["dropped"] += 1
            if self.on_set_aside is not None:
                self.on_set_aside(entry, reason)
        async with self._progress:  # a drain may be waiting for just these
            self._progress.notify_all()


def _params(e: Entry) -> dict[str, Any]:
    p: dict[str, Any] = {"sessionId": e.session_id, "message": e.message}
    if e.turn_id is not None:
        p["turnId"] = e.turn_id
    return p
