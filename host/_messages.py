"""Messages as opaque bytes: read the few fields the host owns, keep the rest verbatim.

A message is decoded twice, both cheaply: once into :class:`Head` (the fields the host
reads, validated) and once into ``dict[str, Raw]`` so that every value the caller sent is
written back as the caller's own bytes. Only the host-owned keys are ever replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from host._errors import Conflict, InvalidParams, LimitExceeded, ParseError
from host._surrogates import decode
from host._wire import MAX_MESSAGE, MESSAGE_ROOM, Id

PAGER_KEYS = ("revisionRootId", "revisionCount", "activeRevision")
Role = Literal["user", "assistant", "tool", "system"]
Status = Literal["complete", "aborted", "error"]


class Head(Struct, rename="camel"):
    """The fields of a message the host reads; everything else is the caller's."""

    id: Id
    role: Role
    turn_id: Id | UnsetType | None = UNSET
    status: Status = "complete"
    capped: bool = False
    revision_root_id: Any = UNSET
    revision_count: Any = UNSET
    active_revision: Any = UNSET


_HEAD = msgspec.json.Decoder(Head)
_FIELDS = msgspec.json.Decoder(dict[str, Raw])
_ENC = msgspec.json.Encoder()
_RAW = msgspec.json.Decoder(Raw)
_ANY = msgspec.json.Decoder()


class Message:
    """A validated message: its head, its raw fields, and the stored line it makes."""

    __slots__ = ("fields", "head")

    def __init__(self, head: Head, fields: dict[str, Raw]) -> None:
        self.head = head
        self.fields = fields

    @property
    def id(self) -> str:
        return self.head.id

    @property
    def turn_id(self) -> str | None:
        t = self.head.turn_id
        return t if isinstance(t, str) else None

    def with_status(self, status: Status) -> Message:
        """Return this message with ``status`` set (a promoted checkpoint)."""
        fields = dict(self.fields)
        fields["status"] = Raw(_ENC.encode(status))
        return Message(msgspec.structs.replace(self.head, status=status), fields)

    def has_content(self) -> bool:
        """Whether the message says anything: not empty text, an empty list, or no content."""
        raw = self.fields.get("content")
        if raw is None:
            return False
        try:
            value = decode(_ANY, raw, read=True)
        except (msgspec.MsgspecError, RecursionError):
            return True  # numbers or nesting past what decodes: it is not empty
        if isinstance(value, str):
            return value != ""
        if isinstance(value, list):
            return any(
                not (isinstance(b, dict) and b.get("type") == "text" and not b.get("text"))
                and b not in ("", None)
                for b in value
            )
        return value is not None

    def pager(self) -> dict[str, Raw]:
        """Return the pager fields present in this message, as raw values."""
        return {k: self.fields[k] for k in PAGER_KEYS if k in self.fields}

    def stored_line(self, *, turn_id: str | None, pager: dict[str, Raw]) -> bytes:
        """Return the line to store (no newline): caller pager fields replaced by ``pager``."""
        fields = {k: v for k, v in self.fields.items() if k not in PAGER_KEYS}
        if turn_id is not None:
            fields["turnId"] = Raw(_ENC.encode(turn_id))
        fields.update(pager)
        return _ENC.encode(fields)


def parse_all(raws: Sequence[bytes]) -> list[Message]:
    """Validate a call's ``messages`` (each as :func:`parse_incoming`); ids must not repeat."""
    msgs = [parse_incoming(raw, f"messages[{i}]") for i, raw in enumerate(raws)]
    seen: set[str] = set()
    for m in msgs:
        if m.id in seen:
            raise InvalidParams(f"messages: duplicate id {m.id!r}")
        seen.add(m.id)
    return msgs


def incoming_head(raw: bytes, what: str = "message") -> Head:
    """Validate the head of a message a caller wants written, or raise ``InvalidParams``.

    A display-capped copy is ``CONFLICT``; one over :data:`MAX_MESSAGE` is
    ``LIMIT_EXCEEDED``. The envelope already proved ``raw`` is JSON, so the rest of the
    message needs no second scan when only the head is used (a checkpoint);
    or, for a message split off its request (``host._endpoint._split``), this scan is what
    proves it: ``ParseError`` when it is not one JSON value, even past a field that failed.
    """
    if len(raw) > MAX_MESSAGE:  # stored, stamped and read alone, it would pass 64 MiB
        raise LimitExceeded(
            f"{what} holds {len(raw)} bytes, over the {MAX_MESSAGE}-byte limit of a message"
            f" (64 MiB less {MESSAGE_ROOM} bytes kept for the fields the host adds)",
            limit=MAX_MESSAGE,
        )
    try:
        head = decode(_HEAD, raw, read=True)
    except msgspec.ValidationError as exc:
        _json(raw, what)  # stopped at the bad field: the rest may still not be JSON
        raise InvalidParams(f"{what}: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ParseError(f"{what}: {exc}") from None
    if head.capped:
        raise Conflict(
            f"{what} {head.id!r} is a display-capped copy and cannot be written back",
            messageId=head.id,
        )
    return head


def _json(raw: bytes, what: str) -> None:
    """Raise ``ParseError`` unless ``raw`` is one JSON value."""
    try:
        decode(_RAW, raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ParseError(f"{what}: {exc}") from None


def parse_incoming(raw: bytes, what: str = "message") -> Message:
    """Validate a message a caller wants written (see :func:`incoming_head`)."""
    head = incoming_head(raw, what)
    try:
        fields = decode(_FIELDS, raw)
    except msgspec.ValidationError as exc:  # half a surrogate pair in a key
        raise InvalidParams(f"{what}: {exc}") from None
    return Message(head, fields)


def parse_stored(line: bytes) -> Message | None:
    """Parse a stored line; ``None`` when it is not a valid UTF-8 message (quarantine it)."""
    try:
        line.decode("utf-8")  # msgspec does not check UTF-8 inside raw values
        return Message(decode(_HEAD, line, read=True), decode(_FIELDS, line))
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None  # RecursionError: nested deeper than msgspec decodes (a hand edit)


def valid_line(line: bytes) -> bool:
    """Whether a stored line is still a JSON object in UTF-8 (a cheap check for reads)."""
    try:
        line.decode("utf-8")
        decode(_RAW, line)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return False
    return line[:1] == b"{"


def pager_json(pager: dict[str, Raw]) -> str | None:
    """Encode pager fields for the index, or ``None`` when there are none."""
    return _ENC.encode(pager).decode() if pager else None


def pager_from_json(text: str | None) -> dict[str, Raw]:
    """Decode pager fields stored by :func:`pager_json`."""
    return _FIELDS.decode(text) if text else {}


# -- display cap ------------------------------------------------------------------------

_KEEP = {"id", "role", "turnId", "status", *PAGER_KEYS}
KEEP_SHORT = 32


def display_capped(line: bytes, cap: int) -> bytes:
    """Shorten a stored line to about ``cap`` bytes and mark it ``capped: true``.

    String values outside the host-owned fields that are longer than one common length
    (the longest that keeps the line within ``cap``, found by bisection) are clipped to
    it; strings of up to :data:`KEEP_SHORT` printable ASCII characters (block types,
    names) are never clipped. Structure and keys survive, so the copy is a valid message the UI can
    render; a message made mostly of short fields may stay somewhat over ``cap``.
    """
    try:
        return _clipped(line, cap)
    except (msgspec.MsgspecError, RecursionError):
        # Numbers or nesting past what decodes: keep the host's fields, drop the rest.
        head = decode(_FIELDS, line, read=True)
        keep = {k: v for k, v in head.items() if k in _KEEP}
        keep["capped"] = Raw(b"true")
        return _ENC.encode(keep)


def _short(v: str) -> bool:
    # Printable ASCII: at most 2 bytes a character once encoded (control characters take 6).
    return len(v) <= KEEP_SHORT and v.isascii() and v.isprintable()


def _clipped(line: bytes, cap: int) -> bytes:
    value = decode(_ANY, line, read=True)  # a copy to show: a half pair shows as U+FFFD
    if not isinstance(value, dict):  # pragma: no cover - stored lines are objects
        return line

    def clip(v: Any, n: int) -> Any:
        if isinstance(v, str):
            return v[:n] + "…" if len(v) > n and not _short(v) else v
        if isinstance(v, list):
            return [clip(x, n) for x in v]
        if isinstance(v, dict):
            return {k: clip(x, n) for k, x in v.items()}
        return v

    def render(n: int) -> bytes:
        out = {k: (v if k in _KEEP else clip(v, n)) for k, v in value.items()}
        out["capped"] = True
        return _ENC.encode(out)

    lo, hi = 0, len(line)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(render(mid)) <= cap:
            lo = mid
        else:
            hi = mid - 1
    return render(lo)
