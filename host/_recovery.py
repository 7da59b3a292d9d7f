"""Reconcile transcripts (the truth) with the index, at start and on demand.

Before the first request is read, every transcript whose inode, size or mtime differs from
what the index recorded is scanned: a torn last line (no newline: never acknowledged) is
cut off, lines the index lacks are indexed, and a line that is not a valid message (or
repeats an id) is moved to ``<id>.jsonl.quarantine`` with its bytes and reported, never
silently dropped. A clean session costs one ``stat``: start is O(sessions), not O(bytes).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from typing import Protocol

from host._epochs import Epochs
from host._fs import FileSystem, NotRegularFile, on_thread
from host._index import Index, Row, RowCache, SessionRow, now_iso
from host._intents import Change, Intents
from host._layout import SPARE, Layout
from host._messages import Message, pager_json, parse_stored
from host._meta import created_at, read_meta
from host._transcript import FileStamp, Piece, Transcript, iter_lines
from host._turnlog import TurnLog


class Store(Protocol):
    """What recovery needs of the store (:class:`host._store.Registry` is one): the store
    builds on recovery, never the other way round."""

    layout: Layout
    index: Index
    fs: FileSystem
    turnlog: TurnLog
    intents: Intents
    counters: dict[str, int]

    @property
    def watch(self) -> Epochs: ...

    def count(self, name: str, n: int = 1) -> None: ...
    def cache_of(self, session_id: str) -> RowCache: ...


log = logging.getLogger("host.recovery")


@dataclass(slots=True)
class Scan:
    """What a scan of a transcript found from some offset on."""

    rows: list[Row] = field(default_factory=list)
    torn_at: int | None = None
    torn_bytes: int = 0
    bad: list[tuple[int, int, bytes, str]] = field(default_factory=list)  # line, offset, raw, why


@dataclass(slots=True)
class Report:
    """What recovery did, for the log and ``host.stats``."""

    sessions: int = 0
    reconciled: int = 0
    indexed_lines: int = 0
    torn_tails: int = 0
    quarantined_lines: int = 0
    temp_files_removed: int = 0
    dropped_index_rows: int = 0

    def as_counters(self) -> dict[str, int]:
        return {f"recovery.{f.name}": getattr(self, f.name) for f in fields(self)}


def scan(transcript: Transcript, offset: int, line: int, known_ids: set[str]) -> Scan:
    """Scan complete lines from ``offset`` (line number ``line``) to the end of the file."""
    out = Scan()
    for off, raw, complete in iter_lines(transcript.fs, transcript.fd, offset):
        if not complete:
            out.torn_at, out.torn_bytes = off, len(raw)
            break
        msg = parse_stored(raw)
        why = None
        if msg is None:
            why = "not a valid message"
        elif msg.id in known_ids:
            why = f"duplicate id {msg.id!r}"
        if why is not None:
            out.bad.append((line + len(out.rows) + len(out.bad), off, raw, why))
            continue
        assert msg is not None
        known_ids.add(msg.id)
        out.rows.append(stored_row(line + len(out.rows), off, raw, msg))
    return out


def stored_row(line: int, offset: int, raw: bytes, msg: Message) -> Row:
    """The index row of a line kept as its bytes ``raw`` (``msg`` parsed from them)."""
    return Row(
        line,
        msg.id,
        offset,
        len(raw),
        msg.head.role,
        msg.turn_id,
        msg.head.status,
        pager_json(msg.pager()),
    )


def quarantine(store: Store, session_id: str, bad: list[tuple[int, int, bytes, str]]) -> None:
    """Append bad bytes, with where they were and why, to the session's quarantine file."""
    fs = store.fs
    path = store.layout.quarantine(session_id)
    fd = fs.open_own(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # a link set aside itself
    try:
        for line, off, raw, why in bad:
            rec = {
                "sessionId": session_id,
                "line": line,
                "offset": off,
                "reason": why,
                "rawBase64": base64.b64encode(raw).decode(),
            }
            fs.write_all(fd, json.dumps(rec).encode() + b"\n")
            log.warning(
                "session %s: line %d at byte %d quarantined (%s) in %s",
                session_id,
                line,
                off,
                why,
                path,
            )
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.fsync_dir(store.layout.sessions)


def _tail_only(store: Store, session_id: str, hint: SessionRow) -> bool:
    """Whether scanning what lies past the indexed bytes is enough.

    Only when the rows are known to describe every byte they cover: no change but an
    append can have reached the file since they were committed (the session is not
    dirty: see ``Index.mark_dirty``). The file must also have grown, on the same inode,
    with a newline where the rows end; those alone prove nothing (a power cut can take
    back several commits, ext4 reuses a freed inode at once, lines can be of one width),
    but anything else is a change the rows cannot describe.
    """
    if hint.dirty:
        return False
    t = Transcript(store.fs, store.layout.transcript(session_id))
    try:
        st = t.stamp()
        return (
            hint.file_ino == st.ino
            and 0 < hint.byte_size < st.size
            and t.read(hint.byte_size - 1, 1) == b"\n"
        )
    finally:
        t.close()


def _repair_file(
    store: Store, session_id: str, hint: SessionRow | None, tail: bool
) -> tuple[Scan, int, FileStamp]:
    """Scan and mend one transcript in place; return the scan, its first line and the stamp.

    ``tail``: scan only past the indexed bytes (see :func:`_tail_only`).
    """
    t = Transcript(store.fs, store.layout.transcript(session_id))
    try:
        st = t.stamp()
        start_off, start_line = 0, 0
        if tail and hint is not None:
            start_off, start_line = hint.byte_size, hint.line_count
        known: set[str] = set()
        result = scan(t, start_off, start_line, known)
        result_start = start_line
        if result.torn_at is not None:
            log.warning(
                "session %s: torn last line cut (%d bytes at byte %d) and quarantined",
                session_id,
                result.torn_bytes,
                result.torn_at,
            )
            torn = t.read(result.torn_at, result.torn_bytes)
            quarantine(store, session_id, [(-1, result.torn_at, torn, "torn last line")])
            t.cut(result.torn_at)
        if result.bad:
            store.watch.forget(session_id)  # lines move, so its epoch ends
            quarantine(store, session_id, result.bad)
            # Rewrite without the bad lines; good rows get their new offsets.
            pieces: list[Piece] = [(0, start_off)]
            pos = start_off
            rows = []
            for r in result.rows:
                pieces.append((r.offset, r.length + 1))
                rows.append(r._replace(offset=pos))
                pos += r.length + 1
            store.intents.commit(Change(session_id, transcript=t.prepare(pieces)))
            t.reopen()
            result.rows = rows
        if hint is not None and start_line == 0 and len(result.rows) < hint.line_count:
            # Marked dirty: a change (a cut, a rewrite) was made and its index not yet
            # told, so fewer lines are its result. Unmarked, lines the index had are lost.
            log.log(
                logging.INFO if hint.dirty else logging.ERROR,
                "session %s: %d indexed line(s) are missing from the transcript (it is"
                " shorter than the index recorded: %d bytes, not %d)%s",
                session_id,
                hint.line_count - len(result.rows),
                st.size,
                hint.byte_size,
                ": a change its index had not followed" if hint.dirty else "; kept what is there",
            )
        return result, result_start, t.stamp()
    finally:
        t.close()


async def reconcile(
    store: Store, session_id: str, *, full: bool = False, report: Report | None = None
) -> None:
    """Bring one session's index rows in line with its transcript."""
    hint = await store.index.session(session_id)
    tail = False
    if hint is not None and not full:
        tail = await on_thread(_tail_only, store, session_id, hint)
    if hint is not None and not tail and not hint.dirty:  # a mark read back is synced
        # A whole scan may rewrite the file (a bad line quarantined): its rows can then be
        # trusted only once the commit after it is; until then the mark says rescan.
        await store.index.mark_dirty(session_id)
    result, start_line, stamp = await on_thread(_repair_file, store, session_id, hint, tail)
    if start_line > 0:
        # A tail scan knows only the tail's ids: a line repeating an older id is bad too.
        dupes = [r for r in result.rows if await store.index.lookup(session_id, r.message_id)]
        if dupes:
            await reconcile(store, session_id, full=True, report=report)
            return
    if hint is None:  # its title and meta from its meta file, as a rebuilt index has them
        _, meta = await on_thread(read_meta, store.layout.meta(session_id))
        created = created_at(meta)
        row = SessionRow(session_id, meta.title, created, created, 0, 0, 0, 0)
        await store.index.create_session(row, meta.row(session_id))
    await store.index.replace_rows(
        store.cache_of(session_id),
        result.rows,
        stamp,
        start_line + len(result.rows),
        now_iso(stamp.mtime_ns / 1e9),
        keep_from=start_line,
    )
    log.info(
        "session %s reconciled: %d line(s) indexed from line %d%s%s",
        session_id,
        len(result.rows),
        start_line,
        ", torn tail cut" if result.torn_at is not None else "",
        f", {len(result.bad)} line(s) quarantined" if result.bad else "",
    )
    if report is not None:
        report.reconciled += 1
        report.indexed_lines += len(result.rows)
        report.torn_tails += result.torn_at is not None
        report.quarantined_lines += len(result.bad)
    if report is None:  # at start the report's totals are added to the counters once
        store.count("recovery.quarantined_lines", len(result.bad))


def remove_temp_files(store: Store) -> int:
    """Remove every leftover ``*.tmp`` under the sessions and revisions folders.

    Checkpoint spares go too: a start cannot know that the last swap reached the disk, so
    the spare's file may be what the disk still calls the checkpoint, never to be
    overwritten in place; and one a crash left without a checkpoint would stay forever.
    """
    n = 0
    for folder in (store.layout.sessions, store.layout.revisions_root):
        for dirpath, _dirs, files in os.walk(folder):
            for name in files:
                if name.endswith((".tmp", SPARE)):
                    store.fs.unlink(os.path.join(dirpath, name))
                    log.info("removed stale temp file %s", os.path.join(dirpath, name))
                    n += 1
    return n


async def reconcile_turns(store: Store, session_id: str, row: SessionRow | None) -> None:
    """Bring the session's turn table in line with its turn log (the truth).

    The log is only appended to, so what the index holds of it is its first
    ``turns_size`` bytes: only what lies past them is replayed (a power cut took back
    the commits that held it), unless the log is not the one the index saw.
    """
    held = row.turns_size if row is not None else 0
    try:
        size = store.turnlog.size(session_id)  # one lstat, like the transcript's: no thread hop
        if size == held and row is not None:
            return
        whole = size < held or row is None
        records, end = await on_thread(store.turnlog.read, session_id, 0 if whole else held)
    except NotRegularFile:
        # A link, FIFO or folder (issue 36: it stopped every start). Set aside; the turns the
        # index holds are kept (nothing else has them now), and the next change starts a log.
        store.turnlog.set_aside(session_id)
        await store.index.record_turns(session_id, [], 0)
        return
    await store.index.record_turns(session_id, records, end, whole=whole)
    log.info("session %s: %d turn change(s) replayed from its log", session_id, len(records))


async def reload_meta(store: Store) -> None:
    """Read ``meta.json`` again for every session whose row is marked ``meta_dirty`` (an
    update cut short between its mark and its row)."""
    marked = await store.index.meta_marked()
    layout = store.layout
    rows = await on_thread(lambda: [read_meta(layout.meta(sid))[1].row(sid) for sid in marked])
    await store.index.set_meta(rows)


async def recover(store: Store, *, full: bool = False, rescan: Collection[str] = ()) -> Report:
    """Run start-up recovery over the whole data dir.

    ``full`` rescans every transcript, ``rescan`` those of these sessions (a change
    finished at start reached their files).
    """
    report = Report()
    report.temp_files_removed = remove_temp_files(store)
    on_disk = set(store.layout.transcript_ids(report=True))
    indexed = {row.session_id: row for row in await store.index.sessions()}
    for sid in sorted(set(indexed) - on_disk):
        log.warning("session %s: index row without transcript dropped", sid)
        await store.index.delete_session(store.cache_of(sid))
        report.dropped_index_rows += 1
    report.sessions = len(on_disk)
    last = time.monotonic()
    for n, sid in enumerate(sorted(on_disk), 1):
        if time.monotonic() - last >= 1.0:  # long work says how far it is
            last = time.monotonic()
            log.info(
                "recovery: %d/%d sessions checked, %d reconciled, %d line(s) indexed",
                n - 1,
                len(on_disk),
                report.reconciled,
                report.indexed_lines,
            )
        row = indexed.get(sid)
        if full or row is None or row.dirty or sid in rescan:
            await reconcile(store, sid, full=True, report=report)
        elif not row.matches(FileStamp.of(os.stat(store.layout.transcript(sid)))):
            await reconcile(store, sid, report=report)
        await reconcile_turns(store, sid, None if full else row)
    await reload_meta(store)
    for name, value in report.as_counters().items():
        store.counters[name] = store.counters.get(name, 0) + value
    return report
