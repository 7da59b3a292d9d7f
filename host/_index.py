"""The SQLite index (aiosqlite, WAL): sessions, one row per message, turns.

The index is derived: every row can be rebuilt from the transcripts. It is what makes a
page of ``session.get`` and a lookup by id cost in proportion to what they return. One
connection is shared by every session, so every transaction runs under one
``asyncio.Lock`` and a failed one is rolled back shielded (a cancelled ``await`` does not
stop the SQL already queued on aiosqlite's thread).

Appended rows are committed *after* the answer, in batches (the transcript is the truth
and is fsynced first; start-up indexes any line the index missed). Until their batch
commits they are known to :meth:`Index.lookup_now`, the append path's one look at the
index, which reads committed rows through a second, synchronous connection on the loop:
a point query costs microseconds, a thread hop a hundred. Every other query and
transaction first waits for the rows queued before it (:meth:`Index.settle`), so reads
see every answered append. What is kept in memory of one session's rows is its
:class:`RowCache`, which its session owns; a batch that fails to commit marks its
sessions' caches ``stale``, and a stale session is rebuilt from its file before it is
served.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import logging
import os
import re
import sqlite3
import stat
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import aiosqlite
import msgspec
from msgspec import Raw

from host._fs import FileSystem, completed
from host._transcript import FileStamp
from host._turnlog import TurnRecord

log = logging.getLogger("host.index")


def now_iso(at: float | None = None) -> str:
    """Return the current UTC time (or ``at``, POSIX seconds) as ISO 8601 with milliseconds."""
    t = dt.datetime.now(dt.UTC) if at is None else dt.datetime.fromtimestamp(at, dt.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001-sessions-messages",
        """
        CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            title TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            line_count INTEGER NOT NULL DEFAULT 0,
            byte_size INTEGER NOT NULL DEFAULT 0,
            file_ino INTEGER NOT NULL DEFAULT 0,
            file_mtime_ns INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE messages (
            session_id TEXT NOT NULL,
            line INTEGER NOT NULL,
            message_id TEXT NOT NULL,
            offset INTEGER NOT NULL,
            length INTEGER NOT NULL,
            role TEXT NOT NULL,
            turn_id TEXT,
            status TEXT NOT NULL,
            pager TEXT,
            PRIMARY KEY (session_id, line)
        ) WITHOUT ROWID;
        CREATE UNIQUE INDEX messages_by_id ON messages (session_id, message_id);
        CREATE TABLE turns (
            session_id TEXT NOT NULL,
            turn_id TEXT NOT NULL,
            status TEXT NOT NULL,
            started_at TEXT NOT NULL,
            ended_at TEXT,
            PRIMARY KEY (session_id, turn_id)
        ) WITHOUT ROWID;
        CREATE INDEX turns_running ON turns (session_id) WHERE status = 'running';
        """,
    ),
    (
        # dirty: a change other than an append may have reached the transcript since the
        # rows were last committed (set durably before it, see Index.mark_dirty).
        # turns_size: how much of the session's turn log the turns table holds.
        "0002-dirty-turn-log",
        """
        ALTER TABLE sessions ADD COLUMN dirty INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE sessions ADD COLUMN turns_size INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE turns ADD COLUMN prompt_id TEXT;
        """,
    ),
]
# -- issue 35 hook: the search index and the sessions' meta (host/_search_sql.py) --
from host._search_sql import MIGRATION as _SEARCH_MIGRATION  # noqa: E402
from host._search_sql import compacting as _compacting  # noqa: E402

MIGRATIONS.append(_SEARCH_MIGRATION)


class Row(NamedTuple):
    """One message's place in its transcript."""

    line: int
    message_id: str
    offset: int
    length: int
    role: str
    turn_id: str | None
    status: str
    pager: str | None


class MetaRow(NamedTuple):
    """A session's title and ``meta`` as the index keeps them (``meta`` JSON text)."""

    title: str | None
    meta: str | None
    pinned: int
    session_id: str

    @classmethod
    def of(cls, session_id: str, title: str | None, meta: dict[str, Raw] | None) -> MetaRow:
        pinned = int(meta is not None and bytes(meta.get("pinned", b"")) == b"true")
        text = None if meta is None else _ENC.encode(meta).decode("utf-8", "surrogatepass")
        return cls(title, text, pinned, session_id)


_ENC = msgspec.json.Encoder()
_SET_META = (
    "UPDATE sessions SET title = ?, meta = ?, pinned = ?, meta_dirty = 0 WHERE session_id = ?"
)


@dataclass(slots=True)
class SessionRow:
    """One session as the index knows it."""

    session_id: str
    title: str | None
    created_at: str
    updated_at: str
    line_count: int
    byte_size: int
    file_ino: int
    file_mtime_ns: int
    dirty: int = 0
    turns_size: int = 0

    def matches(self, stamp: FileStamp) -> bool:
        """Whether the file is exactly as the index last recorded it."""
        return (self.file_ino, self.byte_size, self.file_mtime_ns) == (
            stamp.ino,
            stamp.size,
            stamp.mtime_ns,
        )


_ROW_COLS = "line, message_id, offset, length, role, turn_id, status, pager"
_SESSION_COLS = (
    "session_id, title, created_at, updated_at, line_count, byte_size, file_ino, file_mtime_ns,"
    " dirty, turns_size"
)


def set_aside_index(path: str) -> str:
    """Move a damaged index (and its WAL) aside, keeping its bytes; return where.

    The index is derived, so it is rebuilt from the transcripts (the turn table, which
    only it holds, starts empty).
    """
    aside = f"{path}.damaged-{os.urandom(3).hex()}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    return aside


class IndexBusy(Exception):
    """Raised when another program holds a lock on the index: it is not ours to move."""

    def __init__(self, path: str, exc: sqlite3.Error) -> None:
        super().__init__(f"index {path} is locked by another program ({exc}): left as it is")


def busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says another connection holds the database's lock."""
    code: int = getattr(exc, "sqlite_errorcode", 0)
    return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


DISK_FULL = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOMEM)
"""SQLite's codes for a disk that is full or failing (``IOERR``'s extended codes included)."""
NOT_WRITABLE = (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_CANTOPEN)
"""SQLite's codes for a file it may not write or open: a read-only disk, no permission."""


def disk_trouble(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is the disk's trouble (full, I/O error, read-only), never damage.

    Such an index is left where it is: setting a good index aside for it would lose its
    turn table, which nothing else holds (issue 26, case 10).
    """
    code: int = getattr(exc, "sqlite_errorcode", 0)
    return code & 0xFF in DISK_FULL + NOT_WRITABLE


_MIGRATIONS_TABLE = "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT)"


def _statements(sql: str) -> list[str]:
    # issue 35 hook: a trigger's body holds ";" too, so a statement ends where SQLite says
    out, stmt = [], ""
    for part in sql.split(";"):
        stmt += part + ";"
        if sqlite3.complete_statement(stmt):
            if stmt.strip(" \n;"):
                out.append(stmt)
            stmt = ""
    return out


def _schema(conn: sqlite3.Connection) -> set[tuple[str, str, str | None]]:
    """Every table, index, view and trigger of ``conn`` but SQLite's own and a cut
    compaction's (dropped when the search indexer starts), with its SQL.

    The SQL's spacing is not compared: re-indenting a migration changes no schema; nor is
    how a table's name is quoted: ``ALTER TABLE ... RENAME`` (a search compaction's swap)
    stores it quoted, which changes no schema either.
    """
    rows = conn.execute("SELECT type, name, sql FROM sqlite_master")
    return {
        (kind, name, _QUOTED_NAME.sub(r"\1\3", " ".join(sql.split())) if sql else None)
        for kind, name, sql in rows
        if not name.startswith("sqlite_") and not _compacting(name)
    }


_QUOTED_NAME = re.compile(r"""^(CREATE (?:VIRTUAL )?TABLE )(["'`]?)(\w+)\2""")


def _schema_after(applied: int) -> set[tuple[str, str, str | None]]:
    """The schema the first ``applied`` migrations make, built in memory."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.execute(_MIGRATIONS_TABLE)
        for _, sql in MIGRATIONS[:applied]:
            for stmt in _statements(sql):
                conn.execute(stmt)
        return _schema(conn)


BUSY_TIMEOUT = 5.0
"""Seconds a statement waits for another program's lock on the index before it fails
(SQLite's busy timeout; ``--busy-timeout`` on the command line)."""


def connect_read_only(path: str, busy_timeout: float = BUSY_TIMEOUT) -> sqlite3.Connection:
    """Open the database at ``path`` read-only: it is never created, nor anything beside it.

    The path is quoted into the URI: a ``#`` or ``?`` in a folder's name is part of it,
    not URI syntax that would cut the path (and the ``mode=ro`` after it) short. With no
    ``-wal`` beside it no program has it open (the last connection to close removes it),
    and a ``mode=ro`` reader would make the ``-wal`` and ``-shm`` itself: it is read as
    ``immutable``, which creates and locks nothing. With one (a live host, or one that
    died) it is read the way WAL readers share it.
    """
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"
    if not os.path.exists(path + "-wal"):
        uri += "&immutable=1"
    return sqlite3.connect(uri, uri=True, timeout=busy_timeout)


def index_problem(path: str, busy_timeout: float = BUSY_TIMEOUT) -> str | None:
    """Why the index at ``path`` cannot be used as it is, or ``None`` (also when absent).

    A cheap read-only look: the header, the schema and the migrations applied. They must
    be this host's own, in order, and the schema exactly the one they make (an index of a
    newer hostcore, another program's database, or one a tool altered, is not read with
    this one's queries). A full check would cost O(index) at every start: damage deeper in
    is met during recovery, which then starts over. Raises :class:`IndexBusy` when another
    program holds the index's lock.
    """
    if not os.path.exists(path):
        return None
    if not stat.S_ISREG(os.lstat(path).st_mode):  # a folder (read: "disk I/O error"), a FIFO
        return "not a regular file"
    applied: list[str] = []
    try:
        with contextlib.closing(connect_read_only(path, busy_timeout)) as conn:
            schema = _schema(conn)
            if _schema_after(0) <= schema:  # our migrations table
                applied = [r[0] for r in conn.execute("SELECT name FROM migrations ORDER BY name")]
            if any(name == "sessions" for _, name, _ in schema):
                conn.execute("SELECT count(*) FROM sessions").fetchone()
    except sqlite3.DatabaseError as exc:
        if busy(exc):
            raise IndexBusy(path, exc) from None
        if disk_trouble(exc):
            raise
        return f"damaged ({exc})"
    ours = [name for name, _ in MIGRATIONS]
    if applied != ours[: len(applied)]:
        return f"of another schema (migrations {applied}; this host has {ours})"
    if schema and schema != (expected := _schema_after(len(applied))):
        differ = sorted({name for _, name, _ in schema ^ expected})
        return f"of another schema ({', '.join(differ)} not as migrations {applied} make them)"
    return None


FLUSH_DELAY = 0.05
"""Seconds queued rows wait for more to share their commit (a read does not wait)."""
FLUSH_ROWS = 4096
"""Queued rows that start a commit at once."""
KNOWN_IDS = 100_000
"""Committed ids kept in memory for dedup, over all sessions (about 12 MB at most)."""
KNOWN_SESSION = 20_000
"""A session with more rows than this is looked up in SQLite each time."""


@dataclass(slots=True, eq=False)
class RowCache:
    """What the index keeps in memory of one session's rows; its session owns it."""

    session_id: str
    fresh: dict[str, int] = dataclasses.field(default_factory=dict)
    """``{id: line}`` of its rows queued for a batch, not yet committed."""
    known: dict[str, int] | None = None
    """``{id: line}`` of every committed row, read once (``None``: not read, or evicted)."""
    too_big: bool = False  # more rows than are worth keeping known
    stale: bool = False  # a batch of its rows failed: rebuilt from its file before use


class _Queued(NamedTuple):
    """Appended rows waiting for their batch's commit, and the file after them."""

    cache: RowCache
    rows: Sequence[Row]
    stamp: FileStamp
    line_count: int
    now: str  # the session's new updatedAt; "" for the time of the commit


class Index:
    """The shared index connection and every query the host makes of it."""

    def __init__(self, conn: aiosqlite.Connection, fs: FileSystem | None = None) -> None:
        self._conn = conn
        self._lock = asyncio.Lock()
        self.fs = fs or FileSystem()
        self._reader: sqlite3.Connection | None = None
        self._queue: list[_Queued] = []
        self._queued = 0  # batches of rows ever queued ...
        self._committed = 0  # ... and how many of them are through (committed or given up)
        # The caches whose committed ids are known, least recently used first: _commit adds
        # what it commits; every other write of a session's rows drops them after its
        # transaction (_rows_transaction).
        self._known: collections.OrderedDict[RowCache, None] = collections.OrderedDict()
        self._known_count = 0
        self._queued_rows = 0
        self._flusher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.batches = 0  # batches of queued rows committed (for host.stats)
        self.failures = 0  # ... and of them, how many failed
        self.error: BaseException | None = None
        self.stale = 0
        """How many sessions' queued rows failed to commit (:attr:`RowCache.stale`)."""
        self._full = self._normal = 0  # PRAGMA synchronous's levels, as SQLite reports them
        self.on_commit: Callable[[], None] | None = None
        """issue 35 hook: told after every commit (the search indexer wakes)."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, path: str, fs: FileSystem | None = None, busy_timeout: float = BUSY_TIMEOUT
    ) -> AsyncIterator[Index]:
        """Open (creating and migrating) the index at ``path``.

        A statement that finds another program holding the index's lock waits up to
        ``busy_timeout`` seconds for it, then fails (``IndexBusy`` here, at the open).
        """
        conn = await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout)
        index = cls(conn, fs)
        try:
            try:
                await index._setup()
            except sqlite3.OperationalError as exc:
                if busy(exc):
                    raise IndexBusy(path, exc) from None
                raise
            index._reader = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=busy_timeout
            )
            index._reader.execute("PRAGMA query_only = 1")
            yield index
        finally:
            try:
                with contextlib.suppress(sqlite3.Error):
                    await index.settle()  # a failed batch is reconciled at the next start
            finally:
                if index._reader is not None:
                    index._reader.close()
                await conn.close()

    async def _setup(self) -> None:
        async with self._lock:
            await self._conn.execute("PRAGMA journal_mode=WAL")
            self._full = await self._synchronous("FULL")
            self._normal = await self._synchronous("NORMAL")
            await self._conn.execute(_MIGRATIONS_TABLE)
            done = {r[0] for r in await self._conn.execute_fetchall("SELECT name FROM migrations")}
            for name, sql in MIGRATIONS:
                if name in done:
                    continue
                await self._conn.execute("BEGIN IMMEDIATE")
                try:
                    for stmt in _statements(sql):
                        await self._conn.execute(stmt)
                    await self._conn.execute(
                        "INSERT INTO migrations VALUES (?, datetime('now'))", (name,)
                    )
                    await self._conn.execute("COMMIT")
                except BaseException:
                    await completed(self._conn.execute("ROLLBACK"))
                    raise

    async def _synchronous(self, level: str) -> int:
        """Set ``PRAGMA synchronous``; return the level SQLite reports in force (0-3)."""
        await self._conn.execute(f"PRAGMA synchronous={level}")
        rows = list(await self._conn.execute_fetchall("PRAGMA synchronous"))
        return int(rows[0][0])

    # -- queued appends -----------------------------------------------------------------

    def queue_append(
        self, cache: RowCache, rows: Sequence[Row], stamp: FileStamp, line_count: int
    ) -> None:
        """Queue rows of lines already durable in the transcript; commit them soon.

        Soon is :data:`FLUSH_DELAY` later, or at once past :data:`FLUSH_ROWS` rows, or when
        any other query or transaction wants the index.
        """
        self._queue.append(_Queued(cache, rows, stamp, line_count, ""))
        self._queued += 1
        self._queued_rows += len(rows)
        fresh = cache.fresh
        for r in rows:
            fresh[r.message_id] = r.line
        if self._queued_rows >= FLUSH_ROWS:
            self._start_flush()
        elif self._timer is None and self._flusher is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_DELAY, self._start_flush)

    def _start_flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flusher is None and self._queue:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def append(
        self, cache: RowCache, rows: Sequence[Row], stamp: FileStamp, line_count: int, now: str
    ) -> None:
        """Commit rows of appended lines now, after those queued before them."""
        await self.settle()
        await self._commit([_Queued(cache, rows, stamp, line_count, now)])

    async def settle(self) -> None:
        """Wait until every row queued so far is committed.

        Raises ``sqlite3.OperationalError`` when a batch it waited for failed: the caller
        must not go on as if the index held those rows (their sessions are stale).
        """
        target, failures = self._queued, self.failures
        while self._committed < target:
            self._start_flush()
            assert self._flusher is not None
            await asyncio.shield(self._flusher)
        if self.failures != failures:
            raise sqlite3.OperationalError(f"appended rows could not be indexed: {self.error}")

    def lag(self, cache: RowCache) -> None:
        """The session's file holds what its rows do not: rebuilt from it before use."""
        if not cache.stale:
            cache.stale = True
            self.stale += 1

    def caught_up(self, cache: RowCache) -> None:
        """A stale session's rows were rebuilt from its file (or the session is gone):
        forget what was queued."""
        if cache.stale:
            cache.stale = False
            self.stale -= 1
        cache.fresh.clear()
        self._forget(cache)

    async def _flush(self) -> None:
        """Commit the rows queued so far in one transaction; start the next batch's."""
        batch, self._queue = self._queue, []
        self._queued_rows = 0
        self.batches += 1
        try:
            await self._commit([q for q in batch if not q.cache.stale])
        except BaseException as exc:
            sids = sorted({q.cache.session_id for q in batch})
            log.error("index: a batch of appended rows failed to commit (%r): %s", exc, sids)
            for q in batch:  # the files hold the lines: rebuilt on next use
                self.lag(q.cache)
            self.failures += 1
            self.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._committed += len(batch)
            for q in batch:
                if q.cache.stale:
                    continue  # its queued ids still answer replays until it is rebuilt
                fresh = q.cache.fresh
                for r in q.rows:
                    if fresh.get(r.message_id) == r.line:
                        del fresh[r.message_id]
            self._flusher = None
            if self._queue:  # rows queued during this commit: the next batch's
                self._timer = asyncio.get_running_loop().call_later(FLUSH_DELAY, self._start_flush)

    async def _commit(self, batch: Sequence[_Queued]) -> None:
        if not batch:
            return
        last = {q.cache.session_id: q for q in batch}
        now = now_iso()
        async with self._transaction() as db:
            await db.executemany(
                "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(q.cache.session_id, *r) for q in batch for r in q.rows],
            )
            await db.executemany(_SET_FILE, [_file_params(q, now) for q in last.values()])
        for q in batch:  # committed: known from now on
            known = q.cache.known
            if known is not None:
                before = len(known)
                known.update((r.message_id, r.line) for r in q.rows)
                self._known_count += len(known) - before
        self._evict()

    def lookup_now(self, cache: RowCache, message_ids: Sequence[str]) -> dict[str, int]:
        """Return ``{message_id: line}`` of those stored, queued rows included; no await."""
        fresh = cache.fresh
        found: dict[str, int] = {}
        unseen: dict[str, None] = {}  # in order, once each
        for m in message_ids:  # one loop, no comprehension: one append at a time is hot
            if m in fresh:
                found[m] = fresh[m]
            else:
                unseen[m] = None
        if not unseen:
            return found
        known = self._known_ids(cache)
        if known is not None:
            for m in unseen:
                if m in known:
                    found[m] = known[m]
            return found
        rest = list(unseen)
        session_id = cache.session_id
        assert self._reader is not None
        for i in range(0, len(rest), 500):
            part = rest[i : i + 500]
            self.fs.sqlite("read")
            marks = "?" if len(part) == 1 else ",".join("?" * len(part))
            found.update(self._reader.execute(_LOOKUP % marks, (session_id, *part)).fetchall())
        return found

    def _known_ids(self, cache: RowCache) -> dict[str, int] | None:
        """The session's committed ``{id: line}``, read once; ``None`` for a big session."""
        known = cache.known
        if known is not None:
            self._known.move_to_end(cache)
            return known
        if cache.too_big:
            return None
        assert self._reader is not None
        self.fs.sqlite("read")
        rows = self._reader.execute(_KNOWN, (cache.session_id, KNOWN_SESSION + 1)).fetchall()
        if len(rows) > KNOWN_SESSION:
            cache.too_big = True
            return None
        known = cache.known = dict(rows)
        self._known[cache] = None
        self._known_count += len(known)
        self._evict()
        return known

    def _evict(self) -> None:
        while self._known_count > KNOWN_IDS and len(self._known) > 1:
            self._forget(next(iter(self._known)))

    def _forget(self, cache: RowCache) -> None:
        """Drop what is known of a session's committed rows (they changed, or for room)."""
        if cache.known is not None:
            self._known_count -= len(cache.known)
            cache.known = None
        self._known.pop(cache, None)
        cache.too_big = False

    @contextlib.asynccontextmanager
    async def _rows_transaction(self, cache: RowCache) -> AsyncIterator[aiosqlite.Connection]:
        """A transaction that changes a session's rows; what is known of them is dropped after."""
        try:
            async with self.transaction() as db:
                yield db
        finally:
            self._forget(cache)

    # -- transactions ---------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def transaction(self, *, durable: bool = False) -> AsyncIterator[aiosqlite.Connection]:
        """Run statements in one transaction, after the queued rows; failure rolls back.

        ``durable``: committed with ``synchronous=FULL``, so the WAL is fsynced before the
        commit returns, and with it every commit before this one (the WAL is one file,
        written in order). Others are ``NORMAL``: a power cut may take them back.
        """
        await self.settle()
        async with self._transaction(durable=durable) as db:
            yield db

    @contextlib.asynccontextmanager
    async def _transaction(self, *, durable: bool = False) -> AsyncIterator[aiosqlite.Connection]:
        async with self._lock:
            self.fs.sqlite("write")
            if durable:
                await self._conn.execute("PRAGMA synchronous=FULL")
            try:
                await self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    await self._conn.execute("COMMIT")
                except BaseException:
                    await completed(self._rollback())
                    raise
                self.fs.sqlite_committed(self._full if durable else self._normal)
                if self.on_commit is not None:  # issue 35 hook
                    self.on_commit()
            finally:
                if durable:
                    await completed(self._conn.execute("PRAGMA synchronous=NORMAL"))

    async def mark_dirty(self, session_id: str) -> None:
        """Record, durably, that a change other than an append is about to reach the transcript.

        Called before the file is changed (a rewrite, a cut, a delete, a rescan that may
        mend it); the commit that indexes the change clears it. A power cut may take back
        any commit made without a sync (``synchronous=NORMAL``), several at once; this one
        is synced, so a start that finds the mark cannot trust the session's rows and
        rescans its file, and one that does not find it knows the rows describe every
        byte of the transcript they cover: since they were committed, only appends can
        have reached it.
        """
        async with self.transaction(durable=True) as db:
            await db.execute("UPDATE sessions SET dirty = 1 WHERE session_id = ?", (session_id,))

    async def mark_meta(self, session_id: str) -> None:
        """Record, durably, that ``meta.json`` is about to be replaced: a start that finds
        the mark reads the file again (the row's title and ``meta`` may not be the file's)."""
        async with self.transaction(durable=True) as db:
            await db.execute(
                "UPDATE sessions SET meta_dirty = 1 WHERE session_id = ?", (session_id,)
            )

    async def set_meta(self, rows: Iterable[MetaRow]) -> None:
        """Record sessions' title and ``meta`` as their ``meta.json`` holds them now."""
        async with self.transaction() as db:
            await db.executemany(_SET_META, list(rows))

    async def _rollback(self) -> None:
        if self._conn.in_transaction:
            await self._conn.execute("ROLLBACK")

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        await self.settle()
        async with self._lock:
            self.fs.sqlite("read")
            return list(await self._conn.execute_fetchall(sql, params))

    # -- reads ----------------------------------------------------------------------

    async def session(self, session_id: str) -> SessionRow | None:
        """Return the session's row, or ``None``."""
        rows = await self._fetch(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE session_id = ?", (session_id,)
        )
        return SessionRow(*rows[0]) if rows else None

    async def meta_marked(self) -> list[str]:
        """The sessions whose title and ``meta`` may not be their ``meta.json``'s."""
        return [r[0] for r in await self._fetch("SELECT session_id FROM sessions WHERE meta_dirty")]

    async def sessions(self) -> list[SessionRow]:
        """Return every session, most recently written first."""
        rows = await self._fetch(
            f"SELECT {_SESSION_COLS} FROM sessions ORDER BY updated_at DESC, session_id"
        )
        return [SessionRow(*r) for r in rows]

    async def lookup(self, session_id: str, message_id: str) -> Row | None:
        """Return the row of a message id, or ``None``."""
        rows = await self._fetch(
            f"SELECT {_ROW_COLS} FROM messages WHERE session_id = ? AND message_id = ?",
            (session_id, message_id),
        )
        return Row(*rows[0]) if rows else None

    async def rows(self, session_id: str, start: int = 0, end: int | None = None) -> list[Row]:
        """Return the rows of lines ``[start, end)`` in order."""
        rows = await self._fetch(
            f"SELECT {_ROW_COLS} FROM messages WHERE session_id = ? AND line >= ? AND line < ?"
            " ORDER BY line",
            (session_id, start, end if end is not None else 1 << 62),
        )
        return [Row(*r) for r in rows]

    async def turns(self, session_id: str) -> list[tuple[str, str, str, str | None]]:
        """Return ``(turn_id, status, started_at, ended_at)`` of every turn of a session."""
        return await self._fetch(
            "SELECT turn_id, status, started_at, ended_at FROM turns WHERE session_id = ?"
            " ORDER BY started_at, turn_id",
            (session_id,),
        )

    def turn(self, session_id: str, turn_id: str) -> str | None:
        """Return a turn's status, or ``None`` when there is no such turn; no await.

        On the synchronous reader, like :meth:`lookup_now` (a checkpoint save asks for
        every snapshot): turn rows are committed by the call that writes them, which
        holds the session's lock, as every caller of this does.
        """
        assert self._reader is not None
        self.fs.sqlite("read")
        row = self._reader.execute(
            "SELECT status FROM turns WHERE session_id = ? AND turn_id = ?", (session_id, turn_id)
        ).fetchone()
        return str(row[0]) if row else None

    async def has_prompt(self, session_id: str, turn_id: str) -> bool:
        """Whether a user message of the turn is stored."""
        rows = await self._fetch(
            "SELECT 1 FROM messages WHERE session_id = ? AND turn_id = ? AND role = 'user' LIMIT 1",
            (session_id, turn_id),
        )
        return bool(rows)

    async def running_turn(self, session_id: str) -> str | None:
        """Return the id of the session's running turn, if any."""
        rows = await self._fetch(
            "SELECT turn_id FROM turns WHERE session_id = ? AND status = 'running'", (session_id,)
        )
        return str(rows[0][0]) if rows else None

    async def last_user(self, session_id: str, before: int | None = None) -> Row | None:
        """Return the last user message (before line ``before``), if any."""
        rows = await self._fetch(
            f"SELECT {_ROW_COLS} FROM messages WHERE session_id = ? AND role = 'user'"
            " AND line < ? ORDER BY line DESC LIMIT 1",
            (session_id, before if before is not None else 1 << 62),
        )
        return Row(*rows[0]) if rows else None

    async def next_user_line(self, session_id: str, after: int) -> int | None:
        """Return the line of the first user message after line ``after``, if any."""
        rows = await self._fetch(
            "SELECT line FROM messages WHERE session_id = ? AND role = 'user' AND line > ?"
            " ORDER BY line LIMIT 1",
            (session_id, after),
        )
        return int(rows[0][0]) if rows else None

    # -- writes ---------------------------------------------------------------------

    async def record_turns(
        self,
        session_id: str,
        records: Sequence[TurnRecord],
        log_size: int,
        *,
        whole: bool = False,
    ) -> None:
        """Apply turn changes in their log's order; the log is ``log_size`` bytes with them.

        ``whole``: the records are the whole log, so the session's turns are made anew.
        """
        async with self.transaction() as db:
            if whole:
                await db.execute("DELETE FROM turns WHERE session_id = ?", (session_id,))
            for rec in records:
                await _apply_turn(db, session_id, rec)
            await db.execute(
                "UPDATE sessions SET turns_size = ? WHERE session_id = ?", (log_size, session_id)
            )

    async def prompt_stored(self, session_id: str, turn_id: str) -> None:
        """The turn's prompt reached the transcript: never take the turn for one that died
        inside ``beginTurn``, even once its prompt is deleted.

        Not synced: a change that removes the prompt later marks its session dirty with a
        synced commit (:meth:`mark_dirty`), which makes this one durable too.
        """
        async with self.transaction() as db:
            await db.execute(
                "UPDATE turns SET prompt_id = NULL WHERE session_id = ? AND turn_id = ?",
                (session_id, turn_id),
            )

    async def running_turns(self) -> list[tuple[str, str, str | None]]:
        """``(session, turn, prompt id)`` of every running turn (the prompt's id until it is
        stored: see :meth:`prompt_stored`)."""
        rows = await self._fetch(
            "SELECT session_id, turn_id, prompt_id FROM turns WHERE status = 'running'"
            " ORDER BY session_id, turn_id"
        )
        return [(str(a), str(b), c) for a, b, c in rows]

    async def create_session(self, row: SessionRow, meta: MetaRow | None = None) -> None:
        """Insert a new session (with its title and ``meta`` as its ``meta.json`` holds
        them, in the same transaction)."""
        async with self.transaction() as db:
            await db.execute(
                f"INSERT INTO sessions ({_SESSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                dataclasses.astuple(row),
            )
            if meta is not None:
                await db.execute(_SET_META, meta)

    async def delete_session(self, cache: RowCache) -> None:
        """Remove a session and all its rows and turns."""
        async with self._rows_transaction(cache) as db:
            for table in ("messages", "turns", "sessions"):
                await db.execute(f"DELETE FROM {table} WHERE session_id = ?", (cache.session_id,))

    async def update_line(
        self, cache: RowCache, row: Row, delta: int, stamp: FileStamp, line_count: int, now: str
    ) -> None:
        """Record one rewritten line; the lines after it move by ``delta`` bytes."""
        session_id = cache.session_id
        async with self._rows_transaction(cache) as db:
            if delta:
                await db.execute(
                    "UPDATE messages SET offset = offset + ? WHERE session_id = ? AND line > ?",
                    (delta, session_id, row.line),
                )
            await db.execute(
                "UPDATE messages SET message_id = ?, offset = ?, length = ?, role = ?,"
                " turn_id = ?, status = ?, pager = ? WHERE session_id = ? AND line = ?",
                (*row[1:], session_id, row.line),
            )
            await _set_file(db, session_id, stamp, line_count, now)

    async def replace_rows(
        self,
        cache: RowCache,
        rows: Iterable[Row],
        stamp: FileStamp,
        line_count: int,
        now: str,
        keep_from: int = 0,
    ) -> None:
        """Replace the session's rows from line ``keep_from`` on (all of them by default)."""
        session_id = cache.session_id
        async with self._rows_transaction(cache) as db:
            await db.execute(
                "DELETE FROM messages WHERE session_id = ? AND line >= ?", (session_id, keep_from)
            )
            await db.executemany(
                "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(session_id, *r) for r in rows],
            )
            await _set_file(db, session_id, stamp, line_count, now)


async def _apply_turn(db: aiosqlite.Connection, session_id: str, rec: TurnRecord) -> None:
    """Apply one turn change to the turn table (replayed from the log in its order)."""
    if rec.status == "running":
        await db.execute(
            "INSERT OR IGNORE INTO turns VALUES (?, ?, 'running', ?, NULL, ?)",
            (session_id, rec.turn_id, rec.at, rec.prompt_id),
        )
    elif rec.status == "void":
        await db.execute(
            "DELETE FROM turns WHERE session_id = ? AND turn_id = ?", (session_id, rec.turn_id)
        )
    else:
        await db.execute(
            "UPDATE turns SET status = ?, ended_at = ? WHERE session_id = ? AND turn_id = ?",
            (rec.status, rec.at, session_id, rec.turn_id),
        )


_LOOKUP = "SELECT message_id, line FROM messages WHERE session_id = ? AND message_id IN (%s)"
_KNOWN = "SELECT message_id, line FROM messages WHERE session_id = ? LIMIT ?"
_SET_FILE = (
    "UPDATE sessions SET line_count = ?, byte_size = ?, file_ino = ?, file_mtime_ns = ?,"
    " updated_at = ? WHERE session_id = ?"
)
_SET_FILE_CLEAN = _SET_FILE.replace(" WHERE", ", dirty = 0 WHERE")
"""As :data:`_SET_FILE`, for a change the rows now describe whole: no longer dirty."""


def _file_params(q: _Queued, now: str = "") -> tuple[Any, ...]:
    stamp = q.stamp
    return (q.line_count, stamp.size, stamp.ino, stamp.mtime_ns, q.now or now, q.cache.session_id)


async def _set_file(
    db: aiosqlite.Connection, session_id: str, stamp: FileStamp, line_count: int, now: str
) -> None:
    """Record the file as the rows now describe it, whatever changed it: no longer dirty."""
    params = (line_count, stamp.size, stamp.ino, stamp.mtime_ns, now, session_id)
    await db.execute(_SET_FILE_CLEAN, params)
