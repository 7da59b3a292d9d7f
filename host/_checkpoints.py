"""Streaming checkpoints (ADR 0153): ``sessions/<id>.inflight.json``, one per session.

A checkpoint holds the session's streaming assistant message and its turn id. It is
replaced atomically (temp file, fsync, rename, folder fsync), never goes into the
transcript as extra lines and never touches the index until it is promoted. Its temp
file is kept between saves (``<id>.inflight.spare``, :meth:`FileSystem.write_swap`):
a reply streams many snapshots of one growing message, and reusing the file's blocks
more than halves each replace. Whether a session has one, and whose message it holds, is
kept on its :class:`~host._session.Session`, so an append pays no system call to check. A
link, FIFO or folder at either file is set aside (``FileSystem.set_aside``): the checkpoint
when it is first read, the spare by the save that meets it, which then goes on.
"""

from __future__ import annotations

import msgspec
from msgspec import Raw, Struct

from host._fs import FileSystem, NotRegularFile, read_regular
from host._index import now_iso
from host._layout import Layout
from host._surrogates import decode
from host._wire import ENCODER, Id


class Checkpoint(Struct, rename="camel"):
    """The content of one checkpoint file.

    ``message_id`` is the message's own ``id``. The file leaves it out (the message is
    written as its caller's bytes, not decoded); older files carry it, and read the same.
    """

    session_id: str
    turn_id: str
    message: Raw
    saved_at: str
    message_id: str = ""


class _MessageId(Struct):
    id: Id


_DEC = msgspec.json.Decoder(Checkpoint)
_MESSAGE_ID = msgspec.json.Decoder(_MessageId)


class Checkpoints:
    """Every session's checkpoint file."""

    def __init__(self, layout: Layout, fs: FileSystem) -> None:
        self.layout = layout
        self.fs = fs

    def read(self, session_id: str) -> Checkpoint | None:
        """Return the session's checkpoint; ``ValueError`` when the file is corrupt."""
        path = self.layout.inflight(session_id)
        try:
            data = read_regular(path)
        except FileNotFoundError:
            return None
        except NotRegularFile:  # a FIFO would block the loop; a folder fail every call
            self.fs.set_aside(path)
            return None
        try:
            cp = decode(_DEC, data)
            cp.message_id = cp.message_id or decode(_MESSAGE_ID, cp.message).id
        except (msgspec.MsgspecError, RecursionError) as exc:  # RecursionError: a hand edit
            raise ValueError(f"corrupt checkpoint: {exc}") from None
        return cp

    def read_raw(self, session_id: str) -> bytes:
        """Return the checkpoint file's bytes (to quarantine a corrupt one)."""
        return read_regular(self.layout.inflight(session_id))

    def save(self, session_id: str, turn_id: str, message: Raw) -> None:
        """Replace the session's checkpoint atomically, through its spare.

        The file's bytes are the message's own, framed: no 1 MB copy to encode them.
        """
        head = b'{"sessionId":%s,"turnId":%s,"savedAt":%s,"message":' % (
            ENCODER.encode(session_id),
            ENCODER.encode(turn_id),
            ENCODER.encode(now_iso()),
        )
        self.fs.write_swap(
            self.layout.inflight(session_id),
            self.layout.inflight_spare(session_id),
            [head, memoryview(message), b"}"],
        )

    def remove(self, session_id: str) -> None:
        """Remove the session's checkpoint durably.

        The folder fsync is needed: a checkpoint a power cut brings back after its row
        was cut away (a regenerate) would be promoted again at the next start.
        """
        self.fs.unlink(self.layout.inflight_spare(session_id))  # never read: not fsynced
        if self.fs.unlink(self.layout.inflight(session_id)):
            self.fs.fsync_dir(self.layout.sessions)
