"""The ``session.*`` methods of the transcript itself: create, list, delete, read, write.

Each method that reads then writes holds the session's lock from its first read to its
last write (house rule 5), so a line appended between some caller's read and its write
can never be overwritten: every rewrite re-reads the file inside the lock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from msgspec import UNSET, Raw

from host._errors import Conflict, HostError, LimitExceeded, NotFound
from host._index import Row
from host._messages import (
    Message,
    pager_from_json,
    parse_all,
    parse_incoming,
    parse_stored,
)
from host._session import NewLine, Session
from host._store import Registry
from host._transcript import Piece
from host._wire import (
    ENCODER,
    MAX_LINE,
    AppendParams,
    AppendResult,
    CountDeletedResult,
    CountResult,
    CreateParams,
    CreateResult,
    DeleteMessagesParams,
    DeleteResult,
    GetParams,
    GetResult,
    LineResult,
    ReplaceParams,
    SessionParams,
    UpdateParams,
)

log = logging.getLogger("host.sessions")


class SessionMethods:
    """Handlers of the transcript methods; turns, revisions and checkpoints extend them."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    # -- lifecycle ------------------------------------------------------------------

    async def create(self, p: CreateParams) -> CreateResult:
        sid = p.session_id
        assert isinstance(sid, str)  # the service names an unnamed session
        title = p.title if isinstance(p.title, str) else None
        if sid not in self.registry.sessions and (twin := await self.registry.case_twin(sid)):
            raise Conflict(
                f"session {twin!r} exists: an id that differs from it only in case would"
                " be the same file on a case-insensitive file system",
                sessionId=twin,
            )
        return CreateResult(session_id=sid, created=await self.registry.create(sid, title))

    async def delete(self, p: SessionParams) -> DeleteResult:
        await self.registry.delete(p.session_id)
        return DeleteResult(deleted=True)

    # -- reads ----------------------------------------------------------------------

    async def get(self, p: GetParams) -> GetResult:
        s = await self.registry.open(p.session_id)
        total = s.line_count
        end = total if p.before_line is UNSET else min(p.before_line, total)
        start = 0 if p.limit is UNSET else max(0, end - p.limit)
        rows = await s.rows(start, end) if end > start else []
        cap = p.display_cap if isinstance(p.display_cap, int) else None
        # What the answer can hold: a capped line is about its cap (short fields are
        # never clipped: allow slack); the encoded answer is checked again at the end.
        size = sum(r.length + 1 if cap is None else min(r.length, 2 * cap + 4096) for r in rows)
        if size > MAX_LINE:
            raise LimitExceeded(
                f"lines {start}-{end} hold {size} bytes, over the 64 MiB result limit:"
                " page with limit/beforeLine",
                limit=MAX_LINE,
            )
        if cap is None:  # views of one read: the page is held once, then its answer
            lines = await s.read_raw(rows)
        else:  # read in bounded runs, capping as it goes: memory follows the answer
            lines = []
            run: list[Row] = []
            for r in rows:
                if r.length <= cap:
                    run.append(r)
                    if len(run) == 1024:
                        lines += await s.read_raw(run)
                        run = []
                    continue
                lines += await s.read_raw(run)
                run = []
                capped = await s.read_capped(r, cap, _host_fields(r))
                lines.append(Raw(capped))
            lines += await s.read_raw(run)
        return GetResult(messages=lines, start_line=start, end_line=end, total_lines=total)

    # -- writes ---------------------------------------------------------------------

    async def append_message(self, group: list[AppendParams]) -> list[AppendResult | Exception]:
        """Append the messages of calls queued one right behind another with one write and
        one fsync (group commit, ``host._locks``); an answer for each, in their order: a
        refused message's error is its own, a failed write's is every stored one's."""
        work = [_Append.parse(p) for p in group]
        appends = [a for a in work if isinstance(a, _Append)]
        try:
            if appends:
                s = await self.registry.open(group[0].session_id)
                await self._append_group(s, appends, defer_index=True)
        except Exception as exc:
            return [exc if isinstance(a, _Append) else a for a in work]
        return [a if isinstance(a, HostError) else a.result() for a in work]

    async def _append_group(
        self, s: Session, group: list[_Append], *, defer_index: bool = False
    ) -> None:
        """Append every message of ``group`` not yet stored, with one write and one fsync.

        ``defer_index``: the call ends here, so its rows may be committed after the answer.
        """
        fresh, new = self._plan(s, group)
        self._done(group, fresh, await s.append(new, defer_index=defer_index))
        for a in group:  # a checkpoint of a message now stored goes (ADR 0153)
            if s.checkpoint_holds(a.msg.id):
                await s.remove_checkpoint()
        if len(group) > 1:
            self.registry.count("appends.grouped", len(group))

    def _plan(self, s: Session, group: list[_Append]) -> tuple[list[_Append], list[NewLine]]:
        """The calls of ``group`` whose message is not stored yet, and their lines."""
        stored = s.lookup_now([a.msg.id for a in group])
        fresh: list[_Append] = []
        for a in group:
            if a.msg.id in stored:
                a.line, a.appended = stored[a.msg.id], False
            else:
                stored[a.msg.id] = -1  # a repeat later in the same group is a replay
                fresh.append(a)
        return fresh, [NewLine.of(a.msg, a.turn_id) for a in fresh]

    def _done(self, group: list[_Append], fresh: list[_Append], lines: list[int]) -> None:
        """Give each call of ``group`` its line, once ``fresh``'s are stored at ``lines``."""
        for a, line in zip(fresh, lines, strict=True):
            a.line, a.appended = line, True
        for a in group:
            if a.line < 0:
                a.line = next(b.line for b in fresh if b.msg.id == a.msg.id)
            if not a.appended:
                self.registry.count("appends.deduplicated")

    async def append_locked(
        self, s: Session, msg: Message, turn_id: str | None
    ) -> tuple[int, bool]:
        """Append ``msg`` unless its id is stored (at least once in, exactly once stored).

        The index rows are committed before this returns (a failure cuts the line back),
        since the caller's call goes on and must not outlive a failed commit.
        """
        a = _Append(msg, turn_id)
        await self._append_group(s, [a])
        return a.line, a.appended

    async def update_message(self, p: UpdateParams) -> LineResult:
        msg = parse_incoming(p.message)
        s = await self.registry.open(p.session_id)
        row = await s.lookup(msg.id)
        if row is None:
            raise NotFound("message", msg.id)
        old = await s.read_row(row)  # re-read inside the lock
        stored = parse_stored(old)
        turn_id = (stored.turn_id if stored else None) or msg.turn_id
        pager = stored.pager() if stored else {}
        nl = NewLine.of(msg, turn_id, pager)
        if nl.data != old:
            await s.rewrite_line(row, nl.row(row.line, row.offset), nl.data)
        return LineResult(line=row.line)

    async def delete_messages(self, p: DeleteMessagesParams) -> CountDeletedResult:
        s = await self.registry.open(p.session_id)
        doomed = set(p.message_ids)
        rows = await s.rows()
        kept = [r for r in rows if r.message_id not in doomed]
        deleted = len(rows) - len(kept)
        if deleted:
            pieces, new_rows = _compact(kept)
            await s.rewrite(pieces, new_rows)
        return CountDeletedResult(deleted=deleted)

    async def replace_messages(self, p: ReplaceParams) -> CountResult:
        msgs = parse_all(p.messages)
        s = await self.registry.open(p.session_id)
        old = {r.message_id: r for r in await s.rows()}
        pieces: list[Piece] = []
        rows: list[Row] = []
        pos = 0
        for i, m in enumerate(msgs):
            prev = old.get(m.id)
            turn_id = (prev.turn_id if prev else None) or m.turn_id
            nl = NewLine.of(m, turn_id, pager_from_json(prev.pager) if prev else {})
            pieces.append(nl.data + b"\n")
            rows.append(nl.row(i, pos))
            pos += len(nl.data) + 1
        await s.rewrite(pieces, rows)
        return CountResult(count=len(msgs))


def _host_fields(row: Row) -> dict[str, bytes]:
    """The host-owned fields of a stored line as the index holds them (a capped copy's,
    when its walk stops before them)."""
    out = {"id": ENCODER.encode(row.message_id), "role": ENCODER.encode(row.role)}
    if row.turn_id is not None:
        out["turnId"] = ENCODER.encode(row.turn_id)
    out["status"] = ENCODER.encode(row.status)
    out.update((k, bytes(v)) for k, v in pager_from_json(row.pager).items())
    return out


def _compact(kept: Sequence[Row]) -> tuple[list[Piece], list[Row]]:
    """Pieces that copy ``kept`` rows (merging neighbours) and their renumbered rows."""
    pieces: list[Piece] = []
    rows: list[Row] = []
    pos = 0
    for i, r in enumerate(kept):
        last = pieces[-1] if pieces else None
        if isinstance(last, tuple) and last[0] + last[1] == r.offset:
            pieces[-1] = (last[0], last[1] + r.length + 1)
        else:
            pieces.append((r.offset, r.length + 1))
        rows.append(r._replace(line=i, offset=pos))
        pos += r.length + 1
    return pieces, rows


GROUP = 512  # appends written with one fsync at most


class _Append:
    """One ``appendMessage`` call's work, done in its group."""

    __slots__ = ("appended", "line", "msg", "turn_id")

    @classmethod
    def parse(cls, p: AppendParams) -> _Append | HostError:
        """The call's work, or its answer when its message is refused."""
        try:
            msg = parse_incoming(p.message)
        except HostError as exc:
            return exc
        return cls(msg, p.turn_id if isinstance(p.turn_id, str) else msg.turn_id)

    def __init__(self, msg: Message, turn_id: str | None) -> None:
        self.msg = msg
        self.turn_id = turn_id
        self.line = -1
        self.appended = False

    def result(self) -> AppendResult:
        return AppendResult(line=self.line, appended=self.appended)
