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

log = logging.getLogger("host.intents")


class ArchiveStep(Struct, rename="camel"):
    root_id: str
    revisions: list[dict[str, object]]


class CutStep(Struct, rename="camel"):
    offset: int
    before: int  # the file's size before the cut
    cut_sha256: str  # of the bytes [offset, before): the cut applies to exactly those
    append: str | None = None  # the restamped root line, written right after the cut


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
        """Make the cut as the intent says, if it has one (see :meth:`apply_files`)."""
        if isinstance(intent.cut, CutStep):
            cut = intent.cut
            tail = b"" if cut.append is None else cut.append.encode() + b"\n"
            size = os.fstat(fd).st_size
            done = cut.offset + len(tail)
            if size == done and self.fs.pread(fd, len(tail), cut.offset) == tail:
                return  # already done
            planned = size == cut.before and (
                hashlib.sha256(self.fs.pread(fd, size - cut.offset, cut.offset)).hexdigest()
                == cut.cut_sha256
            )
            # Cut, and the root line half written after it (a crash inside that write).
            half = cut.offset < size < done and tail.startswith(
                self.fs.pread(fd, size - cut.offset, cut.offset)
            )
            if not (planned or half) and size != cut.offset:
                # Not one of the states this cut passes through: the file moved on since
                # (a finished change whose intent could not be removed). Never cut it.
                log.error("session %s: stale cut intent ignored", intent.session_id)
                return
            self.fs.ftruncate(fd, cut.offset)
            if tail:
                os.lseek(fd, 0, os.SEEK_END)
                self.fs.write_all(fd, tail)
            self.fs.fsync(fd)
