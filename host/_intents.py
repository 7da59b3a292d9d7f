"""The change engine: every change of a transcript but an append, rolled forward.

A change is made in four steps, as SQLite's pager plays one journal for rollback and for
crash recovery (docs/design.md, "Changes"):

1. **prepare**: every new byte is written to a file of its own and fsynced (a branch's
   archived payload, the manifest that will name it, the new transcript), and room is
   reserved for a cut in place. All the space the change needs is taken here, so a full
   disk fails this step, and what it wrote is removed: nothing changed.
2. **record**: a change of several files is written down, ``sessions/<id>.intent.json``,
   atomically and fsynced. That is its commit point: from here on it is made.
3. **apply**: each prepared file is renamed into place, the cut is made in place. Each
   step is "make it so", safe to run again over its own half-done self, and needs no new
   space. A change of one file (a rewrite: one rename; a plain cut: one ``ftruncate``) is
   its own record and needs none written.
4. **finish**: the intent is removed, durably.

When applying fails past the record (an I/O error), the call still succeeds, since the
change is recorded; the session is not served again until the same code has applied it:
at its next call, or at the next start. While a session has an intent on disk nothing
else changes its files, so the replay only ever meets states of its own change.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re

import msgspec
from msgspec import Struct

from host._archive import Archive
from host._fs import FileSystem, NotRegularFile, read_regular
from host._layout import Layout

log = logging.getLogger("host.intents")
_TEMP = re.compile(r"\.[0-9a-f]{12}\.tmp")


class Cut(Struct, rename="camel", forbid_unknown_fields=True):
    """The transcript cut at ``offset``, ``line`` (the restamped root) written there first."""

    offset: int
    line: str | None = None

    @property
    def data(self) -> bytes:
        return b"" if self.line is None else self.line.encode() + b"\n"


class Change(Struct, rename="camel", omit_defaults=True, forbid_unknown_fields=True):
    """One change of a session's files: what it prepared, and what applying it does."""

    session_id: str
    root_id: str | None = None  # the pager root whose archive manifest is replaced
    manifest: str | None = None  # its prepared manifest: a temp name in the root's folder
    payloads: list[str] = msgspec.field(default_factory=list)  # new payloads it names
    transcript: str | None = None  # the prepared new transcript: a temp name in sessions/
    cut: Cut | None = None  # or the transcript cut in place

    def several(self) -> bool:
        """Whether it changes several files (or one in several steps): it is recorded."""
        return self.root_id is not None or (self.cut is not None and self.cut.line is not None)


_DEC = msgspec.json.Decoder(Change)
_OLDER = {"archive", "cut", "stamp"}  # the steps of an intent of a host before this format


class OlderIntent(OSError):
    """The session's intent is of an older hostcore, which finished its change by other
    rules (a hash-checked cut, a stamp replayed): never guessed at, never dropped."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} records a change of an older hostcore, which this one does not make:"
            " the session is not served until it is (start that version once), or until"
            " the file is moved away to keep the session's files as they are"
        )


def _older(path: str, session_id: str) -> bool:
    try:
        old = msgspec.json.decode(read_regular(path))
    except (OSError, msgspec.MsgspecError, RecursionError):
        return False
    return (
        isinstance(old, dict) and old.get("sessionId") == session_id and bool(_OLDER & old.keys())
    )


_ENC = msgspec.json.Encoder()


class Intents:
    """Prepare, record, apply and finish changes."""

    def __init__(self, layout: Layout, fs: FileSystem, archive: Archive) -> None:
        self.layout = layout
        self.fs = fs
        self.archive = archive

    def commit(self, change: Change) -> bool:
        """Record (if it spans several files), apply and finish a prepared change.

        A failure before the record removes what was prepared and raises: nothing changed.
        ``False``: applying failed past the record; the change is made before the session
        is served again (:meth:`finish_left`, :attr:`Session.unfinished`).
        """
        if not change.several():
            try:
                self.apply(change)
            except BaseException:
                self.discard(change)
                raise
            return True
        sid = change.session_id
        try:
            if change.root_id is not None:  # the prepared manifest's name made durable: the
                # intent names it (the transcript's temp shares the intent's folder fsync)
                self.fs.fsync_dir(self.archive.folder(sid, change.root_id))
            self.fs.write_atomic(self.layout.intent(sid), _ENC.encode(change))
        except BaseException:
            # A replace whose rename could not be taken back left the intent (durable or
            # not): what it names is kept, and the change made before the session is
            # served again (:meth:`recorded`); the error is the call's all the same.
            if not self.recorded(sid):
                self.discard(change)
            raise
        try:
            self.apply(change)
            self.finish(change)
        except Exception as exc:  # whatever it was: recorded, so made (finish_left)
            log.error("session %s: a recorded change is not applied yet: %r", sid, exc)
            return False
        return True

    def recorded(self, session_id: str) -> bool:
        """Whether the session has an intent on disk (it is made before it is served)."""
        return os.path.lexists(self.layout.intent(session_id))

    def discard(self, change: Change) -> None:
        """Remove what a change prepared: it was never recorded (the one undo)."""
        folder = self.layout.sessions
        names = [(folder, change.transcript)]
        if change.root_id is not None:
            root = self.archive.folder(change.session_id, change.root_id)
            names += [(root, change.manifest), *((root, p) for p in change.payloads)]
        for where, name in names:
            if name is not None:
                try:
                    self.fs.unlink(os.path.join(where, name))
                except OSError as exc:  # a temp name: the next start's sweep removes it
                    log.warning("%s left behind: %s", name, exc)

    def apply(self, change: Change) -> None:
        """Make the change as recorded; safe to run again, and needs no new space."""
        sid = change.session_id
        if change.root_id is not None and change.manifest is not None:
            folder = self.archive.folder(sid, change.root_id)
            self._install(folder, change.manifest, "manifest.json")
            self.archive.on_change(sid)  # the search index syncs this session's archive
        if change.transcript is not None:
            name = os.path.basename(self.layout.transcript(sid))
            self._install(self.layout.sessions, change.transcript, name)
        if change.cut is not None:
            fd = self.fs.open(self.layout.transcript(sid), os.O_RDWR)
            try:
                self._cut(sid, change.cut, fd)
            finally:
                self.fs.close(fd)

    def _install(self, folder: str, tmp: str, name: str) -> None:
        if _TEMP.fullmatch(tmp[len(name) :]) is None or not tmp.startswith(name):
            raise OSError(f"{tmp!r} is not a temp file of {name!r}")  # a hand-edited intent
        with contextlib.suppress(FileNotFoundError):  # renamed already: only the fsync left
            self.fs.rename(os.path.join(folder, tmp), os.path.join(folder, name))
        self.fs.fsync_dir(folder)

    def _cut(self, sid: str, cut: Cut, fd: int) -> None:
        """The root line written over the bytes it replaces, then the file cut after it:
        over blocks the file holds (or that :meth:`FileSystem.reserve` took)."""
        size = os.fstat(fd).st_size
        if size < cut.offset:
            log.error("session %s: transcript shorter than its recorded cut: left", sid)
            return
        line = cut.data
        if line:
            self.fs.overwrite(fd, line, cut.offset)
        if size > cut.offset + len(line):
            self.fs.ftruncate(fd, cut.offset + len(line))
        self.fs.fsync(fd)

    def finish(self, change: Change) -> None:
        """Remove a made change's intent, durably, and the payloads no manifest names."""
        self.fs.unlink(self.layout.intent(change.session_id))
        self.fs.fsync_dir(self.layout.sessions)
        if change.root_id is not None:
            self.archive.prune(change.session_id, change.root_id)

    def finish_left(self, session_id: str) -> bool:
        """Apply and finish the change a session has recorded, if any (blocking); return
        whether there was one.

        ``OSError`` while the disk still fails: the session stays unserved until then.
        """
        change = self.read(session_id)
        if change is None:  # removed (its folder's fsync failed), or none of its own
            self.fs.fsync_dir(self.layout.sessions)
            return False
        if os.path.lexists(self.layout.transcript(session_id)):  # else removed by hand
            self.apply(change)
        self.finish(change)
        log.warning("session %s: a recorded change is made", session_id)
        return True

    def read(self, session_id: str) -> Change | None:
        """The session's recorded change, or ``None``; one that is not its own, or not
        readable (it is written atomically: a bad one was never recorded), is set aside."""
        path = self.layout.intent(session_id)
        try:
            change = _DEC.decode(read_regular(path))
        except FileNotFoundError:
            return None
        except NotRegularFile as exc:  # a FIFO, folder or link: not the host's to remove
            log.error("%s left alone: %s", path, exc.strerror)
            return None
        except (OSError, msgspec.MsgspecError, RecursionError) as exc:
            if _older(path, session_id):
                raise OlderIntent(path) from None
            log.error("unreadable intent %s dropped: %s", path, exc)
            self.fs.unlink(path)
            return None
        if change.session_id != session_id:  # a copy renamed by hand: never replayed
            log.error("%s names session %r: not its own, left alone", path, change.session_id)
            return None
        return change

    def pending(self) -> list[str]:
        """Sessions with a recorded change (start-up: each is made before anything else)."""
        return self.layout.sidecar_ids(".intent.json")  # a stray name is left alone
