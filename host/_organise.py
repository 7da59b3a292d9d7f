"""Organising sessions (issue 35): the paged list, titles and ``meta``, fork.

- ``session.list`` pages by a keyset cursor over an index of the sessions table (by last
  write or by creation, pinned first when asked): a page costs what it holds.
- ``session.update`` sets the title and merges ``meta`` (top-level keys; ``null`` removes
  one). ``meta.json`` is the truth, replaced atomically; the index row is marked
  (``meta_dirty``, synced) before the file is written, so a start after a cut reads it again.
- ``session.fork`` copies the lines up to a message into a new session, made as
  ``Registry.create`` makes one: every other file of it first, then its transcript (a
  copy in a temp file, fsynced, renamed into place, the folder fsynced: the commit). A
  start removes the files of a session without a transcript, so after a cut there is no
  new session or the whole one.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET, Raw

from host._errors import Conflict, InvalidParams, LimitExceeded, NotFound
from host._fs import on_thread
from host._index import MetaRow
from host._locks import Method
from host._meta import MetaFile, encode, read_meta
from host._search import Search
from host._store import Fork, Registry
from host._surrogates import decode
from host._wire import (
    ENCODER,
    LIST_PAGE,
    MAX_META,
    MAX_TITLE,
    ForkParams,
    ForkResult,
    ListParams,
    ListResult,
    SearchParams,
    SearchResult,
    SessionSummary,
    UpdateSessionParams,
    UpdateSessionResult,
)

_META = msgspec.json.Decoder(dict[str, Raw])


class Organise:
    """``session.list``, ``session.update``, ``session.fork`` and ``session.search``."""

    def __init__(self, registry: Registry, search: Search) -> None:
        self.registry = registry
        self.search = search

    async def search_sessions(self, p: SearchParams) -> SearchResult:
        """``session.search``; within a session that does not exist, ``NOT_FOUND`` (as every
        method of one session), not an empty page."""
        if isinstance(p.session_id, str) and p.session_id not in self.registry.sessions:
            raise NotFound("session", p.session_id)
        return await self.search.search(p)

    # -- session.list ---------------------------------------------------------------

    async def list_sessions(self, p: ListParams) -> ListResult:
        """One page, by a keyset on an index (its cost: the page's)."""
        limit = p.limit if isinstance(p.limit, int) else LIST_PAGE
        col = "updated_at" if p.order == "updated" else "created_at"
        phases: list[Any] = [1, 0] if p.pinned_first else [None]  # pinned, then the rest
        phase, key, sid = phases[0], _END, _END
        if isinstance(p.cursor, str):
            phase, key, sid = _position(p.cursor, p.order, p.pinned_first)
        out: list[tuple[Any, ...]] = []
        for ph in phases[phases.index(phase) :] if phase in phases else []:
            cond = "1" if ph is None else f"pinned = {ph}"
            rows = await self.search.read(  # (titles clipped below: substr stops at a NUL)
                "SELECT session_id, title, line_count, updated_at,"
                f" created_at, meta, {ph if ph is not None else 'NULL'} FROM sessions"
                f" WHERE {cond} AND ({col}, session_id) < (?, ?)"
                f" ORDER BY {col} DESC, session_id DESC LIMIT ?",
                (key, sid, limit + 1 - len(out)),
            )
            out += rows
            key = sid = _END
            if len(out) > limit:
                break
        cursor: str | msgspec.UnsetType = UNSET
        if len(out) > limit:
            out = out[:limit]
            r = out[-1]
            raw = json.dumps(
                [p.order, p.pinned_first, r[6], r[3 if col == "updated_at" else 4], r[0]]
            )
            cursor = base64.urlsafe_b64encode(raw.encode()).decode()
        sessions = self.registry.sessions
        return ListResult(sessions=[_summary(r) for r in out if r[0] in sessions], cursor=cursor)

    # -- session.update -------------------------------------------------------------

    async def update(self, p: UpdateSessionParams) -> UpdateSessionResult:
        """Set the title, merge ``meta`` (the call holds its session)."""
        s = await self.registry.open(p.session_id)  # NotFound, or reconciled
        old_bytes, old = await on_thread(read_meta, self.registry.layout.meta(s.id))
        row = await s.row()
        assert row is not None
        if p.title is not UNSET:
            title = p.title
        else:  # the file's (the row's may lag it: an index write that failed after it)
            title = old.title if old_bytes is not None else row.title
        meta = dict(old.meta or {})
        for k, v in (p.meta or {}).items() if isinstance(p.meta, dict) else ():
            if bytes(v) == b"null":
                meta.pop(k, None)
            else:
                meta[k] = v
        new_meta = meta or None
        if (size := len(ENCODER.encode(new_meta))) > MAX_META:
            raise LimitExceeded(
                f"meta may hold {MAX_META:,} bytes at most (encoded); it would hold {size:,}",
                limit=MAX_META,
            )
        new = encode(MetaFile(title, old.createdAt or row.created_at, new_meta))
        changed = new != old_bytes or title != row.title
        if changed:
            await s.write_meta(new, MetaRow.of(s.id, title, new_meta))
        return UpdateSessionResult(session_id=s.id, title=title, meta=new_meta, changed=changed)

    # -- session.fork ---------------------------------------------------------------

    async def fork(self, p: ForkParams) -> ForkResult:
        """A new session of the lines up to ``atMessageId`` (the call holds the source,
        the new id and its case twins)."""
        registry, layout = self.registry, self.registry.layout
        src, new = p.session_id, p.new_session_id
        assert isinstance(new, str)
        s = await registry.open(src)
        at = await s.lookup(p.at_message_id)
        if at is None:
            raise NotFound("message", p.at_message_id)
        forked = ENCODER.encode({"sessionId": src, "messageId": p.at_message_id})
        if new in registry.sessions:
            _, m = await on_thread(read_meta, layout.meta(new))
            if bytes((m.meta or {}).get("forkedFrom", b"")) == forked:  # a retry: made
                return ForkResult(session_id=new, created=False, message_count=at.line + 1)
            raise Conflict(f"session {new!r} exists", sessionId=new)
        if (twin := await registry.case_twin(new)) or os.path.lexists(layout.transcript(new)):
            raise Conflict(f"session {twin or new!r} exists on disk", sessionId=twin or new)
        row = await s.row()
        assert row is not None
        fork = Fork(
            s, at.offset + at.length + 1, await s.rows(0, at.line + 1), {"forkedFrom": Raw(forked)}
        )
        await registry.create(new, row.title, fork)
        return ForkResult(session_id=new, created=True, message_count=len(fork.rows))


_END = "\uffff"  # past every timestamp and id: a page from the start


def _summary(r: tuple[Any, ...]) -> SessionSummary:
    """A list entry from its ``sessions`` row."""
    meta = r[5]
    return SessionSummary(
        session_id=r[0],
        title=r[1] if r[1] is None else r[1][:MAX_TITLE],  # an older host's
        message_count=r[2],
        updated_at=r[3],
        created_at=r[4],
        meta=None if meta is None else decode(_META, meta.encode("utf-8", "surrogatepass")),
    )


def _position(cursor: str, order: str, pinned_first: bool) -> tuple[int | None, str, str]:
    try:
        o, pf, phase, key, sid = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        f"{key}{sid}".encode()  # no lone surrogate (UnicodeEncodeError: a ValueError)
        if (
            (o, pf) == (order, pinned_first)
            and phase in ((1, 0) if pinned_first else (None,))
            and isinstance(key, str)
            and isinstance(sid, str)
        ):
            return phase, key, sid
    except (ValueError, TypeError):
        pass
    raise InvalidParams("cursor is not one a session.list answer with this order gave")


@dataclass(frozen=True, slots=True)
class ForkMethod(Method):
    """A fork holds its source's queue, and its new id's and that id's case twins'."""

    def queues(self, params: Any) -> tuple[str, ...]:
        new = params.new_session_id
        return (
            (params.session_id,)
            if new == params.session_id
            else ("/" + new.lower(), new, params.session_id)
        )
