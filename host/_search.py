"""Search across every chat (issue 35): the search index, kept up in the background, and
its queries.

The tables are part of the derived index (:mod:`host._search_sql`). Triggers on the
``messages`` table queue every message whose row is written, in the row's own
transaction; :class:`Search` works the queue off in the background on a connection of its
own: it reads each queued line from its transcript (the truth, ``pread`` at the row's
offset, no session held), takes its text (:func:`texts`) and writes its documents. So
nothing of search is on the append's answer path: the answer comes before its rows are
committed, and they are indexed after that. A search first works off a small queue (so
it sees every answered append); with a large one (an old data dir's first start, a
rebuild) it answers from what is indexed and says ``partial``.

A line read while a rewrite moves it is either one whole version of its message (its id,
a newline after it) or is skipped and read again; a version that is not the newest is
replaced, since the rewrite's commit queued the message again.

Words are ``unicode61``'s (letters and digits; case and diacritics folded). A CJK run is
indexed as its characters and its pairs of characters, so a query of one or two CJK
characters is one lookup, and a longer one is the AND of its pairs, each candidate then
checked against the transcript's text. The index is contentless: snippets are cut from
the transcript's line.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import logging
import os
import re
import sqlite3
import time
import unicodedata
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import msgspec

from host._archive import Archive
from host._errors import InvalidParams, LimitExceeded
from host._fs import on_thread, open_regular
from host._index import Index, connect_read_only
from host._layout import Layout
from host._search_sql import FTS, FTS_TABLES
from host._surrogates import decode
from host._wire import (
    MAX_QUERY,
    SEARCH_PAGE,
    SearchHit,
    SearchParams,
    SearchResult,
    Snippet,
)

log = logging.getLogger("host.search")
T = TypeVar("T")

CANDIDATES = 2_000
"""Matches of a query ranked by bm25 at most: its most recent ones (by when they were
indexed), across every session or in one."""
MAX_DOC = 262_144
"""Characters of a message's text that are indexed; the rest is not searched."""
MAX_TERMS = 16
"""Terms a query may hold."""
RANK_TIME = 5.0
"""Seconds a search's ranking may run (SQLite's progress handler stops it, as Datasette's
``sql_time_limit_ms`` does); past it ``LIMIT_EXCEEDED``. A query's cost is not bounded by
its candidates: a term of one common word many times is as many lookups, each as long as
the index, and a search within one session walks every match of the others."""
DEAD_FLOOR = 100_000
"""Dead entries (words of changed or deleted documents, kept by a contentless table) the
search index may hold before it is compacted; past it, once they outnumber live documents."""
BATCH = 512
"""Queued messages indexed per transaction."""
CATCH_UP = 2_000
"""A search first indexes a queue up to this long; past it, it answers ``partial``."""
SNIPPET = 160
"""Characters of a hit's snippet (plus an ellipsis at a cut end)."""
RETRIES = 20
"""Reads of a queued line that may fail (a rewrite moving it) before it is left out."""
BUILD = 10_000
"""Documents made in one go past which the full-text index is optimised (merged whole)."""
TEXT_TYPES = frozenset({"text", "input_text", "output_text"})
"""Content parts whose ``text`` is a message's text (Anthropic's, OpenAI's, pi's)."""
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_PRIVATE = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"


@functools.cache
def _piece() -> re.Pattern[str]:
    """A CJK run (hiragana, katakana, CJK ideographs, Hangul syllables) or a word, of the
    characters ``unicode61`` takes for a word's: letters, digits, private use and
    non-spacing marks (``Mn``: a decomposed ``ï``, the dot ``İ`` lowers to), so a query's
    words are the index's. Made at the first query (the marks: one pass over the three
    planes that hold them)."""
    marks = "".join(
        re.escape(chr(c))
        for plane in (0, 1, 14)
        for c in range(plane << 16, (plane + 1) << 16)
        if unicodedata.category(chr(c)) == "Mn"
    )
    return re.compile(f"([{_CJK}]+)|((?:(?![{_CJK}])(?:[^\\W_]|[{marks}{_PRIVATE}]))+)")


# -- the text of a message ----------------------------------------------------------------


class _Msg(msgspec.Struct):  # the fields texts() reads; the rest is skipped
    id: Any = None
    role: Any = None
    content: Any = None


_MSG = msgspec.json.Decoder(_Msg)


def _part_texts(content: Any, out: list[str], tools: list[str]) -> None:
    """The text parts of ``content`` into ``out``, its ``tool_result`` parts' into ``tools``."""
    if isinstance(content, str):
        out.append(content)
        return
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        if part.get("type") in TEXT_TYPES and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif part.get("type") == "tool_result":
            _part_texts(part.get("content"), tools, tools)


def texts(line: bytes | memoryview) -> tuple[str, str, str, str] | None:
    """``(id, role, text, tool text)`` of a stored line, or ``None`` when it is no message.

    The text is ``content`` when it is a string, else the ``text`` of its text parts
    (:data:`TEXT_TYPES`), joined by newlines. The tool text is the whole text of a
    ``tool`` message and the ``content`` of ``tool_result`` parts. Nothing else is
    searched (images, tool calls, thinking, the caller's other fields).
    """
    try:
        m = decode(_MSG, line, read=True)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not isinstance(m.id, str) or not isinstance(m.role, str):
        return None
    text: list[str] = []
    tools: list[str] = []
    _part_texts(m.content, tools if m.role == "tool" else text, tools)
    return m.id, m.role, "\n".join(text)[:MAX_DOC], "\n".join(tools)[:MAX_DOC]


def fts_text(text: str) -> str:
    """What the full-text index is given for ``text``: each CJK run as its characters and
    its pairs of characters, words as they are."""

    def grams(m: re.Match[str]) -> str:
        run = m.group()
        return " " + " ".join([*run, *(run[i : i + 2] for i in range(len(run) - 1))]) + " "

    return _CJK_RUN.sub(grams, text)


def digest(text: str) -> int:
    """A 63-bit digest of a document's text (``verify`` compares it with the transcript's)."""
    h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1


# -- queries ------------------------------------------------------------------------------


@dataclass(slots=True)
class Query:
    """A parsed query: ``fts`` finds the candidates; those holding a CJK run of 3 or more
    characters are checked against their text (``needles`` in it, no ``excluded``)."""

    fts: str = ""
    marks: list[str] = field(default_factory=list)  # what a snippet highlights
    needles: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    def holds(self, text: str) -> bool:
        low = text.lower()
        return all(n in low for n in self.needles) and not any(n in low for n in self.excluded)


def _term_fts(term: str) -> tuple[list[str], list[str], list[str]]:
    """The FTS5 phrases of one term (words: prefixes from 3 characters on; CJK: its
    characters or pairs), its words and short runs, and its CJK runs of 3 or more
    characters (checked whole)."""
    phrases, marks, long_runs = [], [], []
    for m in _piece().finditer(term):
        run, word = m.group(1), m.group(2)
        if word is not None or len(run) <= 2:
            marks.append(word or run)
            phrases.append(f'"{marks[-1]}"' + ("*" if word and len(word) >= 3 else ""))
        else:
            pairs = [run[i : i + 2] for i in range(len(run) - 1)]
            step = max(1, len(pairs) // 8)  # at most 8 pairs looked up: checked whole
            phrases += [f'"{p}"' for p in pairs[::step]]
            long_runs.append(run)
    return phrases, marks, long_runs


_TOKEN = re.compile(r'(-?)"([^"]*)"?|(\S+)')


def parse_query(query: str) -> Query:
    """Parse a query; ``InvalidParams`` or ``LimitExceeded`` when it cannot be searched.

    Terms are separated by spaces and all must occur; ``"two words"`` is one term; ``-term``
    and ``NOT term`` exclude; ``AND`` and a trailing ``*`` change nothing; ``OR`` is
    refused. A term's words are matched as words, as prefixes from 3 characters on; any
    other character (FTS5's syntax too) only separates words.
    """
    if len(query) > MAX_QUERY:
        raise LimitExceeded(f"a query may hold {MAX_QUERY:,} characters at most", limit=MAX_QUERY)
    q, negate, count = Query(), False, 0
    want: list[str] = []
    drop: list[str] = []
    for m in _TOKEN.finditer(query):
        minus, quoted, bare = m.group(1), m.group(2), m.group(3)
        if bare in ("AND", "NOT"):
            negate = bare == "NOT"
            continue
        if bare == "OR":
            raise InvalidParams("OR is not supported: every term must occur (search once per term)")
        term = quoted if bare is None else bare.removeprefix("-")
        negate = negate or bool(minus) or (bare or "").startswith("-")
        count += _add_term(q, want, drop, term, negate)
        if count > MAX_TERMS:
            raise LimitExceeded(f"a query may hold {MAX_TERMS} terms at most", limit=MAX_TERMS)
        negate = False
    if not want:
        raise InvalidParams("the query has no word to search for (only operators or punctuation)")
    q.fts = "(" + " AND ".join(want) + ")" + "".join(f" NOT {d}" for d in drop)
    q.marks += q.needles
    return q


def _add_term(q: Query, want: list[str], drop: list[str], term: str, negate: bool) -> int:
    """Add one term's phrases to ``want`` (or, negated, ``drop``); 1 if it has a word."""
    phrases, marks, runs = _term_fts(term)  # folded by FTS5 as the index is
    if not phrases:
        return 0
    if negate and runs:
        q.excluded += runs  # checked against the text only: pairs would exclude more
    elif negate:
        drop.append("(" + " AND ".join(phrases) + ")")
    else:
        want += phrases
        q.needles += runs
        q.marks += marks
    return 1


class _Fold(dict[int, str]):
    """``str.translate``'s table for :func:`fold` (the BMP's characters kept once made)."""

    def __missing__(self, cp: int) -> str:
        c = chr(cp)
        low = c.lower()
        bare = "".join(x for x in unicodedata.normalize("NFD", low) if not unicodedata.combining(x))
        out = bare if len(bare) == 1 else low if len(low) == 1 else c
        if cp < 0x10000:
            self[cp] = out
        return out


_FOLD = _Fold()


def fold(text: str) -> str:
    """``text`` as the index compares it (lower case, diacritics dropped: ``unicode61``'s
    folding), one character for each: offsets into it are offsets into ``text``."""
    return text.lower() if text.isascii() else text.translate(_FOLD)


def snippet(text: str, q: Query) -> Snippet:
    """Plain text around the first match, with ``[start, end)`` code-point ranges of the
    matches in it (overlaps merged)."""
    low = fold(text)
    first = min((i for t in map(fold, q.marks) if (i := low.find(t)) >= 0), default=0)
    start = max(0, min(first - SNIPPET // 4, len(text) - SNIPPET))
    end = min(len(text), start + SNIPPET)
    lead, tail = ("…" if start > 0 else ""), ("…" if end < len(text) else "")
    body = "".join(" " if c in "\n\r\t" else c for c in text[start:end])
    window, spans = low[start:end], []
    for t in map(fold, q.marks):
        i = window.find(t)
        while i >= 0:
            spans.append((i + len(lead), min(i + len(t), end - start) + len(lead)))
            i = window.find(t, i + 1)
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return Snippet(text=lead + body + tail, ranges=merged)


def _cursor(position: int, ceiling: int) -> str:
    return base64.urlsafe_b64encode(f"search:{position}:{ceiling}".encode()).decode()


def _position(cursor: str) -> tuple[int, int]:
    """A cursor's position among the candidates, and the newest document they were
    ranked from (the first page's)."""
    with contextlib.suppress(ValueError):
        kind, n, ceiling = base64.urlsafe_b64decode(cursor.encode()).decode().split(":")
        if (
            kind == "search"
            and n.isdigit()
            and ceiling.isdigit()
            and int(n) <= CANDIDATES
            and int(ceiling) < 1 << 63  # SQLite's integers
        ):
            return int(n), int(ceiling)
    raise InvalidParams("cursor is not one a session.search answer gave")


# -- reading and ranking (blocking: on a thread, or the command line) ---------------------


class Db:
    """One SQLite connection of the search's, used by one call at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.turn = asyncio.Lock()

    async def call(self, work: Callable[..., T], *args: Any) -> T:
        """``work(conn, *args)`` on a thread once the connection is free: its callers wait
        on the loop, not each holding one of the few worker threads every write needs (ten
        slow searches held them all, and a create waited for them)."""
        async with self.turn:
            return await on_thread(work, self.conn, *args)


_ACTIVE = (
    " m.line, m.offset, m.length, d.doc, NULL, NULL, NULL FROM c JOIN search_docs d ON"
    " d.doc = c.doc JOIN messages m ON m.session_id = d.session_id AND m.message_id ="
    " d.message_id WHERE NOT EXISTS (SELECT 1 FROM search_queue s WHERE s.session_id ="
    " d.session_id AND s.message_id = d.message_id)"
)
_ARCHIVED = (
    " d.line, d.offset, d.length, d.doc, d.root_id, d.revision, d.file FROM c JOIN search_docs d"
    " ON d.doc = c.doc WHERE d.tools <= ? AND EXISTS (SELECT 1 FROM messages r"
    " WHERE r.session_id = d.session_id AND r.message_id = d.root_id)"
)
"""An archived line is a hit while its root is a message of its session: one deleted, cut
or replaced takes its revisions out of reach (``listRevisions`` answers ``NOT_FOUND``)."""


def _rank(
    conn: sqlite3.Connection, q: Query, p: SearchParams, ceiling: int
) -> list[tuple[Any, ...]]:
    """Candidates best first, at most :data:`CANDIDATES`: ``(bm25, tools, session, message,
    line, offset, length, doc, root, revision, payload file)`` (bm25: lower is better;
    ties: the most recently indexed first; root, revision and file: an archived line's),
    ranked from the most recent matches of documents up to ``ceiling``."""
    tables = ["search_text", *(["search_tools"] if p.tools else [])]
    out: list[tuple[Any, ...]] = []
    one = isinstance(p.session_id, str)
    for table in [*tables, *(["search_archive"] if p.scope == "all" else [])]:
        # The matches, newest first: a document gone since (its words stay) skipped, and
        # one of another session when the search is within one (a session's documents
        # each looked up in the full-text table cost a query each: 5 s at 8,000).
        pool = (
            f"SELECT rowid AS doc, bm25({table}) AS r FROM {table} WHERE {table} MATCH ?"
            f" AND rowid <= ? AND EXISTS (SELECT 1 FROM search_docs x WHERE x.doc ="
            f" {table}.rowid{' AND x.session_id = ?' if one else ''}) ORDER BY rowid DESC"
            " LIMIT ?"
        )
        args = [q.fts, ceiling, *([p.session_id] if one else []), CANDIDATES]
        tail, more = (_ARCHIVED, [int(p.tools)]) if table == "search_archive" else (_ACTIVE, [])
        out += conn.execute(
            f"WITH c AS MATERIALIZED ({pool}) SELECT c.r, d.tools, d.session_id, d.message_id,"
            + tail,
            [*args, *more],
        ).fetchall()
    out.sort(key=lambda c: (c[0], -c[7]))
    return out[:CANDIDATES]


def _hits(
    layout: Layout, q: Query, cands: Sequence[tuple[Any, ...]], pos: int, limit: int
) -> tuple[list[SearchHit], int]:
    """The hits from candidate ``pos`` on, each read from its transcript or archived
    payload; the next position."""
    hits: list[SearchHit] = []
    with _files() as fds:
        while pos < len(cands) and len(hits) < limit:
            r, tools, sid, mid, line, offset, length, _, root, rev, file = cands[pos]
            pos += 1
            got = _read_line(fds, _line_path(layout, sid, root, file), offset, length)
            if got is None or got[0] != mid:
                continue  # moved by a change since: its new version is queued
            text = got[3] if tools else got[2]
            if not q.holds(text):
                continue
            hit = SearchHit(
                session_id=sid,
                message_id=mid,
                line=line,
                role=got[1],
                score=round(-r, 6) + 0.0,
                snippet=snippet(text, q),
            )
            if root is not None:
                hit.root_id, hit.revision = root, rev
            hits.append(hit)
    return hits, pos


def _line_path(layout: Layout, sid: str, root: str | None, file: str | None) -> str:
    """The file a document's line is in: its session's transcript, or an archived payload."""
    if root is None or file is None:
        return layout.transcript(sid)
    return os.path.join(layout.revisions(sid), root, file)


def _read_line(
    fds: dict[str, int], path: str, offset: int, length: int
) -> tuple[str, str, str, str] | None:
    """The texts of the line at ``offset`` of a transcript or payload, when it is one whole
    line there (one file open at a time: the host's bound on open files holds)."""
    if path not in fds:
        for fd in fds.values():
            os.close(fd)
        fds.clear()
        try:
            fds[path] = open_regular(path)  # not a FIFO planted there
        except OSError:
            return None
    data = os.pread(fds[path], length + 1, offset)
    return texts(data[:-1]) if data[-1:] == b"\n" else None


@contextlib.contextmanager
def _files() -> Iterator[dict[str, int]]:
    """The files :func:`_read_line` keeps open, closed at the end."""
    fds: dict[str, int] = {}
    try:
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


# -- the search index ---------------------------------------------------------------------


class Search:
    """The search index of one data dir: kept up with the rows, and searched."""

    def __init__(self, index: Index, layout: Layout, archive: Archive) -> None:
        self.index = index
        self.layout = layout
        self.archive = archive
        self._archived: set[str] = set()  # sessions whose archives may have changed
        self._syncing = ""  # ... and the one being synced
        self._dbs: dict[str, Db] = {}  # "search", "pages" (readers), "writer" (the indexer)
        self.runs = False
        self._busy = asyncio.Lock()  # one indexing pass at a time
        self._wake = asyncio.Event()
        self._tries: dict[int, int] = {}  # queue seq -> failed reads
        self.indexed = self.pending = 0
        self.building, self._since = False, 0.0

    def _db(self, name: str) -> Db:
        """A connection of its own (opened on first use): a list page never waits behind a
        search, nor either behind the indexer."""
        if name not in self._dbs:
            conn = sqlite3.connect(self.layout.index, isolation_level=None, check_same_thread=False)
            write = name == "writer"
            conn.execute(f"PRAGMA busy_timeout = {60_000 if write else 5_000}")
            conn.execute("PRAGMA synchronous = NORMAL" if write else "PRAGMA query_only = 1")
            self._dbs[name] = Db(conn)
        return self._dbs[name]

    async def read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of a query on the index, after every queued row is committed."""
        await self.index.settle()
        return await self._db("pages").call(lambda c: c.execute(sql, params).fetchall())

    # -- running ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Search]:
        """Index in the background (woken by every commit of the index) until it ends."""
        self.runs, self.index.on_commit = True, self._wake.set
        loop = asyncio.get_running_loop()
        self._archived.update(os.listdir(self.layout.revisions_root))
        await self._db("writer").call(lambda c: _shadow_tables(c, make=False))
        self.archive.on_change = lambda sid: self._told(loop, sid)
        task = loop.create_task(self._run())
        self._wake.set()
        try:
            yield self
        finally:
            self.index.on_commit = None
            self.archive.on_change = lambda sid: None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for db in self._dbs.values():
                db.conn.close()
            self._dbs.clear()
            self.runs = False

    def _told(self, loop: asyncio.AbstractEventLoop, session_id: str) -> None:
        """A manifest of the session was committed (told on any thread)."""
        self._archived.add(session_id)
        loop.call_soon_threadsafe(self._wake.set)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                if not await self.work(log_progress=True):  # lines a rewrite was moving
                    asyncio.get_running_loop().call_later(0.2, self._wake.set)
                live, dead = await self._db("writer").call(_stats)
                if dead > max(live, DEAD_FLOOR):  # what a compaction frees: most of the index
                    log.info("search index: %d dead entries, %d live: compacting", dead, live)
                    await self.compact()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # derived: the next commit (or start) tries again
                log.error("search index: indexing failed (%r); retried at the next change", exc)

    async def work(self, *, log_progress: bool = False, limit: int | None = None) -> bool:
        """Work the queue off (``limit``: about that many entries at most); whether it is
        empty but for lines that could not be read yet."""
        writer = self._db("writer")
        async with self._busy:
            total = await writer.call(_count)
            if log_progress and total > BUILD and not self.building:
                self.building, self._since = True, time.monotonic()
                log.info("search index: %d message(s) to index", total)
            done, after, last_log, skipped = 0, -1, time.monotonic(), 0
            while limit is None or done < limit:
                n, after, made, left = await writer.call(self._step, after)
                if n == 0:
                    break
                done, skipped, self.indexed = done + n, skipped + left, self.indexed + made
                if self.building and time.monotonic() - last_log >= 2.0:
                    last_log = time.monotonic()
                    log.info("search index: %d of %d queued message(s) indexed", done, total)
            while self._archived:  # a change's archives (its rows' sessions, told by Archive)
                self._syncing = sid = self._archived.pop()
                try:
                    await writer.call(self._sync_archive, sid)
                finally:
                    self._syncing = ""
            self.pending = await writer.call(_count)
            if self.building and self.pending <= skipped:
                await writer.call(_optimize)
                log.info(
                    "search index: built (%d message(s) in %.1f s)",
                    done,
                    time.monotonic() - self._since,
                )
                self.building = False
            elif not self.building and done >= BUILD:
                await writer.call(_optimize)
            return self.pending <= skipped

    def _step(self, conn: sqlite3.Connection, after: int) -> tuple[int, int, int, int]:
        """Index the next :data:`BATCH` queue entries after ``after`` (blocking); return
        how many it took, the last one's number, documents made and lines left to read."""
        rows = conn.execute(
            "SELECT q.seq, q.session_id, q.message_id, m.offset, m.length FROM search_queue q"
            " LEFT JOIN messages m ON m.session_id = q.session_id"
            " AND m.message_id = q.message_id WHERE q.seq > ? ORDER BY q.seq LIMIT ?",
            (after, BATCH),
        ).fetchall()
        if not rows:
            return 0, after, 0, 0
        last = rows[-1][0]  # (in queue order)
        items: dict[tuple[str, str], list[Any]] = {}  # -> [seqs, offset, length, docs]
        for seq, sid, mid, offset, length in sorted(rows, key=lambda r: (r[1], r[0])):
            item = items.setdefault((sid, mid), [[], None, None, None])
            item[0].append(seq)
            item[1], item[2] = offset, length
        self._read_docs(items)
        made = gone = left = 0
        done: list[tuple[int]] = []
        with _writing(conn):
            for (sid, mid), (seqs, _, _, docs) in items.items():
                if conn.execute(  # changed again: its newest entry makes its documents
                    "SELECT 1 FROM search_queue WHERE session_id = ? AND message_id = ?"
                    " AND seq > ?",
                    (sid, mid, last),
                ).fetchone():
                    done += [(s,) for s in seqs]
                elif docs is None:
                    left += 1
                else:
                    done += [(s,) for s in seqs]
                    n, dropped = _replace_docs(conn, sid, mid, docs)
                    made, gone = made + n, gone + dropped
            _counted(conn, made, gone)
            conn.executemany("DELETE FROM search_queue WHERE seq = ?", done)
        for (seq,) in done:
            self._tries.pop(seq, None)
        return len(rows), last, made, left

    def _read_docs(self, items: dict[tuple[str, str], list[Any]]) -> None:
        """Set each item's documents from its line (blocking); an item whose line cannot be
        read keeps ``None`` (tried again next pass) until its :data:`RETRIES` run out."""
        with _files() as fds:
            for (sid, mid), item in items.items():
                path = self.layout.transcript(sid)
                got = None if item[1] is None else _read_line(fds, path, *item[1:3])
                if item[1] is None:
                    item[3] = []  # its row is gone: no documents
                elif got is not None and got[0] == mid:
                    item[3] = [(k, t) for k, t in ((0, got[2]), (1, got[3])) if t]
                elif (tries := self._tries.get(item[0][-1], 0) + 1) >= RETRIES:
                    log.warning("search index: %s of %s unreadable: left out", mid, sid)
                    item[3] = []
                else:
                    self._tries[item[0][-1]] = tries

    def _sync_archive(self, conn: sqlite3.Connection, sid: str) -> None:
        """Make the documents of a session's archived revisions those its manifests name
        (blocking): payloads are never changed, only named or not."""
        have: dict[tuple[str, str], list[int]] = {}
        for doc, root, file in conn.execute(
            "SELECT doc, root_id, file FROM search_docs WHERE session_id = ?"
            " AND root_id IS NOT NULL",
            (sid,),
        ):
            have.setdefault((root, file), []).append(doc)
        new: list[tuple[Any, ...]] = []
        live: set[tuple[str, str]] = set()
        for root, rev in self._revisions(sid):
            live.add((root, rev.file))
            if (root, rev.file) in have:
                continue
            at = (root, rev.revision, rev.file)
            with contextlib.suppress(Exception):  # unreadable: not searched
                offset = 0
                for line, data in enumerate(self.archive.read(sid, root, rev)):
                    mid, _, *both = texts(data) or ("", "", "", "")
                    new += [
                        (sid, mid, k, digest(t), *at, line, offset, len(data), fts_text(t))
                        for k, t in enumerate(both)
                        if t
                    ]
                    offset += len(data) + 1
        with _writing(conn):
            gone = [(d,) for key in have.keys() - live for d in have[key]]
            if not conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (sid,)).fetchone():
                gone, new = [], []  # deleted meanwhile: its documents went with its row
            dropped = conn.executemany("DELETE FROM search_docs WHERE doc = ?", gone).rowcount
            _counted(conn, len(new), dropped)
            for row in new:
                cur = conn.execute(
                    "INSERT INTO search_docs (session_id, message_id, tools, digest, root_id,"
                    " revision, file, line, offset, length) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row[:10],
                )
                conn.execute(
                    "INSERT INTO search_archive (rowid, text) VALUES (?, ?)",
                    (cur.lastrowid, row[10]),
                )

    def _revisions(self, sid: str) -> list[tuple[str, Any]]:
        """``(root, revision)`` of every revision the session's manifests name (a root
        whose manifest cannot be read: none of it)."""
        out: list[tuple[str, Any]] = []
        with contextlib.suppress(Exception):
            for root in self.archive.root_ids(sid):
                with contextlib.suppress(Exception):
                    out += [(root, rev) for rev in self.archive.manifest(sid, root)]
        return out

    async def compact(self) -> None:
        """Make the full-text tables again from the live documents, beside the old ones
        (searched meanwhile), a batch at a time between the indexer's passes; then swap
        them in, in one transaction. Their dead entries go; doc ids stay."""
        writer = self._db("writer")
        await writer.call(_shadow_tables)
        after, copied = 0, 0
        while True:
            async with self._busy:
                after, n, missed = await writer.call(self._copy_batch, after)
            if n == 0:
                break
            copied += n
            if missed or self._wake.is_set():  # what was queued meanwhile is indexed now
                self._wake.clear()
                await self.work()
        async with self._busy:
            if await writer.call(self._swap, after):
                self._wake.set()
        log.info("search index: compacted (%d documents)", copied)

    def _copy_batch(self, conn: sqlite3.Connection, after: int) -> tuple[int, int, int]:
        """Copy the next :data:`BATCH` documents after ``after`` into the new tables, their
        lines read before the write (blocking); return the last doc, how many, and how many
        messages it queued."""
        last, n, copies, missed = self._next_texts(conn, after)
        with _writing(conn):
            _insert_next(conn, copies, missed)
        return last, n, len(missed)

    def _next_texts(
        self, conn: sqlite3.Connection, after: int
    ) -> tuple[int, int, list[tuple[str, int, str]], list[tuple[int, str, str]]]:
        """The next :data:`BATCH` documents after ``after``: the last one, how many,
        ``(table, doc, text)`` of each read from its line, and ``(doc, session, message)``
        of each live one whose line no longer is where its row said (a rewrite moved it
        between the row's read and the line's: not every moved line is queued)."""
        rows = conn.execute(
            "SELECT d.doc, d.tools, d.message_id, d.root_id, coalesce(d.offset, m.offset),"
            " coalesce(d.length, m.length), d.session_id, d.file FROM search_docs d"
            " LEFT JOIN messages m ON d.root_id IS NULL AND m.session_id = d.session_id AND"
            " m.message_id = d.message_id WHERE d.doc > ? ORDER BY d.doc LIMIT ?",
            (after, BATCH),
        ).fetchall()
        out: list[tuple[str, int, str]] = []
        missed: list[tuple[int, str, str]] = []
        with _files() as fds:
            for doc, tools, mid, root, offset, length, sid, file in rows:
                path = _line_path(self.layout, sid, root, file)
                got = None if offset is None else _read_line(fds, path, offset, length)
                if got is not None and got[0] == mid:
                    table = "search_archive" if root else "search_tools" if tools else "search_text"
                    out.append((table, doc, fts_text(got[3] if tools else got[2])))
                elif root is None and offset is not None:
                    missed.append((doc, sid, mid))
        return (rows[-1][0] if rows else after), len(rows), out, missed

    def _swap(self, conn: sqlite3.Connection, after: int) -> int:
        """Copy what was made since, then put the new tables in the old ones' place: one
        transaction (blocking; no indexing runs meanwhile); return the messages it queued."""
        missed = 0
        with _writing(conn):
            n = 1
            while n:
                after, n, copies, lost = self._next_texts(conn, after)
                _insert_next(conn, copies, lost)
                missed += len(lost)
            entries = 0
            for table in FTS_TABLES:
                entries += conn.execute(f"SELECT count(*) FROM {table}_next_docsize").fetchone()[0]
                conn.execute(f"DROP TABLE {table}")
                conn.execute(f"ALTER TABLE {table}_next RENAME TO {table}")
            live = conn.execute("SELECT count(*) FROM search_docs").fetchone()[0]
            dead = max(0, entries - live)  # (a line that could not be read: queued, made again)
            conn.execute("UPDATE search_stats SET live = ?, dead = ?", (live, dead))
        return missed

    async def rebuild(self) -> None:
        """Make the search index again from the transcripts (``verify --repair``)."""
        self._archived.update(os.listdir(self.layout.revisions_root))
        async with self._busy:
            await self._db("writer").call(_clear)
        await self.work(log_progress=True)

    async def counters(self) -> dict[str, int]:
        """``host.stats``: messages waiting to be searchable, documents made, a build."""
        if self.runs:
            self.pending = await self._db("pages").call(_count)
        live, dead = await self._db("pages").call(_stats)
        return {
            "search.pending": self.pending,
            "search.building": int(self.building),
            "search.indexed": self.indexed,
            "search.live": live,
            "search.dead": dead,
        }

    # -- queries --------------------------------------------------------------------

    async def search(self, p: SearchParams) -> SearchResult:
        """Answer ``session.search``."""
        q = parse_query(p.query)
        if isinstance(p.cursor, str):
            _position(p.cursor)  # a bad one is refused before any work
        await self.index.settle()  # every answered append is queued
        pending = await self._db("search").call(_count)
        archives = p.scope == "all" and (self._archived or self._syncing) and not self.building
        if self.runs and (0 < pending <= CATCH_UP or archives):
            await self.work(limit=CATCH_UP)
            pending = self.pending
        return await self._db("search").call(_answer, self.layout, q, p, pending)


def _answer(
    conn: sqlite3.Connection, layout: Layout, q: Query, p: SearchParams, pending: int
) -> SearchResult:
    if isinstance(p.cursor, str):
        pos, ceiling = _position(p.cursor)
    else:
        pos, ceiling = 0, _newest(conn)
    cands = _timed(conn, lambda: _rank(conn, q, p, ceiling))
    limit = p.limit if isinstance(p.limit, int) else SEARCH_PAGE
    hits, pos = _hits(layout, q, cands, pos, limit)
    return SearchResult(
        hits=hits,
        partial=pending > 0,
        pending=pending,
        candidates=len(cands),
        cursor=_cursor(pos, ceiling) if pos < len(cands) else msgspec.UNSET,
    )


def _timed(conn: sqlite3.Connection, work: Callable[[], T]) -> T:
    """``work()``, stopped by SQLite past :data:`RANK_TIME` seconds: ``LIMIT_EXCEEDED``."""
    deadline = time.monotonic() + RANK_TIME
    conn.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
    try:
        return work()
    except sqlite3.OperationalError:
        if time.monotonic() <= deadline:
            raise
        raise LimitExceeded(
            f"session.search: ranking took over {RANK_TIME:.0f} s; use fewer or shorter terms",
            limit=int(RANK_TIME * 1000),
        ) from None
    finally:
        conn.set_progress_handler(None, 0)


def _newest(conn: sqlite3.Connection) -> int:
    """The newest document's number (a search's first page ranks up to it, its later
    pages too: what is indexed meanwhile does not move them)."""
    return int(conn.execute("SELECT coalesce(max(doc), 0) FROM search_docs").fetchone()[0])


def _stats(conn: sqlite3.Connection) -> tuple[int, int]:
    """Documents live, and dead entries (words of documents gone, still in the tables)."""
    live, dead = conn.execute("SELECT live, dead FROM search_stats").fetchone()
    return int(live), int(dead)


def _counted(conn: sqlite3.Connection, made: int, gone: int) -> None:
    """Count documents made and gone (their words stay: dead entries)."""
    if made or gone:
        conn.execute(
            "UPDATE search_stats SET live = live + ? - ?, dead = dead + ?", (made, gone, gone)
        )


def _count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM search_queue").fetchone()[0])


@contextlib.contextmanager
def _writing(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction (``BEGIN IMMEDIATE``): committed, or rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _insert_next(
    conn: sqlite3.Connection,
    copies: list[tuple[str, int, str]],
    missed: list[tuple[int, str, str]],
) -> None:
    """A compaction's documents into the new tables. A document whose line could not be
    read (a rewrite moved it meanwhile) goes, and its message is queued: its documents are
    made again (kept, its unchanged digest would let the indexer pass it over)."""
    for table, doc, text in copies:
        conn.execute(f"INSERT INTO {table}_next (rowid, text) VALUES (?, ?)", (doc, text))
    for doc, sid, mid in missed:
        conn.execute("DELETE FROM search_docs WHERE doc = ?", (doc,))
        conn.execute("INSERT INTO search_queue (session_id, message_id) VALUES (?, ?)", (sid, mid))


def _shadow_tables(conn: sqlite3.Connection, *, make: bool = True) -> None:
    """Empty full-text tables beside the searched ones, for a compaction (those a crash
    left are dropped first; ``make=False``: only that)."""
    for table in FTS_TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {table}_next")
        if make:
            conn.execute(f"CREATE VIRTUAL TABLE {table}_next USING fts5(text, {FTS})")


def _clear(conn: sqlite3.Connection) -> None:
    """Drop every document and queue every message (blocking)."""
    with _writing(conn):
        for table in FTS_TABLES:
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('delete-all')")
        conn.execute("DELETE FROM search_docs")
        conn.execute("UPDATE search_stats SET live = 0, dead = 0")
        conn.execute("DELETE FROM search_queue")
        conn.execute(
            "INSERT INTO search_queue (session_id, message_id)"
            " SELECT session_id, message_id FROM messages ORDER BY session_id, line"
        )


def _optimize(conn: sqlite3.Connection) -> None:
    """Merge the full-text index's segments (blocking), as 'optimize' would, in steps of
    its own transaction each: one 'optimize' of a million documents would hold the write
    lock for longer than the host's index waits for it."""
    for table in FTS_TABLES:
        for _ in range(100_000):
            before = conn.total_changes
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('merge', -500)")
            if conn.total_changes - before < 2:  # FTS5's sign of a merge that did nothing
                break


def _replace_docs(
    conn: sqlite3.Connection, sid: str, mid: str, docs: Sequence[tuple[int, str]]
) -> tuple[int, int]:
    """Make a message's documents ``(tools, text)``; unchanged ones stay. Return how many
    were made and how many went (an old document's words stay in the contentless table,
    its row goes)."""
    have = conn.execute(
        "SELECT doc, tools, digest FROM search_docs WHERE session_id = ? AND message_id = ?"
        " AND root_id IS NULL",
        (sid, mid),
    ).fetchall()
    want = [(tools, text, digest(text)) for tools, text in docs]
    if sorted((t, d) for _, t, d in have) == sorted((t, d) for t, _, d in want):
        return 0, 0
    gone = conn.executemany("DELETE FROM search_docs WHERE doc = ?", [(d,) for d, _, _ in have])
    for tools, text, dig in want:
        cur = conn.execute(
            "INSERT INTO search_docs (session_id, message_id, tools, digest) VALUES (?, ?, ?, ?)",
            (sid, mid, tools, dig),
        )
        table = "search_tools" if tools else "search_text"
        conn.execute(
            f"INSERT INTO {table} (rowid, text) VALUES (?, ?)", (cur.lastrowid, fts_text(text))
        )
    return len(want), gone.rowcount


# -- the command line and verify ----------------------------------------------------------


def search_command(
    data_dir: str, query: str, *, limit: int, session_id: str | None, scope: bool
) -> int:
    """``python -m host search DIR QUERY``: print the hits for a person; exit status."""
    import sys

    from host._errors import HostError

    layout = Layout(data_dir)
    if not os.path.exists(layout.index):
        print(f"no index at {layout.index}: start the host on {data_dir} first", file=sys.stderr)
        return 2
    p = SearchParams(
        query=query,
        limit=limit,
        session_id=session_id or msgspec.UNSET,
        scope="all" if scope else "active",
    )
    conn = connect_read_only(layout.index)
    try:
        result = _answer(conn, layout, parse_query(query), p, _count(conn))
    except HostError as exc:
        print(f"python -m host search: {exc.message}", file=sys.stderr)
        return 2
    finally:
        conn.close()
    for hit in result.hits:
        text, marked, at = hit.snippet.text, [], 0
        for a, b in hit.snippet.ranges:
            marked += [text[at:a], "[", text[a:b], "]"]
            at = b
        where = f"  (root {hit.root_id}, revision {hit.revision})" if hit.root_id else ""
        print(f"{hit.session_id}  line {hit.line}  {hit.role}  score {hit.score:.3f}{where}")
        print("    " + "".join([*marked, text[at:]]))
    note = f"; {result.pending} message(s) not indexed yet" if result.partial else ""
    print(f"{len(result.hits)} hit(s){note}")
    return 0 if result.hits else 1


def check(layout: Layout, out: TextIO) -> int:
    """``verify``: each message's documents hold its text as the transcript has it (by
    digest), unless it is queued (indexed soon); return the problems (blocking)."""
    conn = connect_read_only(layout.index)
    try:
        queued = set(conn.execute("SELECT session_id, message_id FROM search_queue").fetchall())
        orphans = conn.execute(
            "SELECT DISTINCT session_id FROM search_docs d WHERE NOT EXISTS"
            " (SELECT 1 FROM sessions s WHERE s.session_id = d.session_id)"
        ).fetchall()
        docs: dict[tuple[str, str], set[tuple[int, int]]] = {}
        for sid, mid, tools, dig in conn.execute(
            "SELECT session_id, message_id, tools, digest FROM search_docs WHERE root_id IS NULL"
        ):
            docs.setdefault((sid, mid), set()).add((tools, dig))
        want: dict[tuple[str, str], set[tuple[int, int]]] = {}
        with _files() as fds:
            for sid, mid, offset, length in conn.execute(
                "SELECT session_id, message_id, offset, length FROM messages"
                " ORDER BY session_id, line"
            ):
                got = _read_line(fds, layout.transcript(sid), offset, length)
                if got is not None and (d := {(k, digest(t)) for k, t in enumerate(got[2:]) if t}):
                    want[(sid, mid)] = d
    finally:
        conn.close()
    for (sid,) in orphans:
        print(f"{sid}: search documents of a session that does not exist", file=out)
    problems = len(orphans)
    for key in sorted((set(want) | set(docs)) - queued):
        if want.get(key, set()) != docs.get(key, set()):
            problems += 1
            what = "not in the transcript" if key not in want else "not as the transcript has it"
            print(f"{key[0]}: message {key[1]}: its search documents are {what}", file=out)
    if problems:
        print(f"search index: {len(docs)} message(s) indexed: {problems} problem(s)", file=out)
    return problems
