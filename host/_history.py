"""The regenerate pager and host-side truncation (ADR 0060, ADR 0216).

Every call here reads the transcript, archives a branch and stamps or cuts it inside one
hold of the session's lock: no transcript snapshot crosses the process boundary, so an
append can never be overwritten by a stale copy. A root's *branch* is every message after
it up to the next user message. Multi-file changes are written down first as an intent
(see :mod:`host._intents`) so a crash at any instant ends in the old state or the new one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Sequence

from msgspec import UNSET, Raw

from host._archive import ArchiveDamaged, Revision
from host._errors import AgentBusy, Conflict, InvalidParams, NotFound
from host._fs import on_thread
from host._index import Row, now_iso
from host._intents import Change, Cut
from host._messages import Message, parse_all, parse_stored
from host._recovery import stored_row
from host._session import NewLine, Session
from host._sessions import SessionMethods
from host._store import Registry
from host._transcript import Piece
from host._turns import TurnMethods
from host._wire import (
    ENCODER,
    ActivateParams,
    ActivateResult,
    ListRevisionsParams,
    ListRevisionsResult,
    Pager,
    RevisionInfo,
    SaveActiveParams,
    SaveActiveResult,
    SaveRevisionParams,
    SaveRevisionResult,
    TruncateParams,
    TruncateResult,
)

log = logging.getLogger("host.history")
Hook = Callable[[str], Awaitable[None]]


def _pager(root_id: str, count: int, active: int) -> dict[str, Raw]:
    return {
        "revisionRootId": Raw(ENCODER.encode(root_id)),
        "revisionCount": Raw(ENCODER.encode(count)),
        "activeRevision": Raw(ENCODER.encode(active)),
    }


def _slot(active: int | None, count: int) -> int:
    """Where a root's branch is archived: its active revision, else a new one."""
    return active if active is not None and 0 <= active < count else count


def _stamp_of(msg: Message) -> tuple[int, int | None]:
    """The root's pager as it stands: ``(revisionCount, activeRevision)``."""
    count = msg.head.revision_count
    active = msg.head.active_revision
    return (
        count if isinstance(count, int) else 0,
        active if isinstance(active, int) else None,
    )


class HistoryMethods:
    """Handlers of the revision and truncation methods."""

    def __init__(self, registry: Registry, sessions: SessionMethods, turns: TurnMethods) -> None:
        self.registry = registry
        self.sessions = sessions
        self.turns = turns
        self.hook: Hook | None = None  # tests pause a call at a named point with this

    async def _at(self, point: str) -> None:
        if self.hook is not None:
            await self.hook(point)

    # -- helpers (all under the session's lock) -------------------------------------

    async def _root(self, s: Session, root_id: str) -> tuple[Row, Message]:
        row = await s.lookup(root_id)
        if row is None:
            raise NotFound("message", root_id)
        if row.role != "user":  # the pager is stamped on a user root only
            raise InvalidParams(f"rootId {root_id!r} is not a user message (role {row.role!r})")
        msg = parse_stored(await s.read_row(row))
        assert msg is not None, "indexed lines are valid messages"
        return row, msg

    async def _branch(self, s: Session, root: Row) -> list[Row]:
        end = await s.next_user_line(root.line)
        return await s.rows(root.line + 1, end)

    def _plan(
        self, s: Session, root_id: str, active: int | None, lines: Sequence[bytes]
    ) -> tuple[list[Revision], int, Callable[[], None]]:
        """Archive ``lines`` as ``saveActiveRevision`` would: return the revisions, the
        slot, and what writes the new payload (in the change's prepare step)."""
        sid = s.id
        revs = s.archive.load(sid, root_id)
        slot = _slot(active, len(revs))
        if slot < len(revs) and self._same(s, root_id, revs[slot], lines):
            return revs, slot, _write_nothing  # the same branch again (a retry)
        rev = Revision(slot, s.archive.payload_name(slot), len(lines), now_iso())
        revs = [*revs[:slot], rev, *revs[slot + 1 :]]
        return revs, slot, lambda: s.archive.write_payload(sid, root_id, rev.file, lines)

    def _same(self, s: Session, root_id: str, rev: Revision, lines: Sequence[bytes]) -> bool:
        try:
            return bool(s.archive.read(s.id, root_id, rev) == list(lines))
        except ArchiveDamaged:
            return False  # a damaged slot is rewritten with the branch: that repairs it

    async def _stamp(
        self,
        s: Session,
        root: Row,
        msg: Message,
        pager: dict[str, Raw],
        branch: Sequence[bytes] | None,
    ) -> tuple[list[Piece], Callable[[], Awaitable[None]]]:
        """The transcript with the root's line stamped with ``pager`` (and its branch
        replaced by ``branch``, if given), as pieces; and what makes the index follow it."""
        nl = NewLine.of(msg, msg.turn_id, pager)
        new_root = nl.row(root.line, root.offset)
        if branch is None:
            end = root.offset + root.length + 1
            pieces: list[Piece] = [(0, root.offset), nl.data + b"\n", (end, s.size - end)]
            return pieces, lambda: s.follow_line(root, new_root, nl.data)
        old = await self._branch(s, root)
        end_line = root.line + 1 + len(old)
        end_off = old[-1].offset + old[-1].length + 1 if old else root.offset + root.length + 1
        pieces = [(0, root.offset), nl.data + b"\n"]
        rows = [new_root]
        pos = root.offset + len(nl.data) + 1
        for line in branch:
            m = parse_stored(line)
            assert m is not None
            pieces.append(line + b"\n")  # the archived bytes, verbatim: so is the row
            rows.append(stored_row(root.line + len(rows), pos, line, m))
            pos += len(line) + 1
        pieces.append((end_off, s.size - end_off))
        for r in await s.rows(end_line):
            rows.append(r._replace(line=root.line + len(rows), offset=pos))
            pos += r.length + 1
        return pieces, lambda: s.follow(rows, keep_from=root.line)

    async def _archive(
        self,
        s: Session,
        root_id: str,
        old: list[Revision],
        revs: list[Revision],
        write: Callable[[], None],
        pieces: list[Piece] | None,
    ) -> None:
        """Commit the root's archive ``revs`` (``write`` makes its new payload) and the
        transcript of ``pieces`` together, as one change (:mod:`host._intents`)."""
        sid = s.id
        change = Change(sid)
        if revs != old:
            change.root_id = root_id
            change.payloads = [r.file for r in revs if r not in old]

        def prepare(c: Change) -> None:
            write()
            if c.root_id is not None:
                c.manifest = os.path.basename(s.archive.prepare(sid, root_id, revs))
            if pieces is not None:
                c.transcript = s.file.prepare(pieces)

        await s.change(change, prepare, rewrites=pieces is not None)

    # -- methods --------------------------------------------------------------------

    async def save_revision(self, p: SaveRevisionParams) -> SaveRevisionResult:
        msgs = parse_all(p.messages)
        sid = p.session_id
        s = await self.registry.open(sid)
        await self._root(s, p.root_id)
        lines = [m.stored_line(turn_id=m.turn_id, pager={}) for m in msgs]

        def write() -> int:
            revs = s.archive.load(sid, p.root_id)
            name = s.archive.payload_name(len(revs))
            s.archive.write_payload(sid, p.root_id, name, lines)
            revs.append(Revision(len(revs), name, len(lines), now_iso()))
            s.archive.commit(sid, p.root_id, revs)
            s.archive.prune(sid, p.root_id)
            return len(revs)

        count = await on_thread(write)
        return SaveRevisionResult(revision=count - 1, revision_count=count)

    async def list_revisions(self, p: ListRevisionsParams) -> ListRevisionsResult:
        sid = p.session_id
        s = await self.registry.open(sid)
        _, msg = await self._root(s, p.root_id)
        count, active = _stamp_of(msg)
        revs = s.archive.load(sid, p.root_id)
        infos = []
        for r in revs:
            info = RevisionInfo(
                revision=r.revision, message_count=r.messageCount, created_at=r.createdAt
            )
            if p.include_messages:
                lines = await on_thread(s.archive.read, sid, p.root_id, r)
                info.messages = [Raw(x) for x in lines]
            infos.append(info)
        return ListRevisionsResult(
            root_id=p.root_id, revision_count=count, active_revision=active, revisions=infos
        )

    async def save_active_revision(self, p: SaveActiveParams) -> SaveActiveResult:
        sid = p.session_id
        s = await self.registry.open(sid)
        if isinstance(p.root_id, str):
            root, msg = await self._root(s, p.root_id)
        else:
            last = await s.last_user()
            if last is None:
                raise NotFound("message", "last user message")
            root, msg = await self._root(s, last.message_id)
        root_id = root.message_id
        count, active = _stamp_of(msg)
        branch = await self._branch(s, root)
        await self._at("branch-read")
        if not branch:
            return SaveActiveResult(
                root_id=root_id,
                revision_count=count,
                active_revision=active,
                archived=0,
                stamped=False,
            )
        lines = await s.read_rows(branch)
        old = s.archive.load(sid, root_id)
        revs, slot, write = await on_thread(self._plan, s, root_id, active, lines)
        pager = _pager(root_id, len(revs), slot)
        stamped = pager != msg.pager()
        pieces, follow = await self._stamp(s, root, msg, pager, None) if stamped else (None, None)
        await self._archive(s, root_id, old, revs, write, pieces)
        if follow is not None:
            await follow()
        return SaveActiveResult(
            root_id=root_id,
            revision_count=len(revs),
            active_revision=slot,
            archived=len(lines),
            stamped=stamped,
        )

    async def activate_revision(self, p: ActivateParams) -> ActivateResult:
        sid = p.session_id
        s = await self.registry.open(sid)
        running = await s.running_turn()
        if running is not None:
            raise AgentBusy(f"turn {running!r} is running in session {sid!r}", turnId=running)
        root, msg = await self._root(s, p.root_id)
        _, active = _stamp_of(msg)
        old = s.archive.load(sid, p.root_id)
        if p.revision >= len(old):
            raise NotFound("revision", p.revision)
        branch = await self._branch(s, root)
        lines = await s.read_rows(branch)
        if lines and p.revision == _slot(active, len(old)):
            chosen = lines  # the slot the branch is archived into: it stays
        else:
            chosen = await on_thread(s.archive.read, sid, p.root_id, old[p.revision])
        await self._check_ids(s, branch, chosen)  # before anything is written
        revs, write = old, _write_nothing
        if lines:
            revs, _, write = await on_thread(self._plan, s, p.root_id, active, lines)
        pager = _pager(p.root_id, len(revs), p.revision)
        if revs == old and chosen == lines and pager == msg.pager():
            return ActivateResult(active_revision=p.revision, revision_count=len(revs))
        pieces, follow = await self._stamp(s, root, msg, pager, chosen)
        await self._archive(s, p.root_id, old, revs, write, pieces)
        await follow()
        return ActivateResult(active_revision=p.revision, revision_count=len(revs))

    async def _check_ids(self, s: Session, branch: Sequence[Row], chosen: Sequence[bytes]) -> None:
        leaving = {r.message_id for r in branch}
        seen: set[str] = set()
        for line in chosen:
            m = parse_stored(line)
            assert m is not None
            if m.id in seen:
                raise Conflict(f"message {m.id!r} is twice in that revision", messageId=m.id)
            seen.add(m.id)
            if m.id in leaving:
                continue
            if await s.lookup(m.id) is not None:
                raise Conflict(
                    f"message {m.id!r} of that revision is already in the transcript",
                    messageId=m.id,
                )

    async def truncate_from(self, p: TruncateParams) -> TruncateResult:
        if p.from_message_id is UNSET and p.truncate_before is UNSET:
            raise InvalidParams("session.truncateFrom needs fromMessageId or truncateBefore")
        sid = p.session_id
        s = await self.registry.open(sid)
        if not await self._will_resolve(s, p):  # NOT_FOUND before anything changes
            raise NotFound("message", p.from_message_id or None)
        await self.turns.settle_for_cut(s)
        cut = await self._resolve_cut(s, p)
        total = s.line_count
        if cut >= total:  # a retried call: the cut is already made
            return TruncateResult(kept=total, removed=0, archived=0)
        (first,) = await s.rows(cut, cut + 1)
        before = await s.rows(cut - 1, cut) if cut > 0 else []
        pager: Pager | None = None
        archived = 0
        if before and before[0].role == "user" and first.role != "user":
            pager, archived = await self._regenerate(s, before[0], cut)
        else:
            await self._plain_cut(s, first.offset, cut)
        self.registry.count("truncations")
        return TruncateResult(
            kept=cut, removed=total - cut, archived=archived, pager=pager or UNSET
        )

    async def _plain_cut(self, s: Session, offset: int, cut: int) -> None:
        """Cut the transcript at ``offset`` (line ``cut``): one ``ftruncate``, atomic on its
        own, which needs no new space; then the index follows."""
        await s.change(Change(s.id, cut=Cut(offset)), _nothing)
        await s.follow([], keep_from=cut)

    async def _regenerate(self, s: Session, root: Row, cut: int) -> tuple[Pager, int]:
        """Cut the root's branch away (from line ``cut``), archive it, restamp the root.

        One change (:mod:`host._intents`): the archived branch's payload, the manifest that
        will name it and room for the restamped root line (when it is longer than what it
        replaces) are prepared; then the manifest is renamed in, the root line written over
        the bytes it replaces and the file cut after it, which needs no new space.
        """
        sid = s.id
        _, msg = await self._root(s, root.message_id)
        branch = await self._branch(s, root)
        lines = await s.read_rows(branch)
        _, active = _stamp_of(msg)
        old = s.archive.load(sid, root.message_id)
        revs, _slot, write = await on_thread(self._plan, s, root.message_id, active, lines)
        n = len(revs)
        nl = NewLine.of(msg, msg.turn_id, _pager(root.message_id, n + 1, n))
        change = Change(
            sid,
            root_id=root.message_id,
            payloads=[r.file for r in revs if r not in old],
            cut=Cut(root.offset, nl.data.decode()),
        )
        end, size = root.offset + len(nl.data) + 1, s.size

        def prepare(c: Change) -> None:
            write()
            c.manifest = os.path.basename(s.archive.prepare(sid, root.message_id, revs))
            if end > size:  # the root line grows the file: room for it now
                s.reserve(size, end - size)

        await self._at("intent-recorded")
        await s.change(change, prepare)
        await s.follow([nl.row(root.line, root.offset)], keep_from=root.line)
        return Pager(root_id=root.message_id, revision_count=n + 1, active_revision=n), len(lines)

    async def _will_resolve(self, s: Session, p: TruncateParams) -> bool:
        """Whether the cut resolves once the running turn is settled (its checkpoint too)."""
        if isinstance(p.truncate_before, int):
            return True
        if not isinstance(p.from_message_id, str):
            return False
        if await s.lookup(p.from_message_id) is not None:
            return True
        cp = s.checkpoint()  # its row appears when the cut settles it (if not empty)
        if cp is None or cp.message_id != p.from_message_id:
            return False
        msg = parse_stored(bytes(cp.message))
        return msg is not None and msg.has_content()

    async def _resolve_cut(self, s: Session, p: TruncateParams) -> int:
        """The first line to cut: identity first, then the count fallback."""
        if isinstance(p.from_message_id, str):
            row = await s.lookup(p.from_message_id)
            if row is not None:
                return row.line
        if isinstance(p.truncate_before, int):
            return p.truncate_before
        raise NotFound("message", p.from_message_id if p.from_message_id else None)

    # -- start-up -------------------------------------------------------------------


def _write_nothing() -> None:
    """No payload to write (the branch is archived already)."""


def _nothing(change: Change) -> None:
    """A change with nothing to prepare (a plain cut)."""
