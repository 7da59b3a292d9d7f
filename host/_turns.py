"""Turns and the settlement of streaming checkpoints (ADR 0153 and its amendment).

A turn is ``running`` until ``endTurn``; one per session at a time. A checkpoint is
settled by whichever comes first: the final ``appendMessage`` of its id (removes it),
``endTurn`` (``completed``/``error`` remove it only once its row is indexed; ``aborted``
with ``recoverInflight`` promotes it), ``recoverInflightMessages``, or the next start.
Promotion never writes an empty assistant row.
"""

from __future__ import annotations

import logging

from msgspec import UNSET, Raw

from host._checkpoints import Checkpoint
from host._errors import AgentBusy, InvalidParams, NotFound
from host._fs import completed
from host._messages import Head, Message, Status, incoming_head, parse_incoming, parse_stored
from host._recovery import quarantine
from host._session import Session
from host._sessions import SessionMethods
from host._store import Registry
from host._wire import (
    BeginTurnParams,
    BeginTurnResult,
    EndTurnParams,
    EndTurnResult,
    RecoveredRow,
    RecoverParams,
    RecoverResult,
    SavedResult,
    SaveInflightParams,
)

log = logging.getLogger("host.turns")


class TurnMethods:
    """Handlers of the turn and checkpoint methods."""

    def __init__(self, registry: Registry, sessions: SessionMethods) -> None:
        self.registry = registry
        self.sessions = sessions

    # -- turns ----------------------------------------------------------------------

    async def begin_turn(self, p: BeginTurnParams) -> BeginTurnResult:
        prompt = parse_incoming(p.prompt, "prompt") if isinstance(p.prompt, Raw) else None
        if prompt is not None and prompt.head.role != "user":
            raise InvalidParams(f"prompt must be a user message, not role {prompt.head.role!r}")
        sid, tid = p.session_id, p.turn_id
        s = await self.registry.open(sid)
        if s.turn(tid) is not None:  # the same turn again
            return await self._again(s, tid, prompt)
        running = await s.running_turn()
        if running is not None:
            raise AgentBusy(f"turn {running!r} is running in session {sid!r}", turnId=running)
        cp = s.checkpoint()
        if cp is not None and cp.turn_id != tid:  # a leftover of an ended turn
            await self._settle_leftover(sid)
        # The turn is logged with its prompt's id first: a start that finds it running
        # without that prompt stored forgets it (void), so the call is all or nothing.
        await s.record_turn(tid, "running", prompt.id if prompt else None)
        if prompt is None:
            return BeginTurnResult(turn_id=tid)
        try:
            line, _ = await self.sessions.append_locked(s, prompt, tid)
        except BaseException:
            await completed(s.record_turn(tid, "void"))
            raise
        await s.prompt_stored(tid)
        return BeginTurnResult(turn_id=tid, line=line)

    async def _again(self, s: Session, tid: str, prompt: Message | None) -> BeginTurnResult:
        """``beginTurn`` of a turn that exists: a no-op, unless its turn has no prompt (the
        first call died between its turn row and its prompt: answering the retry as a no-op
        would lie)."""
        row = await s.lookup(prompt.id) if prompt else None
        if prompt is not None and row is None and not await s.has_prompt(tid):
            line, _ = await self.sessions.append_locked(s, prompt, tid)
            await s.prompt_stored(tid)
            return BeginTurnResult(turn_id=tid, line=line)
        return BeginTurnResult(turn_id=tid, line=row.line if row else UNSET)

    async def end_turn(self, p: EndTurnParams) -> EndTurnResult:
        sid, tid = p.session_id, p.turn_id
        s = await self.registry.open(sid)
        status = s.turn(tid)
        if status is None:
            raise NotFound("turn", tid)
        if status != "running":  # ending an ended turn changes nothing
            return EndTurnResult(status=status, recovered=False)
        recovered = False
        cp = s.checkpoint()
        if p.status in ("completed", "error"):
            if cp is not None and await s.lookup(cp.message_id):
                await s.remove_checkpoint()
        elif p.recover_inflight and cp is not None and cp.turn_id == tid:
            recovered = await self.promote(s, cp, "aborted") is not None
        await s.record_turn(tid, p.status)
        return EndTurnResult(status=p.status, recovered=recovered)

    async def settle_for_cut(self, s: Session) -> None:
        """Before a cut (ADR 0216): end a running turn ``aborted`` and settle any checkpoint.

        A running turn's checkpoint is promoted ``aborted``; a leftover of an ended turn
        (a user Stop whose final row never came) is promoted as ``recoverInflight`` would.
        Either way the row is placed before the cut, so a cut that removes it archives it
        with its branch, instead of it landing after the next conversation later.
        """
        tid = await s.running_turn()
        cp = s.checkpoint()
        if cp is not None and cp.turn_id != tid:  # a leftover of an ended turn
            await self._settle_leftover(s.id)
        elif cp is not None:
            await self.promote(s, cp, "aborted")
        if tid is not None:
            await s.record_turn(tid, "aborted")
            log.info("session %s: running turn %s ended aborted by a truncation", s.id, tid)

    # -- checkpoints ----------------------------------------------------------------

    async def save_inflight(self, p: SaveInflightParams) -> SavedResult:
        """Replace the session's checkpoint with ``p.message`` (ADR 0153).

        The file's bytes are the message's own, framed (no copy to encode them), written
        durably into the spare and swapped in: on the loop while fsyncs are fast and it
        is up to 1 MiB, as an append's (:meth:`Registry.durably`).
        """
        head = incoming_head(p.message)
        s = await self.registry.open(p.session_id)
        try:
            old = s.checkpoint_ids()
        except ValueError:
            s.checkpoint()  # quarantines the corrupt file
            old = None
        if self._late(s, head):
            return SavedResult(saved=False)
        if old is not None and old[0] != p.turn_id:
            if s.turn(old[0]) == "running":
                return await self._beside_running(s, p)
            await self._settle_leftover(s.id)  # never overwrite
        await s.save_checkpoint(p.turn_id, head.id, p.message)
        self.registry.count("checkpoints.saved")
        return SavedResult(saved=True)

    def _late(self, s: Session, head: Head) -> bool:
        """Whether the snapshot's message is stored already: a late write never resurrects
        a final row (no thread hop per snapshot)."""
        if s.lookup_now([head.id]):
            self.registry.count("checkpoints.dropped_late")
            return True
        return False

    async def _beside_running(self, s: Session, p: SaveInflightParams) -> SavedResult:
        """Another turn's snapshot while the file holds the running turn's checkpoint.

        Settling that checkpoint as a leftover would end the running turn and store its
        partial, and its finished reply would then be deduplicated away. So it stays, and
        this snapshot is settled at once instead: a late one of an ended turn (the finished
        one, sent at ``message_end``, may be its only copy) is appended as its turn's row,
        as settling it later would; one of a turn the session has no record of is dropped.
        """
        turn = s.turn(p.turn_id)
        msg = parse_incoming(p.message)
        if turn is None or not msg.has_content():  # nor ever an empty assistant row
            self.registry.count("checkpoints.dropped")
            return SavedResult(saved=False)
        status: Status = "complete" if turn == "completed" else "aborted"
        await self.sessions.append_locked(s, msg.with_status(status), p.turn_id)
        self.registry.count("checkpoints.promoted")
        return SavedResult(saved=True)

    async def promote(self, s: Session, cp: Checkpoint, status: Status) -> RecoveredRow | None:
        """Append the checkpoint as a row with ``status``; ``None`` when it was dropped."""
        sid = s.id
        msg = parse_stored(bytes(cp.message))
        why = None
        if msg is None:
            why = "not a valid message"
        elif await s.lookup(msg.id) is not None:
            why = "its row is already stored"
        elif not msg.has_content():
            why = "it is empty (an empty reply breaks every later model call)"
        if msg is None:
            quarantine(self.registry, sid, [(-1, 0, bytes(cp.message), "checkpoint: " + str(why))])
        if msg is None or why is not None:
            log.warning("session %s: checkpoint of %s dropped: %s", sid, cp.message_id, why)
            self.registry.count("checkpoints.dropped")
            await s.remove_checkpoint()
            return None
        await self.sessions.append_locked(s, msg.with_status(status), cp.turn_id)
        log.info("session %s: checkpoint of %s promoted as %s", sid, msg.id, status)
        self.registry.count("checkpoints.promoted")
        return RecoveredRow(session_id=sid, message_id=msg.id, turn_id=cp.turn_id, status=status)

    async def recover_inflight(self, p: RecoverParams) -> RecoverResult:
        """Settle every session's leftover checkpoint, each under its session's lock, but
        those of ``keep``: sessions whose turn the caller still runs (a reconnect after the
        host died mid-reply), whose finished row is still to come and must win."""
        keep = set(p.keep) if isinstance(p.keep, list) else set()
        out: list[RecoveredRow] = []
        for sid in self.registry.with_checkpoints():
            if sid in keep:
                continue
            async with self.registry.hold(sid):
                row = await self._settle_leftover(sid)
                if row is not None:
                    out.append(row)
        return RecoverResult(recovered=out)

    async def _settle_leftover(self, sid: str) -> RecoveredRow | None:
        try:
            s = await self.registry.open(sid)
        except NotFound:
            log.warning("checkpoint of absent session %s removed", sid)
            await self.registry.drop_checkpoint(sid)
            return None
        cp = s.checkpoint()
        if cp is None:
            return None
        turn = s.turn(cp.turn_id)
        if turn == "completed":
            return await self.promote(s, cp, "complete")
        row = await self.promote(s, cp, "aborted")
        if turn == "running":
            await s.record_turn(cp.turn_id, "aborted")
        return row
