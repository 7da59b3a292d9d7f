"""The registry of sessions: every :class:`~host._session.Session` the host holds, and
what spans sessions (create, list, delete, start, the open-transcript bound).

It is the only place that keys anything by session id: each session's state lives on its
:class:`Session`, and a delete drops that object whole. It also owns the services the
sessions share (the index, the file system seam, the archive, the turn log) and the
policy of where durable writes run.

A session whose file no longer matches what the index recorded (inode, size, mtime) is
reconciled before it is served: at start, and after any write that failed half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from msgspec import Raw

from host._archive import Archive
from host._checkpoints import Checkpoints
from host._errors import NotFound
from host._fs import FileSystem, on_thread
from host._index import Index, MetaRow, Row, RowCache, SessionRow, now_iso
from host._intents import Intents, OlderIntent
from host._layout import Layout, UnsafeFolder
from host._limits import OPEN_TRANSCRIPTS
from host._locks import LockTable
from host._meta import MetaFile, encode
from host._recovery import reconcile, reconcile_turns
from host._session import BIG_WRITE, Session, timed
from host._transcript import FileStamp, Transcript
from host._turnlog import TurnLog, TurnRecord, TurnStatus
from host._watch import WatchHub

log = logging.getLogger("host.store")
RATE = 256 << 20
"""Bytes a second a fast disk takes in: what a durable write's bytes are excused of its
time before it counts for :class:`FsyncPolicy` (a 1 MB replace's 2 ms is its bytes)."""
T = TypeVar("T")
ROOM_WAIT = 30.0
"""Seconds a call waits for an open transcript to close before it opens one more."""


class FsyncPolicy:
    """Where durable writes run: on the loop while fsyncs are fast, else on a thread.

    A hop to a thread and back costs two wake-ups, the worker's and then the loop's; on a
    virtual machine that is 0.1 to 0.2 ms, as much as a fast fsync. An fsync on the loop
    holds up every other request while it runs (those that arrive meanwhile form the next
    group), so fsyncs stay on the loop only while their moving average is under
    :attr:`SLOW`: a slow disk moves them to a thread, where the loop serves other sessions.
    """

    SLOW = 0.002

    def __init__(self) -> None:
        self.average = 0.0

    @property
    def inline(self) -> bool:
        return self.average < self.SLOW

    def note(self, seconds: float) -> None:
        """Count a durable write whose latency (its time less its bytes') was ``seconds``."""
        self.average += (seconds - self.average) / 8


@dataclass(frozen=True, slots=True)
class Fork:
    """What ``session.fork`` makes a new session of: its source's first lines, byte for
    byte (``end`` bytes, their ``rows``), and the new session's ``meta``."""

    source: Session
    end: int
    rows: list[Row]
    meta: dict[str, Raw]


class Registry:
    """Every session the host holds, and the services they share."""

    def __init__(
        self,
        layout: Layout,
        index: Index,
        fs: FileSystem | None = None,
        *,
        open_transcripts: int = OPEN_TRANSCRIPTS,
    ) -> None:
        self.layout = layout
        self.index = index
        self.fs = fs or FileSystem()
        self.locks = LockTable()
        self.archive = Archive(layout, self.fs)
        self.checkpoints = Checkpoints(layout, self.fs)
        self.intents = Intents(layout, self.fs, self.archive)
        self.turnlog = TurnLog(layout, self.fs)
        self.sessions: dict[str, Session] = {}
        """Every session there is (a transcript the index knows), by id."""
        self._open: dict[str, Session] = {}  # those with an open transcript, least recent first
        self.open_transcripts = open_transcripts
        """How many transcripts are open at most: to open another, the least recently
        used idle one is closed, or the call waits for one to be idle (each holds a
        descriptor: 10,000 sessions must fit in ``ulimit -n 256``)."""
        self._opening = 0  # transcripts being opened (their room is taken)
        self._room: deque[asyncio.Future[None]] = deque()  # calls waiting to open one
        self.locks.on_free = self._free
        self.fsyncs = FsyncPolicy()
        self.counters: dict[str, int] = {}
        self.watch = WatchHub(self)
        """Its sessions' watchers, told by each session of its changes."""

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to a ``host.stats`` counter."""
        self.counters[name] = self.counters.get(name, 0) + n

    def cache_of(self, session_id: str) -> RowCache:
        """The rows' cache of a session (a new one for a session not registered yet)."""
        s = self.sessions.get(session_id)
        return s.cache if s is not None else RowCache(session_id)

    # -- start ----------------------------------------------------------------------

    async def register_all(self) -> None:
        """Hold a :class:`Session` for every session the index knows (start, after
        recovery), with what its checkpoint file says."""
        for row in await self.index.sessions():
            sid = row.session_id
            self.sessions[sid] = Session(sid, self)
            # a change recorded and not made at start (OlderIntent): made before it is served
            self.sessions[sid].unfinished = self.intents.recorded(sid)
        for sid in self.layout.sidecar_ids(".inflight.json"):
            if (s := self.sessions.get(sid)) is not None:
                s.has_checkpoint = True
        if n := len(self.with_checkpoints()):
            log.info("%d checkpoint(s) wait for session.recoverInflightMessages", n)

    def finish_recorded(self) -> list[str]:
        """Make the changes a dead host recorded (start, before reconciliation); return
        their sessions, which are rescanned whole (blocking)."""
        done = []
        for sid in self.intents.pending():
            try:
                made = self.intents.finish_left(sid)
            except OlderIntent as exc:
                log.error("session %s: %s", sid, exc)
                continue
            if made:
                self.count("recovery.intents_finished")
                done.append(sid)
        return done

    async def settle_turns(self) -> None:
        """End running turns ``aborted``; leave every checkpoint to the connect sequence.

        Departure from PROTOCOL.md's "Host start" (see docs/protocol.md): promoting a
        running turn's leftover here would pre-empt a finished row still in the outbox,
        which would then be deduplicated away. Like ADR 0153's amendment for completed
        turns, the finished row must get its chance first: leftovers are settled by
        ``recoverInflightMessages`` after the drain (or by the next ``beginTurn`` or
        ``truncateFrom`` of that session, which come after it too).
        """
        index = self.index
        for sid, tid, prompt_id in await index.running_turns():
            if prompt_id is not None and await index.lookup(sid, prompt_id) is None:
                # Logged, but its prompt never reached the transcript: the host died
                # inside beginTurn, which then never happened.
                await self.record_turn(sid, tid, "void")
                log.warning("session %s: turn %s died inside beginTurn: forgotten", sid, tid)
                continue
            await self.record_turn(sid, tid, "aborted")
            log.warning("session %s: turn %s was running at start: now aborted", sid, tid)
            self.count("recovery.turns_aborted")

    def sweep_archives(self) -> None:
        """Drop archives of deleted sessions and payloads no manifest names (blocking)."""
        root = self.layout.revisions_root
        on_disk = set(self.layout.transcript_ids())
        for sid in os.listdir(root):
            if os.path.islink(path := os.path.join(root, sid)):
                log.warning("%s is a symlink, not a session's archive: left alone", path)
            elif sid not in on_disk:
                shutil.rmtree(path, ignore_errors=True)
            elif n := self.archive.sweep(sid):
                log.info("session %s: %d unreferenced revision payload(s) removed", sid, n)

    def remove_leftovers(self) -> None:
        """Remove the files of sessions whose transcript is gone (start-up, before serving).

        Not fsynced: what a power cut brings back is removed again at the next start.
        """
        for sid, path in self.layout.leftovers():
            self.fs.unlink(path)
            log.warning("session %s: %s removed: its transcript is gone", sid, path)

    # -- sessions -------------------------------------------------------------------

    async def case_twin(self, sid: str) -> str | None:
        """A session whose id differs from ``sid`` only in case (one listing of the folder)."""
        return await on_thread(self.layout.case_twin, sid)

    async def drop_checkpoint(self, sid: str) -> None:
        """Remove the checkpoint of a session whose transcript is gone."""
        await on_thread(self.checkpoints.remove, sid)
        if (s := self.sessions.get(sid)) is not None:
            s.has_checkpoint, s.checkpoint_of = False, None

    def hold(self, sid: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold a session for work of the host's own, queued behind every call admitted."""
        return self.locks.hold(sid)

    def with_checkpoints(self) -> list[str]:
        """The sessions whose checkpoint file may be there, in order."""
        return sorted(sid for sid, s in self.sessions.items() if s.has_checkpoint)

    async def create(self, sid: str, title: str | None, fork: Fork | None = None) -> bool:
        """Create a session durably; ``False`` when there is one (a retry, or a transcript
        copied in while the host runs: the file is the truth, indexed as start would).

        Its files are made first, its transcript last: the commit (a new empty file, or
        ``fork``'s copy of its source's first lines renamed into place). A start removes
        the files of a session without a transcript, so a cut leaves none or all of it.
        """
        if sid in self.sessions:
            return False
        layout, fs = self.layout, self.fs
        if await self.index.session(sid) is not None:  # its delete's rows left behind
            await self.index.delete_session(RowCache(sid))
        if os.path.exists(layout.transcript(sid)):
            await reconcile(self, sid, full=True)
            self.sessions[sid] = Session(sid, self)
            return False
        now, meta = now_iso(), None if fork is None else fork.meta
        meta_file = encode(MetaFile(title, now, meta))

        def transcript() -> None:
            if fork is None:
                Transcript.create(fs, layout.transcript(sid)).close()
                return
            tmp = os.path.join(layout.sessions, fork.source.file.prepare([(0, fork.end)]))
            fs.rename(tmp, layout.transcript(sid))  # a copy left by a failure: the start's sweep
            fs.fsync_dir(layout.sessions)

        def make_files() -> FileStamp:
            try:
                fs.unlink(layout.intent(sid))  # a deleted session's (its removal failed)
                self.watch.forget(sid)  # a gone session's epoch: no old cursor holds
                fs.write_atomic(layout.meta(sid), meta_file)
                self.turnlog.create(sid)  # its name made durable with the transcript's
                transcript()  # the commit
            except BaseException:
                self.remove_files(sid)  # before the commit: nothing was made
                raise
            return FileStamp.of(os.lstat(layout.transcript(sid)))

        st = await on_thread(make_files)
        s = self.sessions[sid] = Session(sid, self)
        try:
            if fork is None:
                row = SessionRow(sid, title, now, now, 0, 0, st.ino, st.mtime_ns)
                await self.index.create_session(row)
            else:  # no stamp until its rows are in: a cut between, and a start rescans it
                row = SessionRow(sid, title, now, now, 0, 0, 0, 0)
                await self.index.create_session(row, MetaRow.of(sid, title, meta))
                await self.index.replace_rows(s.cache, fork.rows, st, len(fork.rows), now)
        except Exception as exc:  # made: indexed from its files before it is served
            log.error("session %s: created, its index row not: %s", sid, exc)
            s.lags()
        return True

    async def delete(self, sid: str) -> None:
        """Delete a session: its transcript renamed aside durably (the commit), then its
        :class:`Session` dropped whole, its rows and files removed."""
        s = self.sessions.get(sid)
        if s is None:
            raise NotFound("session", sid)
        self.forget(s)
        await self.watch.before_change(sid)  # its epoch ends first
        await self.index.mark_dirty(sid)  # a same-id session may follow its rows
        await on_thread(self._bury, sid)
        del self.sessions[sid]
        self.index.caught_up(s.cache)  # gone: nothing of it is rebuilt
        self.watch.deleted(s)
        try:
            await self.index.delete_session(s.cache)
        except Exception as exc:  # deleted all the same: its rows go at the next start
            log.warning("session %s: deleted; its index rows go at the next start: %s", sid, exc)
        try:
            await on_thread(self.remove_files, sid)
        except OSError as exc:  # deleted all the same: the rest goes at the next start
            log.warning("session %s: deleted; its files go at the next start: %s", sid, exc)

    def _bury(self, session_id: str) -> None:
        """Rename the session's transcript aside, durably: the commit of its delete.

        A session is its transcript. When the folder's fsync fails (before the commit is
        durable), the name is put back.
        """
        transcript, buried = self.layout.transcript(session_id), self.layout.buried(session_id)
        self.fs.rename(transcript, buried)
        try:
            self.fs.fsync_dir(self.layout.sessions)
        except BaseException:
            self.fs.rename(buried, transcript)
            raise

    def remove_files(self, session_id: str) -> None:
        """Remove every file of a session, transcript first; not fsynced.

        After a delete's commit this is tidying: what a crash or a power cut leaves of a
        buried session goes at the next start (:meth:`remove_leftovers`), never to be read
        as a new session's of the same id.
        """
        for path in [*self.layout.session_files(session_id), self.layout.quarantine(session_id)]:
            self.fs.unlink(path)
        try:  # rmtree follows no link inside, but would go through a linked folder above
            folder = self.layout.checked(self.layout.revisions(session_id))
        except UnsafeFolder as exc:
            log.warning("session %s: its archive is left alone: %s", session_id, exc)
            return
        shutil.rmtree(folder, ignore_errors=True)

    async def open(self, session_id: str) -> Session:
        """Return the session, opened (call while holding it), or raise ``NotFound``."""
        s = self.sessions.get(session_id)
        if s is None:
            raise NotFound("session", session_id)
        if self.index.stale:
            await self.index.settle()  # every queued row of this session is through
        if s.unfinished:
            self.forget(s)
            await on_thread(self.intents.finish_left, session_id)
            s.unfinished = False
            s.lags()
        # Its index lags its file (a failed batch or change, a created session's row):
        # rebuilt whatever the stamps say; marked until the rebuild is through.
        lags = s.cache.stale
        if lags:
            self.forget(s)
        if s.transcript is not None:
            self._open[session_id] = self._open.pop(session_id)  # the most recently used now
            return s
        row = await self.index.session(session_id)
        if row is None and not lags:
            raise NotFound("session", session_id)
        await self._make_room()
        self._opening += 1
        try:
            transcript = Transcript(self.fs, self.layout.transcript(session_id))
        except FileNotFoundError:
            raise NotFound("session", session_id) from None
        finally:
            self._opening -= 1
        if lags or row is None or not row.matches(transcript.stamp()):
            # Changed behind the index's back (a write that failed half-way): the file is
            # the truth, so index it again, and reopen it (a quarantine replaces it).
            transcript.close()
            await reconcile(self, session_id, full=lags)
            if lags:
                await reconcile_turns(self, session_id, row)
                self.index.caught_up(s.cache)
            row = await self.index.session(session_id)
            assert row is not None
            await self._make_room()
            transcript = Transcript(self.fs, self.layout.transcript(session_id))
        s.transcript, s.line_count, s.size = transcript, row.line_count, row.byte_size
        self._open[session_id] = s
        return s

    async def _make_room(self) -> None:
        """Return once a transcript may be opened within :attr:`open_transcripts`.

        The least recently used idle session's is closed for it: only a session no call
        holds, since a call keeps its session open from its first read to its last
        write; a call only queued for it opens it again when its turn comes. When every
        open one is held, wait (in turn) until one is let go: a call holding a session
        never waits for anything but the disk and the index, so one soon is. Bounded, and
        said so: past :data:`ROOM_WAIT` the transcript is opened anyway.
        """
        while len(self._open) + self._opening >= self.open_transcripts:
            victim = next((s for sid, s in self._open.items() if not self.locks.held(sid)), None)
            if victim is not None:  # least recently used first: most often the very first
                self.forget(victim)
                self.count("transcripts.closed")
                continue
            turn = asyncio.get_running_loop().create_future()
            self._room.append(turn)
            try:
                async with asyncio.timeout(ROOM_WAIT):
                    await turn
            except TimeoutError:
                log.warning(
                    "%d transcripts open and busy for %.0f s: opening one more",
                    len(self._open),
                    ROOM_WAIT,
                )
                return
            finally:
                if turn in self._room:
                    self._room.remove(turn)

    def _free(self, session_id: str) -> None:
        """A session's holder left: a call waiting for room may close it now."""
        if session_id in self._open:
            self._next_room()
        self.watch.released(session_id)  # a rewrite's reset goes out now

    def _next_room(self) -> None:
        while self._room:
            turn = self._room.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    @property
    def open_count(self) -> int:
        """How many transcripts are open."""
        return len(self._open)

    def forget(self, s: Session) -> None:
        """Close a session's file; it is reopened (and reconciled if need be) on next use."""
        if self._open.pop(s.id, None) is not None and s.transcript is not None:
            s.transcript.close()
            s.transcript = None
            self._next_room()

    def close(self) -> None:
        """Close every open transcript."""
        for s in list(self._open.values()):
            self.forget(s)

    # -- writes ---------------------------------------------------------------------

    async def durably(self, size: int, write: Callable[..., T], *args: Any) -> T:
        """Run a durable write of ``size`` bytes: on the loop up to :data:`BIG_WRITE` while
        fsyncs are fast (:class:`FsyncPolicy`), else on a thread.

        Every one is timed for the policy, where it runs, less what its bytes take at
        :data:`RATE`: what is left is the disk's latency (a 1 MB checkpoint takes 2 ms on a
        disk whose fsync takes 0.2, and counted whole it sent every write to a thread). So
        a disk that turns slow while a reply sends only big snapshots is still learned, and
        so is one fast again.
        """
        if self.fsyncs.inline and size <= BIG_WRITE:
            done, took = timed(write, *args)
        else:  # timed on the thread: a busy loop's delay in taking it back is not the disk's
            done, took = await on_thread(timed, write, *args)
        self.fsyncs.note(max(0.0, took - size / RATE))
        return done

    async def record_turn(
        self, session_id: str, turn_id: str, status: TurnStatus, prompt_id: str | None = None
    ) -> None:
        """Log a turn change durably (the answer's fsync: its commit), then apply it to the
        index. An index that refuses it lags: the session's turns are replayed from its log
        before it is served again (the log is the truth, the table derived)."""
        rec = TurnRecord(turn_id, status, now_iso(), prompt_id)
        _, after = await self.durably(0, self.turnlog.append, session_id, rec)
        self.watch.turn(session_id, rec, after)
        try:
            await self.index.record_turns(session_id, [rec], after)
        except Exception as exc:
            if (s := self.sessions.get(session_id)) is None:
                raise  # start: the next start replays it from the log
            log.error("session %s: the index did not follow a turn change: %s", session_id, exc)
            s.lags()

    def counters_now(self) -> dict[str, int]:
        """The registry's counters for ``host.stats``."""
        return {
            **self.counters,
            "sessions.open": len(self._open),
            "locks.held": len(self.locks),
            "index.batches": self.index.batches,
            "index.lagging": self.index.stale,
            "fsyncs.onLoop": int(self.fsyncs.inline),
            "rewrites.copyFallbacks": self.fs.copy_fallbacks,
            "sidecars.setAside": self.fs.set_aside_count,
        }
