"""The outbox's durable journal: ``<app dir>/outbox.jsonl``.

One line per entry (``{"seq", "sessionId", "turnId", "message", "crc"}``) and one per
acknowledgement (``{"ack": seq, "crc"}``); ``crc`` is the CRC-32 of the line without it,
so a flipped byte is reported and skipped at open, never read as another entry.
``append`` refuses a row the host could never store (:mod:`outbox._rows`) and returns
once the entry is fsynced; entries that arrive while an fsync is in
flight share the next one (group commit). Acks are not fsynced: a lost ack only means
the entry is sent again, and the host deduplicates by id. Once acknowledged entries are
most of the file (and past :data:`COMPACT_BYTES`) it is rewritten with the pending ones
alone, by atomic replace. One outbox per journal: ``<journal>.lock`` is held while open.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import fcntl
import logging
import os
import re
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from outbox._files import (
    NotRegularFile,
    fsync_dir,
    open_append,
    open_regular,
    read_fd,
    write_all,
    write_new,
)
from outbox._read import read
from outbox._rows import RowRefused, refusal

log = logging.getLogger("outbox.journal")


class Entry(Struct, rename="camel", omit_defaults=True):
    """One message waiting to reach the host."""

    seq: int
    session_id: str
    message: Raw
    turn_id: str | None = None


class _Line(Struct, rename="camel", omit_defaults=True):
    seq: int | UnsetType = UNSET
    session_id: str | UnsetType = UNSET
    message: Raw | UnsetType = UNSET
    turn_id: str | None = None
    ack: int | UnsetType = UNSET


_DEC = msgspec.json.Decoder(_Line)
_ENC = msgspec.json.Encoder()
COMPACT_BYTES = 4 << 20
"""Bytes of acknowledged entries (and acks) the journal holds before it is rewritten
with its pending entries alone, once they are at least as many as the pending ones: the
file stays within twice what is pending plus this, and a rewrite copies no more than it
drops (a pending entry the host never takes does not stop it)."""


_TMP = ".tmp"  # a compaction's copy: <journal>.<8 hex digits>.tmp


class JournalBusy(Exception):
    """Raised when another outbox (another process of the app) has the journal open."""


_CRC = b',"crc":'


def _sealed(obj: bytes) -> bytes:
    """``{...}`` -> ``{...,"crc":N}\\n`` with N the CRC-32 of ``{...}``."""
    return obj[:-1] + _CRC + b"%d}\n" % zlib.crc32(obj)


def _checked(line: bytes) -> bytes:
    """The line without its CRC, or ``ValueError`` when the CRC does not match."""
    at = line.rfind(_CRC)
    if at < 0 or not line.endswith(b"}"):
        return line  # written before lines were sealed
    body = line[:at] + b"}"
    if not line[at + len(_CRC) : -1].isdigit() or zlib.crc32(body) != int(
        line[at + len(_CRC) : -1]
    ):
        raise ValueError("CRC mismatch")
    return body


class Journal:
    """Append-only, fsynced, rewritten once most of it is acknowledged."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pending: dict[int, Entry] = {}
        self.next_seq = 1
        self._fd = -1
        self._written = 0  # highest seq written to the page cache
        self._synced = 0  # highest seq known durable
        self._sync: asyncio.Future[None] | None = None  # the group's fsync in flight
        self._sizes: dict[int, int] = {}  # bytes of each pending entry's line
        self._live = 0  # ... and their sum
        self._dead = 0  # bytes of the file that are not pending entries
        self._unwritten: list[int] = []  # acks a full disk refused: written with the next
        self._retry_at = 0  # dead bytes before a compaction the disk refused is tried again
        self._lock = -1
        self._dir_synced = True  # the folder holds the journal's current name durably
        self.fsyncs = 0
        self.refused: dict[int, str] = {}  # pending entries the host could never store: why

    @classmethod
    @asynccontextmanager
    async def open(cls, path: str) -> AsyncIterator[Journal]:
        """Open (recovering) the journal at ``path``."""
        j = cls(path)
        try:
            await asyncio.to_thread(j._load)
            yield j
        finally:
            for fd in (j._fd, j._lock):
                if fd >= 0:
                    os.close(fd)

    def _sweep(self) -> None:
        """Remove the copies compactions cut by a kill left (``<journal>.<hex>.tmp``): as
        big as what was pending then; this outbox holds the lock, so none is in progress."""
        folder, name = os.path.split(self.path)
        leftover = re.compile(re.escape(name) + r"\.[0-9a-f]{8}" + re.escape(_TMP))
        for entry in os.listdir(folder or "."):
            if leftover.fullmatch(entry):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, entry))
                log.info("journal: %s, a compaction's copy a kill left, removed", entry)

    def _take_lock(self) -> None:
        """Hold ``<path>.lock`` (``flock``) while open: one outbox per journal.

        A second one would compact the file from under the first (a rename over it), whose
        later entries then go, fsynced and reported durable, into an unlinked file.
        """
        path = self.path + ".lock"
        self._lock = open_regular(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(self._lock, 32, 0).decode(errors="replace").strip() or "unknown"
            raise JournalBusy(
                f"the outbox journal {self.path} is in use by another outbox (pid {holder}):"
                " one app instance per journal"
            ) from None
        os.ftruncate(self._lock, 0)
        os.pwrite(self._lock, f"{os.getpid()}\n".encode(), 0)

    def _load(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
        self._take_lock()
        self._sweep()
        # A new journal's name is durable only once its folder is: until then a power cut
        # takes the file, and every entry reported durable in it, away (issue 37).
        self._dir_synced = os.path.lexists(self.path)
        try:  # the only copy of the rows not yet sent: refused, never moved aside
            self._fd = open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        except NotRegularFile as exc:
            raise NotRegularFile(
                exc.errno,
                "the outbox journal is not a regular file (a symlink, FIFO or folder);"
                " the outbox writes through none",
                self.path,
            ) from None
        data = read_fd(self._fd)
        pos, damaged = self._replay(data)
        if pos < len(data):  # never acknowledged to the caller: enqueue had not returned
            log.warning("journal: torn last entry (%d bytes) cut", len(data) - pos)
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
        self._dead = pos - self._live
        self._written = self._synced = self.next_seq - 1
        for e in self.pending.values():
            if (reason := refusal(e.session_id, bytes(e.message), e.turn_id)) is not None:
                self.refused[e.seq] = reason
        if damaged:
            self._quarantine(damaged)  # kept there: the rewrite below drops them here
        self._compact_if(bool(self._dead) and (bool(damaged) or self._dead >= self._live))

    def _replay(self, data: bytes) -> tuple[int, list[bytes]]:
        """Replay the entries of ``data``; return where its last whole line ends and the
        lines that could not be read."""
        pos = 0
        damaged: list[bytes] = []
        while (nl := data.find(b"\n", pos)) >= 0:
            raw, at, pos = data[pos:nl], pos, nl + 1
            try:
                raw.decode("utf-8")
                line = read(_DEC, _checked(raw))  # a half surrogate pair is the host's JSON
            except (msgspec.MsgspecError, ValueError, RecursionError):
                damaged.append(raw)
                log.error("journal: unreadable entry at byte %d skipped", at)
                continue
            if isinstance(line.ack, int):
                self.pending.pop(line.ack, None)
                self._live -= self._sizes.pop(line.ack, 0)
            elif (
                isinstance(line.seq, int)
                and isinstance(line.message, Raw)
                and isinstance(line.session_id, str)
            ):
                entry = Entry(line.seq, line.session_id, line.message, line.turn_id)
                self.pending[line.seq] = entry
                self._live += pos - at - self._sizes.get(line.seq, 0)
                self._sizes[line.seq] = pos - at
                self.next_seq = max(self.next_seq, line.seq + 1)
        return pos, damaged

    def _quarantine(self, damaged: list[bytes]) -> None:
        """Keep unreadable entries with their bytes, never just drop them."""
        quarantine = self.path + ".quarantine"
        fd = open_append(quarantine)
        try:
            write_all(fd, b"".join(b"%s\n" % base64.b64encode(raw) for raw in damaged))
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(quarantine)
        log.error("journal: %d unreadable entr(ies) skipped, kept in %s", len(damaged), quarantine)

    def _write(self, data: bytes) -> None:
        """Append ``data`` whole, or cut back what was written of it and raise ``OSError``.

        A disk that fills writes part of a line: left there, the next entry would run into
        it and both be unreadable.
        """
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            write_all(self._fd, data)
        except BaseException:
            os.ftruncate(self._fd, end)
            raise

    async def append(self, session_id: str, message: bytes, turn_id: str | None) -> Entry:
        """Write one entry and return once it is durable.

        :class:`RowRefused` (a ``ValueError``) for a row the host would refuse, or the client
        could not read back, before anything is written: in the journal such a row would be
        sent, and refused, at every drain.
        """
        if (reason := refusal(session_id, message, turn_id)) is not None:
            raise RowRefused(f"row refused, the host could never store it: {reason}")
        entry = Entry(self.next_seq, session_id, Raw(message), turn_id)
        line = _sealed(_ENC.encode(entry))
        self._write(line)
        self.next_seq += 1
        self._written = entry.seq
        self.pending[entry.seq] = entry
        self._sizes[entry.seq] = len(line)
        self._live += len(line)
        await self._sync_through(entry.seq)
        return entry

    async def _sync_through(self, seq: int) -> None:
        while self._synced < seq:
            if self._sync is None or self._sync.done():
                # The fsync is a task of its own: cancelling one waiter (even the one that
                # started it) neither stops it nor fails the others sharing it.
                self._sync = asyncio.ensure_future(self._fsync(self._written))
            await asyncio.shield(self._sync)

    async def _fsync(self, target: int) -> None:
        if not self._dir_synced:
            await asyncio.to_thread(self._sync_dir)
        fd = os.dup(self._fd)  # its own descriptor: a compaction may close ours meanwhile
        try:
            await asyncio.to_thread(os.fsync, fd)
        finally:
            os.close(fd)
        self.fsyncs += 1
        self._synced = max(self._synced, target)

    async def sync_acks(self) -> None:
        """Make every ack so far durable (before a cut: see ``TurnDriver``); ``OSError``
        when one a full disk refused still cannot be written (then the cut must not go:
        a replay of its row after it would store the row again)."""
        if self._unwritten:
            self._write_acks([])
        await self._fsync(self._written)

    def ack(self, seq: int) -> None:
        """Mark an entry acknowledged by the host (not fsynced: a replay is harmless).

        A write that fails (a full disk) is logged, never raised: the host has the row. The
        ack is written with the next one (or by :meth:`sync_acks`); until then a restart
        sends the entry again.
        """
        if self.pending.pop(seq, None) is None:
            return
        size = self._sizes.pop(seq, 0)
        self._dead += size
        self._live -= size
        try:
            self._write_acks([seq])
        except OSError as exc:
            log.warning("journal: ack of entry %d not written (%s): written later", seq, exc)
            return
        self._compact_if(self._dead >= max(COMPACT_BYTES, self._live, self._retry_at))

    def _write_acks(self, seqs: list[int]) -> None:
        """Write the acks a full disk refused so far, and ``seqs``'s (``OSError``: kept)."""
        todo = [*self._unwritten, *seqs]
        data = b"".join(_sealed(b'{"ack":%d}' % s) for s in todo)
        try:
            self._write(data)
        except OSError:
            self._unwritten = todo
            raise
        self._unwritten = []
        self._dead += len(data)

    async def set_aside(self, entries: list[tuple[Entry, str]]) -> None:
        """Move entries the host will never store to ``<path>.rejected``, then ack them.

        One JSON line each (``seq``, ``sessionId``, ``turnId``, ``reason``, ``message``: the
        entry's own bytes), fsynced before the acks, so a crash in between sets them aside
        again rather than losing them.
        """
        lines = [
            _ENC.encode(
                {
                    "seq": e.seq,
                    "sessionId": e.session_id,
                    "turnId": e.turn_id,
                    "reason": reason,
                    "message": e.message,
                }
            )
            + b"\n"
            for e, reason in entries
        ]
        await asyncio.to_thread(self._append_rejected, b"".join(lines))
        for e, _ in entries:
            self.refused.pop(e.seq, None)
            self.ack(e.seq)

    def _append_rejected(self, data: bytes) -> None:
        path = self.path + ".rejected"
        fd = open_append(path)  # a link or FIFO planted there is moved aside, never used
        try:
            size = os.fstat(fd).st_size
            try:
                write_all(fd, data)
                os.fsync(fd)
            except BaseException:
                os.ftruncate(fd, size)  # never half a record for the next to run into
                raise
        finally:
            os.close(fd)
        if size == 0:  # a new file: its name is durable only once the folder is
            fsync_dir(path)

    def _compact_if(self, due: bool) -> None:
        """Compact if ``due``; a compaction the disk refuses (full) is logged, and tried
        again only once as many bytes more are acknowledged (not at every ack)."""
        if not due:
            return
        try:
            self._compact()
        except OSError as exc:
            self._retry_at = self._dead + COMPACT_BYTES
            log.warning("journal: not compacted (%s): tried again later", exc)

    def _compact(self) -> None:
        """Replace the journal by its pending entries (atomic replace, folder fsync)."""
        tmp = f"{self.path}.{os.urandom(4).hex()}{_TMP}"
        fd = -1
        try:
            write_new(tmp, b"".join(_sealed(_ENC.encode(e)) for e in self.pending.values()))
            # Opened before the rename: once the new file has the name, nothing can fail
            # that would leave later entries going, fsynced and "durable", into the old
            # file, which the rename unlinked.
            fd = open_regular(tmp, os.O_RDWR | os.O_APPEND)
            os.rename(tmp, self.path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):  # a full disk's half copy: not left behind
                os.unlink(tmp)
            raise
        old, self._fd = self._fd, fd
        os.close(old)
        self._dead, self._unwritten, self._retry_at = 0, [], 0  # gone with the old file
        self._dir_synced = False
        self._sync_dir()

    def _sync_dir(self) -> None:
        """fsync the journal's folder, so the name of a new or compacted file is durable.

        Until it succeeds no entry is reported durable (``_fsync`` retries it first): a
        power cut could otherwise bring the old file back without them.
        """
        if self._dir_synced:
            return
        fsync_dir(self.path)
        self._dir_synced = True

    def stats(self) -> dict[str, Any]:
        return {"pending": len(self.pending), "fsyncs": self.fsyncs, "nextSeq": self.next_seq}
