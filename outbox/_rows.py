"""What the host takes as a row, checked before a row enters the journal (issue 29).

A row the host refuses can never be stored: left in the journal it is sent again at every
drain. So ``enqueue`` refuses it (:class:`RowRefused`, a ``ValueError``) and the drain sets
aside one an older journal still holds. The check is the host's own, made the host's way:
the message's head is decoded into a ``Struct`` shaped like ``host._messages.Head``, with
the same id pattern and literals, so the reasons read as the host's ``INVALID_PARAMS``
would (``tests/outbox/test_bad_rows.py`` checks the two agree, case by case). The outbox
does not import the host, in the app another process, often in another language; only its
reading of half surrogate pairs is shared (``outbox._read``), so that the two cannot read
the same text apart: a row holding one (``JSON.stringify``'s ``\ud83d``) is taken, as the
host takes it, alone or in a batch.

The bounds are the host's, never tighter (issue 36: a reply nested 300 levels, which the
host stores, was refused here): a message of :data:`MAX_MESSAGE` bytes at most, nested
:data:`MAX_DEPTH` levels at most, and JSON the client can read back whole (``1e999`` is JSON
syntax no decoder reads: the host would store it, and every read of it would fail).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from outbox._read import deep, read

ID_PATTERN = r"^(?!\.\.?\Z)[A-Za-z0-9._:-]{1,128}\Z"  # host/_wire.py's, char for char
Id = Annotated[str, Meta(pattern=ID_PATTERN)]
MAX_MESSAGE = 64 * 1024 * 1024 - 4096
"""Bytes a message may hold: the host's ``MAX_MESSAGE`` (its 64 MiB line less 4 KiB kept
for the fields it adds). A batch line of one such row, sent alone, fits the 64 MiB."""
MAX_DEPTH = 979
"""How deep a message may nest (the message object is the first level): the deepest the
host reads inside a batch line on every call path, as the drain sends rows. Its decoder
recurses within CPython's 1,000 frames, from some twenty frames down its stack, and the
first append of a run goes a frame deeper than the next (979 there, 980 after): the outbox
takes the lower, so that no path refuses a row it sent (one that does is answered
``PARSE_ERROR`` with its id, and set aside). ``tests/outbox/test_bad_rows`` holds this to
the real host."""
_ID = re.compile(ID_PATTERN)
_ANY = msgspec.json.Decoder()


class RowRefused(ValueError):
    """Raised by ``enqueue`` for a row the host could never store (nothing is written), and
    by ``TurnDriver.run`` after it ended that row's turn ``error``."""


class _Head(Struct, rename="camel"):
    """The fields of a message the host reads (``host._messages.Head``)."""

    id: Id
    role: Literal["user", "assistant", "tool", "system"]
    turn_id: Id | UnsetType | None = UNSET
    status: Literal["complete", "aborted", "error"] = "complete"
    capped: bool = False
    revision_root_id: Any = UNSET
    revision_count: Any = UNSET
    active_revision: Any = UNSET


_HEAD = msgspec.json.Decoder(_Head)


def is_id(value: object) -> bool:
    """Whether ``value`` is a session, turn or message id the host accepts."""
    return isinstance(value, str) and _ID.match(value) is not None


def depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (without recursion)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def refusal(session_id: str, message: bytes, turn_id: str | None) -> str | None:
    """Why the host would refuse this row every time it is sent (or the client could not
    read it back), or ``None``. Read as the host reads it, from any stack (``outbox._read``)."""
    if not is_id(session_id):
        return f"sessionId {session_id!r} is not an id (1-128 of [A-Za-z0-9._:-])"
    if turn_id is not None and not is_id(turn_id):
        return f"turnId {turn_id!r} is not an id (1-128 of [A-Za-z0-9._:-])"
    if len(message) > MAX_MESSAGE:
        return (
            f"message of {len(message):,} bytes is over the host's limit of {MAX_MESSAGE:,}"
            " (64 MiB less 4 KiB)"
        )
    try:
        message.decode("utf-8")  # the host refuses the whole batch line otherwise
        value = deep(_ANY.decode, message)  # what the client must read back, whole
    except RecursionError:
        return f"message nests deeper than the {MAX_DEPTH} levels the host reads"
    except UnicodeDecodeError as exc:
        return f"message is not UTF-8: {exc}"
    except msgspec.DecodeError as exc:
        try:  # as the host reads it: JSON, a half surrogate pair kept
            value = deep(read, _ANY, message)
        except (msgspec.DecodeError, RecursionError):
            return f"message is not JSON the host and client can read: {exc}"
    if (levels := depth(value)) > MAX_DEPTH:
        return f"message nests {levels} levels, deeper than the {MAX_DEPTH} the host reads"
    try:
        head = deep(read, _HEAD, message)
    except msgspec.ValidationError as exc:
        return f"message: {exc}"
    if head.capped:
        return f"message {head.id!r} is a display-capped copy (capped: true): CONFLICT"
    return None
