"""Each transcript's *epoch*: the durable half of a watch cursor.

A cursor names a position in what is on disk: so many lines of a transcript, so many bytes
of its turn log. Lines are only ever appended to a transcript until something rewrites it
(an update, a delete, a replace, a cut, a regenerate, a revision swap, a line quarantined,
the session deleted). The epoch names one stretch of that history: it is a random token
kept in ``DIR/watch/<id>.epoch``, and every rewrite *forgets* it first, durably (the file
unlinked and its folder fsynced before the rewrite's own commit point). So a cursor whose
epoch is still the file's names lines that are still there, byte for byte, after any crash
or power cut; one whose epoch is gone is answered ``reset``.

The file is made only when a watcher first needs a cursor (written, fsynced, renamed in,
folder fsynced: before the cursor is handed out), so a session nobody watches costs a
rewrite nothing but one ``lstat``. A new epoch is random, never a counter: a session
deleted and made again under its id can never meet a cursor of the old one. The watch hub
(:class:`host._watch.WatchHub`) is the registry's :class:`Epochs`.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from host._fs import FileSystem, NotRegularFile, on_thread, read_regular
from host._layout import Layout, legal_id

if TYPE_CHECKING:
    from host._session import Session

SUFFIX = ".epoch"
_TOKEN = re.compile(rb"[0-9a-f]{16}\n?\Z")


class Epochs:
    """The epoch files of one data dir."""

    def __init__(self, layout: Layout, fs: FileSystem, sessions: dict[str, Session]) -> None:
        self.layout = layout
        self.fs = fs
        self.folder = os.path.join(layout.root, "watch")
        self.sessions = sessions
        """The registry's: each :class:`Session` keeps the epoch this process read or made
        (``Session.epoch``). A rewrite drops it (on whichever thread makes it: one store),
        so a kept one is always the file's."""

    def known(self, session_id: str) -> str | None:
        """The session's epoch as this process knows it, or ``None``."""
        s = self.sessions.get(session_id)
        return s.epoch if s is not None else None

    def _path(self, session_id: str) -> str:
        if not legal_id(session_id):
            raise ValueError(f"not a session id: {session_id!r}")
        return os.path.join(self.layout.checked(self.folder), session_id + SUFFIX)

    # -- the epochs (blocking: call on a thread, under the session's queue) --------------

    def current(self, session_id: str) -> str:
        """The session's epoch, made (durably) if it has none yet."""
        if (epoch := self.known(session_id)) is not None:
            return epoch
        path = self._path(session_id)
        try:
            data = read_regular(path)
        except FileNotFoundError:
            data = b""
        except NotRegularFile:  # a link or a FIFO planted there: never read, replaced
            self.fs.unlink(path)
            data = b""
        if _TOKEN.match(data):
            epoch = data[:16].decode()
        else:  # none, or torn by a power cut during its write: a new one (a reset)
            epoch = os.urandom(8).hex()
            self.fs.mkdir(self.folder)
            self.fs.write_atomic(path, epoch.encode() + b"\n")
        if (s := self.sessions.get(session_id)) is not None:
            s.epoch = epoch
        return epoch

    def forget(self, session_id: str) -> None:
        """End the session's epoch, durably: call before any change that is not an append.

        Costs one ``lstat`` when the session has none (nobody ever watched it).
        """
        if (s := self.sessions.get(session_id)) is not None:
            s.epoch = None
        path = self._path(session_id)
        if self.fs.unlink(path):
            self.fs.fsync_dir(self.folder)

    async def before_change(self, session_id: str) -> None:
        """A rewrite or a delete of the session is about to be made (its commit follows)."""
        if self.known(session_id) is not None or os.path.lexists(self._path(session_id)):
            await on_thread(self.forget, session_id)
