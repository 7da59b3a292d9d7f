"""``python -m host verify``: check every transcript against the index, or repair first.

Without ``--repair`` nothing is written, so it can run beside a live host (SQLite's WAL
lets a second reader in). With ``--repair`` it takes the data dir's lock like a host and
runs the very recovery a start runs (``Host.open``: leftovers, intents, reconciliation of
every transcript, turns, archives), then checks: a repaired data dir is the one the next
start would have made of it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
from typing import TextIO

from host._fs import FileSystem, on_thread
from host._index import BUSY_TIMEOUT, Index, IndexBusy, disk_trouble, index_problem
from host._layout import Layout, UnsafeDataDir
from host._recovery import scan
from host._search import check as search_check
from host._server import DataDirBusy, lock_data_dir
from host._service import Host
from host._transcript import FileStamp, Transcript

log = logging.getLogger("host.verify")


async def verify(
    data_dir: str,
    *,
    repair: bool = False,
    out: TextIO = sys.stdout,
    busy_timeout: float = BUSY_TIMEOUT,
) -> int:
    """Print every disagreement; return 0 when transcripts and index agree, else 1 (2: cannot)."""
    layout = Layout(data_dir)
    if not os.path.isdir(layout.sessions):
        print(f"no data dir at {layout.root}", file=out)
        return 1
    try:
        layout.check_no_links()
    except UnsafeDataDir as exc:
        print(f"cannot verify: {exc}", file=out)
        return 2
    try:
        problems = await (_repair if repair else _look)(layout, out, busy_timeout)
    except IndexBusy as exc:
        print(f"cannot verify: {exc}", file=out)
        return 2
    except sqlite3.Error as exc:
        if not disk_trouble(exc):
            raise
        print(f"cannot verify: the index cannot be used now ({exc})", file=out)
        return 2
    if problems:
        print(f"{problems} problem(s) found", file=out)
        return 1
    return 0


async def _look(layout: Layout, out: TextIO, busy_timeout: float) -> int:
    """Check without writing; a missing or unusable index is one problem."""
    if not os.path.exists(layout.index):
        print(f"no index at {layout.index}: run with --repair to build it", file=out)
        return 1
    if (problem := index_problem(layout.index, busy_timeout)) is not None:
        print(f"index {layout.index} is {problem}: run with --repair", file=out)
        return 1
    async with Index.open(layout.index, busy_timeout=busy_timeout) as index:
        return await _check(layout, index, FileSystem(), out)


async def _repair(layout: Layout, out: TextIO, busy_timeout: float) -> int:
    """Run a start's recovery, every transcript rescanned, under the data dir's lock; check."""
    try:
        lock = lock_data_dir(layout.root)
    except DataDirBusy as exc:
        print(f"cannot repair: {exc}", file=out)
        return 2
    try:
        async with Host.open(layout.root, busy_timeout=busy_timeout, full=True) as host:
            r, counters = host.report, host.registry.counters
            print(
                f"repaired: {r.sessions} session(s) rescanned,"
                f" {r.indexed_lines} line(s) indexed,"
                f" {r.quarantined_lines} quarantined,"
                f" {r.torn_tails} torn tail(s) cut,"
                f" {counters.get('recovery.intents_finished', 0)} unfinished change(s) finished,"
                f" {counters.get('recovery.turns_aborted', 0)} running turn(s) aborted",
                file=out,
            )
            await host.search.rebuild()  # issue 35: from the transcripts, dead words gone
            return await _check(layout, host.registry.index, host.registry.fs, out)
    finally:
        lock.close()


async def _check(layout: Layout, index: Index, fs: FileSystem, out: TextIO) -> int:
    """Print each disagreement of the transcripts and the index; return how many."""
    problems = 0
    lines = 0

    def bad(sid: str, what: str) -> None:
        nonlocal problems
        problems += 1
        print(f"{sid}: {what}", file=out)

    on_disk = layout.transcript_ids(report=True)
    rows_by_session = {r.session_id: r for r in await index.sessions()}
    for sid in sorted(set(rows_by_session) - set(on_disk)):
        bad(sid, "in the index but has no transcript")
    for n, sid in enumerate(on_disk, 1):
        if n % 500 == 0:
            log.info("verify: %d/%d sessions checked", n, len(on_disk))
        srow = rows_by_session.get(sid)
        if srow is None:
            bad(sid, "transcript is not in the index")
            continue
        t = Transcript(fs, layout.transcript(sid))
        try:
            found = scan(t, 0, 0, set())
            stamp = FileStamp.of(os.fstat(t.fd))
        finally:
            t.close()
        if found.torn_at is not None:
            bad(sid, f"torn last line at byte {found.torn_at} ({found.torn_bytes} bytes)")
        for line, off, _raw, why in found.bad:
            bad(sid, f"line {line} at byte {off}: {why}")
        indexed = await index.rows(sid)
        if indexed != found.rows:
            have = {r.line: r for r in indexed}
            for r in found.rows:
                if have.get(r.line) != r:
                    bad(sid, f"line {r.line}: transcript has {r}, index has {have.get(r.line)}")
                    break
            if len(indexed) != len(found.rows):
                bad(sid, f"{len(found.rows)} line(s) in transcript, {len(indexed)} in index")
        if srow.line_count != len(found.rows) or srow.byte_size != stamp.size:
            bad(
                sid,
                f"session row says {srow.line_count} line(s) / {srow.byte_size} bytes,"
                f" transcript has {len(found.rows)} / {stamp.size}",
            )
        lines += len(found.rows)
    print(f"checked {len(on_disk)} session(s), {lines} line(s): {problems} problem(s)", file=out)
    await index.settle()
    searched: int = await on_thread(search_check, layout, out)  # issue 35
    return problems + searched
