"""The index's tables for finding and organising sessions (issue 35): one migration.

Kept apart from :mod:`host._search` so that :mod:`host._index` lists it without importing
the code that uses the index.

- ``sessions.meta`` (the app's object, as ``meta.json`` holds it), ``pinned`` (1 when
  ``meta.pinned`` is ``true``), ``meta_dirty`` (the title and ``meta`` may not be
  ``meta.json``'s: set, synced, before an update writes the file; the start reads the
  file again; a row made from the files takes both in its own transaction). The
  list's keyset indexes (all, pinned, unpinned: a ``pinnedFirst`` page walks only the
  rows of its phase).
- ``search_text`` and ``search_tools``: FTS5, contentless (the transcripts hold the text:
  no second copy), words by ``unicode61``, a prefix index of 3 characters (``the*`` is one
  lookup, not a merge of every word it starts); a CJK run is indexed as its characters and
  its pairs of characters (``host._search.fts_text``). ``detail=full``: bm25 needs each
  term's count in a document, which ``detail=none`` and ``column`` do not keep (it scores
  0 under both).
  One row per *document*: the text of a message, or of its tool results.
  ``search_archive``: the same for the lines of archived revisions (``scope: "all"``).
- ``search_docs``: what each document is (an archived one: its root, revision, payload
  file, line, and the line's offset and length in the payload); a doc id is never reused
  (AUTOINCREMENT): a changed or deleted message's document row goes, its words stay in the
  contentless table as dead entries that no search shows, until the search index is
  rebuilt.
  ``search_stats``: how many documents are live and how many went (kept with every change
  of ``search_docs``), so the host rebuilds the search index once dead entries outnumber
  live ones.
- ``search_queue``: messages whose documents must be (re)made, filled by triggers on
  ``messages`` in the rows' own transaction (a session's row removed takes its documents,
  archived ones too, in its transaction), so a power cut takes rows and queue back
  together; an index from before this migration queues every message (a background build).
"""

from __future__ import annotations

FTS = "content='', prefix='3', tokenize='unicode61 remove_diacritics 2'"
FTS_TABLES = ("search_text", "search_tools", "search_archive")


def compacting(name: str) -> bool:
    """Whether ``name`` is one of the tables a compaction makes beside a full-text table
    (``<table>_next`` and FTS5's own of it). It commits them batch by batch, so a kill
    leaves them: work in progress that the indexer drops when it starts, not another
    schema (which set the whole index aside)."""
    return any(name == f"{t}_next" or name.startswith(f"{t}_next_") for t in FTS_TABLES)


MIGRATION = (
    "0003-search-meta",
    f"""
    ALTER TABLE sessions ADD COLUMN meta TEXT;
    ALTER TABLE sessions ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN meta_dirty INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX sessions_by_updated ON sessions (updated_at, session_id);
    CREATE INDEX sessions_by_created ON sessions (created_at, session_id);
    CREATE INDEX sessions_pinned_updated ON sessions (updated_at, session_id) WHERE pinned = 1;
    CREATE INDEX sessions_pinned_created ON sessions (created_at, session_id) WHERE pinned = 1;
    CREATE INDEX sessions_unpinned_updated ON sessions (updated_at, session_id) WHERE pinned = 0;
    CREATE INDEX sessions_unpinned_created ON sessions (created_at, session_id) WHERE pinned = 0;
    CREATE VIRTUAL TABLE search_text USING fts5(text, {FTS});
    CREATE VIRTUAL TABLE search_tools USING fts5(text, {FTS});
    CREATE VIRTUAL TABLE search_archive USING fts5(text, {FTS});
    CREATE TABLE search_docs (
        doc INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        tools INTEGER NOT NULL,
        digest INTEGER NOT NULL,
        root_id TEXT,
        revision INTEGER,
        file TEXT,
        line INTEGER,
        offset INTEGER,
        length INTEGER
    );
    CREATE INDEX search_docs_by_message ON search_docs (session_id, message_id);
    CREATE TABLE search_queue (
        seq INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL
    );
    CREATE INDEX search_queue_by_message ON search_queue (session_id, message_id);
    CREATE TRIGGER search_row_added AFTER INSERT ON messages BEGIN
        INSERT INTO search_queue (session_id, message_id) VALUES (NEW.session_id, NEW.message_id);
    END;
    CREATE TRIGGER search_row_removed AFTER DELETE ON messages BEGIN
        INSERT INTO search_queue (session_id, message_id) VALUES (OLD.session_id, OLD.message_id);
    END;
    CREATE TRIGGER search_row_changed AFTER UPDATE OF message_id, length ON messages BEGIN
        INSERT INTO search_queue (session_id, message_id) VALUES (OLD.session_id, OLD.message_id);
        INSERT INTO search_queue (session_id, message_id) VALUES (NEW.session_id, NEW.message_id);
    END;
    CREATE TABLE search_stats (live INTEGER NOT NULL, dead INTEGER NOT NULL);
    INSERT INTO search_stats VALUES (0, 0);
    CREATE TRIGGER search_session_removed AFTER DELETE ON sessions BEGIN
        UPDATE search_stats SET live = live - n, dead = dead + n FROM (SELECT count(*) AS n
            FROM search_docs WHERE session_id = OLD.session_id);
        DELETE FROM search_docs WHERE session_id = OLD.session_id;
    END;
    INSERT INTO search_queue (session_id, message_id)
        SELECT session_id, message_id FROM messages ORDER BY session_id, line;
    """,
)
"""Appended to ``host._index.MIGRATIONS``."""
