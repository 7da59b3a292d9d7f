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
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET, Raw, Struct, structs

from host._errors import Conflict, InvalidParams, LimitExceeded, NotFound
from host._fs import on_thread, read_regular
from host._index import RowCache, SessionRow, now_iso
from host._locks import Method
from host._search import Search
from host._session import Session
from host._store import Registry
from host._surrogates import decode
from host._transcript import FileStamp
from host._wire import (
    LIST_PAGE,
    MAX_META,
    MAX_TITLE,
    ForkParams,
    ForkResult,
    ListParams,
    ListResult,
    SessionSummary,
    UpdateSessionParams,
    UpdateSessionResult,
)

_ENC = msgspec.json.Encoder()


class MetaFile(Struct, omit_defaults=True):
    """``sessions/<id>.meta.json``: what a rebuilt index takes title and ``meta`` from."""

    title: str | None = None
    createdAt: str | None = None
    meta: dict[str, Raw] | None = None


_META_FILE = msgspec.json.Decoder(MetaFile)
_META = msgspec.json.Decoder(dict[str, Raw])


def _read_meta(path: str) -> tuple[bytes | None, MetaFile]:
    """The meta file's bytes and what it says (an unreadable one says nothing)."""
    try:
        data = read_regular(path)
        return data, decode(_META_FILE, data)
    except OSError:
        return None, MetaFile()
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return data, MetaFile()


def _meta_row(sid: str, title: str | None, meta: Any) -> tuple[Any, ...]:
    pinned = int(meta is not None and bytes(meta.get("pinned", b"")) == b"true")
    text = None if meta is None else _ENC.encode(meta).decode("utf-8", "surrogatepass")
    return title, text, pinned, sid


_SET_META = (
    "UPDATE sessions SET title = ?, meta = ?, pinned = ?, meta_dirty = 0 WHERE session_id = ?"
)


async def _set_meta(registry: Registry, sid: str, title: str | None, meta: Any) -> None:
    """Record title and ``meta`` in the index, as ``meta.json`` now holds them."""
    await registry.index.execute(_SET_META, _meta_row(sid, title, meta))


class Organise:
    """``session.list``, ``session.update`` and ``session.fork``."""

    def __init__(self, registry: Registry, search: Search) -> None:
        self.registry = registry
        self.search = search

    async def reload_meta(self) -> int:
        """At start: read ``meta.json`` again for every session marked (an update cut
        short, a row the index made from the files); return how many."""
        rows = await self.search.read("SELECT session_id FROM sessions WHERE meta_dirty = 1")
        meta = self.registry.layout.meta

        def read_all() -> list[tuple[Any, ...]]:
            return [
                _meta_row(sid, m.title, m.meta)
                for (sid,) in rows
                for m in [_read_meta(meta(sid))[1]]
            ]

        done = await on_thread(read_all)
        async with self.registry.index.transaction() as db:
            await db.executemany(_SET_META, done)
        return len(rows)

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
            rows = await self.search.read(
                f"SELECT session_id, substr(title, 1, {MAX_TITLE}), line_count, updated_at,"
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
        return ListResult(
            sessions=[
                SessionSummary(
                    session_id=r[0],
                    title=r[1],
                    message_count=r[2],
                    updated_at=r[3],
                    created_at=r[4],
                    meta=None
                    if r[5] is None
                    else decode(_META, r[5].encode("utf-8", "surrogatepass")),
                )
                for r in out
                if r[0] in sessions
            ],
            cursor=cursor,
        )

    # -- session.update -------------------------------------------------------------

    async def update(self, p: UpdateSessionParams) -> UpdateSessionResult:
        """Set the title, merge ``meta`` (the call holds its session)."""
        registry, sid = self.registry, p.session_id
        await registry.open(sid)  # NotFound, or reconciled
        path = registry.layout.meta(sid)
        old_bytes, old = await on_thread(_read_meta, path)
        row = await registry.index.session(sid)
        assert row is not None
        title = row.title if p.title is UNSET else p.title
        meta = dict(old.meta or {})
        for k, v in (p.meta or {}).items() if isinstance(p.meta, dict) else ():
            if bytes(v) == b"null":
                meta.pop(k, None)
            else:
                meta[k] = v
        new_meta = meta or None
        if (size := len(_ENC.encode(new_meta))) > MAX_META:
            raise LimitExceeded(
                f"meta may hold {MAX_META:,} bytes at most (encoded); it would hold {size:,}",
                limit=MAX_META,
            )
        new = _ENC.encode(MetaFile(title, old.createdAt or row.created_at, new_meta))
        changed = new != old_bytes or title != row.title
        if changed:
            async with registry.index.transaction(durable=True) as db:  # a cut: read again
                await db.execute("UPDATE sessions SET meta_dirty = 1 WHERE session_id = ?", (sid,))
            await on_thread(registry.fs.write_atomic, path, new)
            await _set_meta(registry, sid, title, new_meta)
        return UpdateSessionResult(session_id=sid, title=title, meta=new_meta, changed=changed)

    # -- session.fork ---------------------------------------------------------------

    async def fork(self, p: ForkParams) -> ForkResult:
        """A new session of the lines up to ``atMessageId`` (the call holds the source,
        the new id and its case twins)."""
        registry, layout, fs = self.registry, self.registry.layout, self.registry.fs
        src, new = p.session_id, p.new_session_id
        assert isinstance(new, str)
        s = await registry.open(src)
        at = await s.lookup(p.at_message_id)
        if at is None:
            raise NotFound("message", p.at_message_id)
        forked = _ENC.encode({"sessionId": src, "messageId": p.at_message_id})
        if new in registry.sessions:
            _, m = await on_thread(_read_meta, layout.meta(new))
            if bytes((m.meta or {}).get("forkedFrom", b"")) == forked:  # a retry: made
                return ForkResult(session_id=new, created=False, message_count=at.line + 1)
            raise Conflict(f"session {new!r} exists", sessionId=new)
        if (twin := await registry.case_twin(new)) or os.path.lexists(layout.transcript(new)):
            raise Conflict(f"session {twin or new!r} exists on disk", sessionId=twin or new)
        rows = await s.rows(0, at.line + 1)
        src_row = await registry.index.session(src)
        assert src_row is not None
        now, title, meta = now_iso(), src_row.title, {"forkedFrom": Raw(forked)}
        meta_file = _ENC.encode(MetaFile(title, now, meta))
        end = at.offset + at.length + 1

        def make_files() -> FileStamp:
            tmp = ""
            try:
                fs.unlink(layout.intent(new))  # a deleted session's (its removal failed)
                fs.write_atomic(layout.meta(new), meta_file)
                registry.turnlog.create(new)
                tmp = os.path.join(layout.sessions, s.file.prepare([(0, end)]))
                fs.rename(tmp, layout.transcript(new))
                fs.fsync_dir(layout.sessions)  # the commit
            except BaseException:
                if tmp:
                    fs.unlink(tmp)
                registry.remove_files(new)  # before the commit: nothing was made
                raise
            return FileStamp.of(os.stat(layout.transcript(new)))

        st = await on_thread(make_files)
        made = registry.sessions[new] = Session(new, registry)
        try:
            # No file stamp yet: a row made from the files, its meta read again at a start
            # (search_sql's trigger) until _set_meta records it; replace_rows stamps it.
            await registry.index.create_session(SessionRow(new, title, now, now, 0, 0, 0, 0))
            await registry.index.replace_rows(RowCache(new), rows, st, len(rows), now)
            await _set_meta(registry, new, title, meta)
        except Exception:  # made: indexed from its files before it is served
            made.lags()
        return ForkResult(session_id=new, created=True, message_count=len(rows))


_END = "\uffff"  # past every timestamp and id: a page from the start


def _position(cursor: str, order: str, pinned_first: bool) -> tuple[int | None, str, str]:
    try:
        o, pf, phase, key, sid = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if (o, pf) == (order, pinned_first) and isinstance(key, str) and isinstance(sid, str):
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


def name_fork(params: Any) -> Any:
    """A fork's params with its new id chosen (before it enters its queues)."""
    if isinstance(params, ForkParams) and not isinstance(params.new_session_id, str):
        return structs.replace(params, new_session_id=uuid.uuid4().hex)
    return params
