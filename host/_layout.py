"""Where everything lives under the data dir, and the id check before any path is made.

DIR/host.lock                         one host per data dir (flock)
DIR/index.sqlite3                     the index (WAL)
DIR/sessions/<id>.jsonl               the transcript, the truth
DIR/sessions/<id>.meta.json           title and creation time
DIR/sessions/<id>.inflight.json       the streaming checkpoint (ADR 0153)
DIR/sessions/<id>.inflight.spare      the checkpoint before it: the next one's temp file
DIR/sessions/<id>.intent.json         a recorded change of several files (ADR 0216)
DIR/sessions/<id>.turns.log           the turn log (the turn table is derived from it)
DIR/sessions/<id>.jsonl.quarantine    corrupt lines moved aside at start
DIR/sessions/<id>.jsonl.deleted       the transcript of a session being deleted
DIR/revisions/<id>/<rootId>/          archived regenerate branches (ADR 0060)
DIR/watch/<id>.epoch                  the transcript's epoch, once watched: ended by every rewrite
"""

from __future__ import annotations

import logging
import os
import re
import stat

from host._errors import InvalidParams, StorageError
from host._wire import ID_PATTERN

_ID = re.compile(ID_PATTERN)
log = logging.getLogger("host.layout")


def legal_id(value: object) -> bool:
    """Whether ``value`` is a legal id (a safe file name of the data dir)."""
    return isinstance(value, str) and _ID.match(value) is not None


def check_id(value: str, what: str = "id") -> str:
    """Return ``value`` if it is a legal id, else raise ``InvalidParams``."""
    if not legal_id(value):
        raise InvalidParams(f"{what} must be 1-128 characters of [A-Za-z0-9._:-], not . or ..")
    return value


_LEFTOVERS = (
    ".jsonl.deleted",
    ".meta.json",
    ".inflight.json",
    ".intent.json",
    ".turns.log",
    ".jsonl.quarantine",
)
SPARE = ".inflight.spare"
"""A checkpoint's spare: a temp file, removed at every start with the ``*.tmp`` files."""


class UnsafeDataDir(Exception):
    """Raised when the data dir holds what the host must not follow (a symlinked folder)."""


class UnsafeFolder(StorageError):
    """Raised when a folder under the data dir is a symlink (or no folder) at run time.

    The start refuses a linked ``sessions/`` or ``revisions/``, but a link can be planted
    while the host runs (a sync client, a stray tool): every path of a write is checked
    before use (:meth:`Layout.checked`), so the host never writes or deletes through one.
    """


class Layout:
    """Paths under one data dir; every session path goes through :func:`check_id`."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.sessions = os.path.join(self.root, "sessions")
        self.revisions_root = os.path.join(self.root, "revisions")
        self.index = os.path.join(self.root, "index.sqlite3")

    def _session_file(self, session_id: str, suffix: str) -> str:
        name = check_id(session_id, "sessionId") + suffix
        return os.path.join(self.checked(self.sessions), name)

    def checked(self, folder: str) -> str:
        """Return ``folder`` once every folder from the data dir down to it is a real one.

        Raises :class:`UnsafeFolder` (naming the link) at the first that is a symlink or
        no folder; one that does not exist yet ends the check (it is made as a folder).
        One ``lstat`` per level, before each use: a link swapped in between the check and
        the use is not caught, which takes writing into the data dir (0700) in that instant.
        """
        path = self.root
        for part in os.path.relpath(folder, self.root).split(os.sep):
            path = os.path.join(path, part)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                break
            if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
                what = "a symlink" if stat.S_ISLNK(mode) else "not a folder"
                raise UnsafeFolder(
                    f"{path} is {what}: the host follows no link out of its data dir and"
                    " writes only into its own folders; remove it",
                    errno="ELOOP" if stat.S_ISLNK(mode) else "ENOTDIR",
                )
        return folder

    def check_no_links(self) -> None:
        """Raise :class:`UnsafeDataDir` if a folder of the data dir, or its index, is a symlink.

        Start-up's sweeps remove files in them: through a link, files outside the data dir.
        """
        for path in (self.sessions, self.revisions_root, self.index):
            if os.path.islink(path):
                raise UnsafeDataDir(f"{path} is a symlink: the data dir's own entries must not be")

    def transcript(self, session_id: str) -> str:
        return self._session_file(session_id, ".jsonl")

    def meta(self, session_id: str) -> str:
        return self._session_file(session_id, ".meta.json")

    def inflight(self, session_id: str) -> str:
        return self._session_file(session_id, ".inflight.json")

    def inflight_spare(self, session_id: str) -> str:
        """The temp file a checkpoint replace reuses (:meth:`FileSystem.write_swap`)."""
        return self._session_file(session_id, SPARE)

    def intent(self, session_id: str) -> str:
        return self._session_file(session_id, ".intent.json")

    def turns(self, session_id: str) -> str:
        return self._session_file(session_id, ".turns.log")

    def quarantine(self, session_id: str) -> str:
        return self._session_file(session_id, ".jsonl.quarantine")

    def revisions(self, session_id: str) -> str:
        return os.path.join(self.revisions_root, check_id(session_id, "sessionId"))

    def buried(self, session_id: str) -> str:
        """The transcript of a session being deleted (renamed: the delete's commit)."""
        return self._session_file(session_id, ".jsonl.deleted")

    def session_files(self, session_id: str) -> list[str]:
        """Every file of a session but its revisions, transcript first."""
        return [
            self.transcript(session_id),
            self.buried(session_id),
            self.meta(session_id),
            self.inflight(session_id),
            self.inflight_spare(session_id),
            self.intent(session_id),
            self.turns(session_id),
        ]

    def leftovers(self) -> list[tuple[str, str]]:
        """(session id, path) of every session file whose transcript is gone.

        A session is its transcript: these are what a delete (or a create) cut short left.
        """
        live = set(self.transcript_ids())
        out = []
        for name in sorted(os.listdir(self.sessions)):
            for suffix in _LEFTOVERS:
                sid = name[: -len(suffix)]
                if name.endswith(suffix) and legal_id(sid) and sid not in live:
                    out.append((sid, os.path.join(self.sessions, name)))
        return out

    def case_twin(self, session_id: str) -> str | None:
        """A session whose id differs from ``session_id`` only in case, if there is one.

        On a case-insensitive file system (macOS's default) the two ids name one file, so
        ``session.create`` refuses such an id on every file system: a data dir then means
        the same wherever it is copied. Ids are ASCII, so ``lower()`` folds them exactly.
        """
        folded = session_id.lower()
        twins = (sid for sid in self.transcript_ids() if sid.lower() == folded)
        return next((sid for sid in twins if sid != session_id), None)

    def sidecar_ids(self, suffix: str) -> list[str]:
        """Session ids that have a ``<id><suffix>`` file in ``sessions/``, sorted.

        A name that is no legal id (a copy named by hand, ``0 copy.inflight.json``) is no
        session's: it is logged and left alone, so it cannot break the sessions that are.
        """
        out = []
        for name in sorted(os.listdir(self.sessions)):
            if name.endswith(suffix):
                if legal_id(sid := name[: -len(suffix)]):
                    out.append(sid)
                else:
                    path = os.path.join(self.sessions, name)
                    log.warning("%s: not a legal session id, so no session's: left alone", path)
        return out

    def transcript_ids(self, *, report: bool = False) -> list[str]:
        """Session ids that have a transcript file, sorted.

        A directory or a symlink of that name is no transcript, nor a ``.jsonl`` file whose
        name is no legal id (a copy named by hand): each is left alone, so it cannot stop a
        start, and logged when ``report`` (once per start: recovery's listing).
        """
        out = []
        with os.scandir(self.sessions) as entries:
            for e in entries:
                if not e.name.endswith(".jsonl"):
                    continue
                sid = e.name[: -len(".jsonl")]
                legal = legal_id(sid)
                if legal and e.is_file(follow_symlinks=False):
                    out.append(sid)
                elif report:
                    why = "not a regular file" if legal else "not a legal session id"
                    log.warning("%s: %s, so not a transcript: left alone", e.path, why)
        return sorted(out)
