"""What the host takes as a row, checked before a row enters the journal (issue 29).

A row the host refuses can never be stored: left in the journal it is sent again at every
drain. So ``enqueue`` refuses it (:class:`RowRefused`, a ``ValueError``) and the drain sets
aside one an older journal still holds. The check is the host's own, made the host's way:
the message's head is decoded into a ``Struct`` shaped like ``host._messages.Head``, with
the same id pattern and literals, so the reasons read as the host's ``INVALID_PARAMS``
would (``tests/outbox/test_bad_rows.py`` checks the two agree, case by case). The outbox
does not import the host: in the app it is another process, often in another language.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

ID_PATTERN = r"^(?!\.\.?\Z)[A-Za-z0-9._:-]{1,128}\Z"  # host/_wire.py's, char for char
Id = Annotated[str, Meta(pattern=ID_PATTERN)]
ROW_LIMIT = 64 * 1024 * 1024 - 4096  # a row that cannot fit any request line
_ID = re.compile(ID_PATTERN)


class RowRefused(ValueError):
    """Raised by ``enqueue`` for a row the host could never store."""


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


def refusal(session_id: str, message: bytes, turn_id: str | None) -> str | None:
    """Why the host would refuse this row every time it is sent, or ``None``.

    ``message`` is JSON the caller has already proved readable (its depth too).
    """
    if not is_id(session_id):
        return f"sessionId {session_id!r} is not an id (1-128 of [A-Za-z0-9._:-])"
    if turn_id is not None and not is_id(turn_id):
        return f"turnId {turn_id!r} is not an id (1-128 of [A-Za-z0-9._:-])"
    if len(message) + 256 > ROW_LIMIT:
        return f"message of {len(message)} bytes is over the host's line limit"
    try:
        head = _HEAD.decode(message)
    except msgspec.ValidationError as exc:
        return f"message: {exc}"
    if head.capped:
        return f"message {head.id!r} is a display-capped copy (capped: true): CONFLICT"
    return None
