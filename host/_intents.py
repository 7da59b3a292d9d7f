"""Intent records: a multi-file change written down before it starts (ADR 0216).

Truncation and pager stamps touch two things: the revision archive and the transcript.
Before touching either, the host writes ``sessions/<id>.intent.json`` atomically: the
archive manifest it will commit, the cut (byte offset, and the restamped root line to
append after it), and the stamp to set. Every step is an idempotent "make it so", so a
host that dies at any instant finishes the change at its next start: the result is the
old state (no intent on disk) or the new one, never a third.
"""

from __future__ import annotations

import hashlib
import logging
import os

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from host._archive import Archive, Revision
from host._fs import FileSystem, NotRegularFile, read_regular
from host._layout import Layout
from host._transcript import Transcript

log = logging.getLogger("host.intents")


class ArchiveStep(Struct, rename="camel"):
    root_id: str
    revisions: list[dict[str, object]]


class CutStep(Struct, rename="camel"):
    offset: int
    before: int  # the file's size before the cut
    cut_sha256: str  # of the bytes [offset, before): the cut applies to exactly those
    append: str | None = None  # the restamped root line, written at the offset
    rest_sha256: str = ""  # of [end, before), when the cut file is shorter than the old one

    @classmethod
    def planned(cls, offset: int, tail: bytes, append: bytes | None) -> CutStep:
        """The cut of ``tail`` (the file's bytes from ``offset``), ``append`` put in its place."""
        step = cls(
            offset, offset + len(tail), _sha(tail), None if append is None else append.decode()
        )
        if step.end < step.before:
            step.rest_sha256 = _sha(tail[step.end - offset :])
        return step

    @property
    def line(self) -> bytes:
        """The bytes the cut leaves at its offset: the root line and its newline, or none."""
        return b"" if self.append is None else self.append.encode() + b"\n"

    @property
    def end(self) -> int:
        """The file's size once cut."""
        return self.offset + len(self.line)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class StampStep(Struct, rename="camel"):
    message_id: str
    pager: dict[str, Raw]
    branch_revision: int | None = None  # activateRevision: the branch becomes this revision


class Intent(Struct, rename="camel", omit_defaults=True):
    session_id: str
    archive: ArchiveStep | UnsetType = UNSET
    cut: CutStep | UnsetType = UNSET
    stamp: StampStep | UnsetType = UNSET


_DEC = msgspec.json.Decoder(Intent)
_ENC = msgspec.json.Encoder()


def revisions_of(step: ArchiveStep) -> list[Revision]:
    return [Revision(**r) for r in step.revisions]  # type: ignore[arg-type]


class Intents:
    """Write, apply and clear intent records."""

    def __init__(self, layout: Layout, fs: FileSystem, archive: Archive) -> None:
        self.layout = layout
        self.fs = fs
        self.archive = archive
        # Sessions whose finished change left its intent on disk (its removal failed).
        self.left: set[str] = set()
        # Sessions whose change failed past its point of no return (the disk failed): it
        # is finished (:meth:`Store.finish_change`) before the session is served again.
        self.unfinished: set[str] = set()

    def record(self, intent: Intent) -> None:
        """Write the intent durably: from here on the change will happen."""
        self.fs.write_atomic(self.layout.intent(intent.session_id), _ENC.encode(intent))
        self.left.discard(intent.session_id)  # the new one replaced a leftover

    def clear(self, session_id: str) -> None:
        """Remove a finished intent durably; if that fails, :meth:`settle` tries again."""
        retry = session_id in self.left  # its unlink may be done, its folder fsync not
        self.left.add(session_id)
        if self.fs.unlink(self.layout.intent(session_id)) or retry:
            self.fs.fsync_dir(self.layout.sessions)
        self.left.discard(session_id)

    def settle(self, session_id: str) -> None:
        """Remove a finished change's leftover intent before a write its replay would undo.

        A start replays an intent's steps over whatever it finds, so every write that a
        replay would undo waits for this:
        - a rewrite or a plain cut can bring the transcript back to a size the cut passes
          through (deleting the unanswered prompt after a regenerate, an edit-resend of
          its root): the cut's root line would come back;
        - ``saveRevision`` commits a manifest the intent's older one would replace.
        Appends need not: a longer file is never one of the cut's states (its root keeps
        its id, so the cut-away bytes cannot come back). Changes that record an intent of
        their own replace the leftover; every restamp is a rewrite or one of those.
        """
        if session_id in self.left:
            self.clear(session_id)

    def read(self, session_id: str) -> Intent | None:
        """The session's recorded intent, or ``None``."""
        try:
            return _DEC.decode(read_regular(self.layout.intent(session_id)))
        except FileNotFoundError:
            return None

    def pending(self) -> list[Intent]:
        """Return every intent left by a host that died (start-up only)."""
        out = []
        for sid in self.layout.sidecar_ids(".intent.json"):  # a stray name is left alone
            path = self.layout.intent(sid)
            try:
                intent = _DEC.decode(read_regular(path))
            except NotRegularFile as exc:  # a FIFO, folder or link: not the host's to remove
                log.error("%s left alone: %s", path, exc.strerror)
                continue
            except (OSError, msgspec.MsgspecError, RecursionError) as exc:
                # An intent is written atomically: a bad one was never recorded.
                log.error("unreadable intent %s dropped: %s", path, exc)
                self.fs.unlink(path)
                continue
            if intent.session_id != sid:  # a copy renamed by hand: never replayed
                log.error("%s names session %r: not its own, left alone", path, intent.session_id)
                continue
            out.append(intent)
        return out

    def apply_to_transcript(self, intent: Intent) -> None:
        """:meth:`apply_files` on the session's transcript (``FileNotFoundError``: gone)."""
        t = Transcript(self.fs, self.layout.transcript(intent.session_id))
        try:
            self.apply_files(intent, t.fd)
        finally:
            t.close()

    def finish(self, intent: Intent) -> None:
        """Clear a change that is made, and drop the archive payloads it left unnamed."""
        self.clear(intent.session_id)
        if isinstance(intent.archive, ArchiveStep):
            self.archive.prune(intent.session_id, intent.archive.root_id)

    def apply_files(self, intent: Intent, fd: int) -> None:
        """Make the archive and the cut as the intent says (``fd``: the transcript).

        Each step checks the state it finds rather than trusting the record: the cut
        applies only to the bytes it was planned for, or completes its own half-done self.
        """
        if isinstance(intent.archive, ArchiveStep):
            self.archive.commit(
                intent.session_id, intent.archive.root_id, revisions_of(intent.archive)
            )
        self.apply_cut(intent, fd)

    def apply_cut(self, intent: Intent, fd: int) -> None:
        """Make the cut as the intent says, if it has one (see :meth:`apply_files`).

        The root line is written over the bytes it replaces, then the file is cut after it:
        over blocks the file holds (or that :meth:`FileSystem.reserve` took), so on a full
        disk (ext4, xfs, tmpfs) nothing here needs new space (issue 26, case 9).
        """
        if not isinstance(intent.cut, CutStep):
            return
        cut = intent.cut
        line, end = cut.line, cut.end
        size = os.fstat(fd).st_size
        if size == end and self.fs.pread(fd, len(line), cut.offset) == line:
            return  # already done
        if not self._passes_through(cut, fd, size):
            # Not one of the states this cut passes through: the file moved on since
            # (a finished change whose intent could not be removed). Never cut it.
            log.error("session %s: stale cut intent ignored", intent.session_id)
            return
        if line:
            self.fs.overwrite(fd, line, cut.offset)
        if size > end:
            self.fs.ftruncate(fd, end)
        self.fs.fsync(fd)

    def _passes_through(self, cut: CutStep, fd: int, size: int) -> bool:
        """Whether a file of ``size`` bytes is in a state the cut passes through."""
        end = cut.end
        if size == cut.before and self._sha(fd, cut.offset, size) == cut.cut_sha256:
            return True  # as planned
        if size == end or size == cut.offset:
            return True  # the root line written over (perhaps torn); or cut by an older host
        if size == cut.before and end < size:  # written over (perhaps torn), not yet cut
            return cut.rest_sha256 == self._sha(fd, end, size)
        if cut.before <= size < end:
            return True  # written over on the way to growing into its reserved room, torn
        # An older host cut first, then appended: the root line half written.
        return cut.offset < size < end and cut.line.startswith(
            self.fs.pread(fd, size - cut.offset, cut.offset)
        )

    def _sha(self, fd: int, start: int, stop: int) -> str:
        return _sha(self.fs.pread(fd, stop - start, start))
