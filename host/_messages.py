"""Messages as opaque bytes: read the few fields the host owns, keep the rest verbatim.

A message is decoded twice, both cheaply: once into :class:`Head` (the fields the host
reads, validated) and once into ``dict[str, Raw]`` so that every value the caller sent is
written back as the caller's own bytes. Only the host-owned keys are ever replaced.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from host._errors import Conflict, InvalidParams, LimitExceeded, ParseError
from host._surrogates import decode
from host._wire import ENCODER, MAX_MESSAGE, MESSAGE_ROOM, Id

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
        fields["status"] = Raw(ENCODER.encode(status))
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
            fields["turnId"] = Raw(ENCODER.encode(turn_id))
        fields.update(pager)
        return ENCODER.encode(fields)


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
    ``LIMIT_EXCEEDED``. The request's decode already proved ``raw`` is JSON, so the rest
    of the message needs no second scan when only the head is used (a checkpoint).
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
        raise InvalidParams(f"{what}: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ParseError(f"{what}: {exc}") from None
    if head.capped:
        raise Conflict(
            f"{what} {head.id!r} is a display-capped copy and cannot be written back",
            messageId=head.id,
        )
    return head


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


def valid_line(line: bytes | memoryview, *, utf8: bool = False) -> bool:
    """Whether a stored line is still a JSON object in UTF-8 (a cheap check for reads).

    ``utf8``: the caller knows it is (an ASCII read): no decode, which copies the line.
    """
    try:
        if not utf8:
            str(line, "utf-8")
        decode(_RAW, line)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return False
    return line[:1] == b"{"


def pager_json(pager: dict[str, Raw]) -> str | None:
    """Encode pager fields for the index, or ``None`` when there are none."""
    return ENCODER.encode(pager).decode() if pager else None


def pager_from_json(text: str | None) -> dict[str, Raw]:
    """Decode pager fields stored by :func:`pager_json`."""
    return _FIELDS.decode(text) if text else {}


# -- display cap ------------------------------------------------------------------------

_KEEP = {"id", "role", "turnId", "status", *PAGER_KEYS}
_KEEP_KEYS = {ENCODER.encode(k) for k in _KEEP}  # as stored: the host encodes every key itself
_CAPPED_KEY = b'"capped"'
KEEP_SHORT = 32
CAP_WORK = 2_000
"""The most JSON values (and escaped quotes) a capped copy looks at: a bound on its work
whatever the line holds, so a capped read of 25 MB of tiny strings costs what one of a
short message does (a string's body is skipped at ``bytes.find`` speed, not looked at)."""
_STR = msgspec.json.Decoder(str)
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_SPACE = re.compile(rb"[ \t\r\n]*")
_WORDS = (b"true", b"false", b"null")
_OPEN, _CLOSE, _FIXED, _LONG, _PIN = range(5)  # the kinds of a walk's events
_FIRST, _NEXT, _AFTER = range(3)  # after an opening bracket, a comma, a value


class _Event(NamedTuple):
    """One step of a line's walk: a value (with its key in an object) or a closing bracket.

    ``start:end`` is the value's bytes; for a ``_LONG`` string, the bytes between its
    quotes. ``key`` is the member's key with its quotes and colon, or empty.
    """

    kind: int
    depth: int  # of the container it is in (1: the message's own members)
    key: bytes
    start: int
    end: int


class _Walk:
    """A stored line's values in order, the first :data:`CAP_WORK` of them at most.

    ``ValueError`` when the bytes walked are not a JSON object; what is past the walk's
    end, and the inside of strings, is left for the final check of the copy.
    """

    def __init__(self, line: bytes, room: int) -> None:
        self.line = line
        self.room = room  # the walk stops once the caller's values need more, at their least
        self.least = 0
        self.events: list[_Event] = []
        self.complete = False  # the walk reached the object's end
        self.work = 0
        self._walk()

    def _walk(self) -> None:
        line = self.line
        i = self._space(0)
        if line[i : i + 1] != b"{":
            raise ValueError("not a JSON object")
        self.events.append(_Event(_OPEN, 0, b"", i, i + 1))
        closers = [b"}"]
        i, state = i + 1, _FIRST
        while closers:
            if self.work >= CAP_WORK or self.least > self.room:
                return
            self.work += 1
            i = self._space(i)
            c = line[i : i + 1]
            if state != _NEXT and c == closers[-1]:
                self.events.append(_Event(_CLOSE, len(closers), b"", i, i + 1))
                closers.pop()
                i, state = i + 1, _AFTER
            elif state == _AFTER:
                if c != b",":
                    raise ValueError(f"expected , at byte {i}")
                i, state = i + 1, _NEXT
            else:
                i, opened = self._member(i, closers)
                if i < 0:
                    return  # past the walk's bound inside a string
                state = _FIRST if opened else _AFTER
        if self._space(i) != len(line):
            raise ValueError("bytes after the object")
        self.complete = True

    def _member(self, i: int, closers: list[bytes]) -> tuple[int, bool]:
        """Walk one value (and its key, in an object) at ``i``; return where it ends (-1:
        the walk's bound came first) and whether it opened an array or object."""
        line = self.line
        key = b""
        if closers[-1] == b"}":
            end = self._string_end(i)
            if end < 0:
                return -1, False
            colon = self._space(end)
            if line[colon : colon + 1] != b":":
                raise ValueError(f"expected a key at byte {i}")
            key = line[i:end] + b":"
            i = self._space(colon + 1)
        depth = len(closers)
        c = line[i : i + 1]
        if c in (b"{", b"["):
            self._add(_Event(_OPEN, depth, key, i, i + 1))
            self.least += 1  # its closer
            closers.append(b"}" if c == b"{" else b"]")
            return i + 1, True
        if c == b'"':
            end = self._string_end(i)
            if end < 0:  # a string longer than the walk looks: cut anyway
                self._add(_Event(_LONG, depth, key, i + 1, len(line)))
                return -1, False
            kind = self._kind(depth, key, i, end)
            inner = kind == _LONG
            self._add(_Event(kind, depth, key, i + inner, end - inner))
            return end, False
        m = _NUMBER.match(line, i)
        end = m.end() if m else i + next((len(w) for w in _WORDS if line.startswith(w, i)), -i - 1)
        if end <= i:
            raise ValueError(f"expected a value at byte {i}")
        pin = depth == 1 and key[:-1] in _KEEP_KEYS
        self._add(_Event(_PIN if pin else _FIXED, depth, key, i, end))
        return end, False

    def _add(self, e: _Event) -> None:
        if e.depth == 1 and e.key[:-1] == _CAPPED_KEY:
            return  # the copy says capped itself
        self.events.append(e)
        if e.kind != _PIN:  # the host's fields are always kept: they do not count
            size = e.end - e.start
            self.least += 1 + len(e.key) + (2 + min(size, 3) if e.kind == _LONG else size)

    def _space(self, i: int) -> int:
        if self.line[i : i + 1] in (b" ", b"\t", b"\r", b"\n"):
            m = _SPACE.match(self.line, i)
            assert m is not None
            return m.end()
        return i

    def _string_end(self, i: int) -> int:
        """The index past the string that opens at ``i``; -1 past the walk's bound."""
        line = self.line
        if line[i : i + 1] != b'"':
            return len(line) + 1  # not a string: the caller's check fails
        j = line.find(b'"', i + 1)
        while j >= 0:
            k = j - 1
            while line[k] == 0x5C:  # a backslash: the quote may be escaped
                k -= 1
                self.work += 1
                if self.work >= CAP_WORK:
                    return -1
            if (j - 1 - k) % 2 == 0:
                return j + 1
            self.work += 1
            if self.work >= CAP_WORK:
                return -1
            j = line.find(b'"', j + 1)
        raise ValueError(f"string at byte {i} never ends")

    def _kind(self, depth: int, key: bytes, start: int, end: int) -> int:
        """A string is pinned (a host-owned member), short (kept whole) or long."""
        if depth == 1 and key[:-1] in _KEEP_KEYS:
            return _PIN
        if end - start > 2 * KEEP_SHORT + 2:  # more than 32 characters, however escaped
            return _LONG
        try:
            text = decode(_STR, self.line[start:end], read=True)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ValueError(f"bad string at byte {start}") from None
        return _FIXED if _short(text) else _LONG


def display_capped(line: bytes, cap: int, host_fields: dict[str, bytes] | None = None) -> bytes:
    """Shorten a stored line to about ``cap`` bytes and mark it ``capped: true``.

    String values outside the host-owned fields that are longer than one common length
    (the longest that keeps the line within ``cap``, found by bisection) are cut to it,
    keeping the caller's bytes up to the cut, with ``"…"`` appended; strings of up to
    :data:`KEEP_SHORT` printable ASCII characters (block types, names) are never cut.
    Keys, numbers and the structure survive while they fit: past the cap, or past the
    first :data:`CAP_WORK` values, the rest of the message is left out (open arrays and
    objects closed there), and the host-owned fields are kept, taken from ``host_fields``
    (the index's copy) when the walk did not reach them. The copy is a valid message the
    UI can render; its cost follows ``cap`` and :data:`CAP_WORK`, not the line.

    ``ValueError`` when the line is not a JSON object (damaged on disk).
    """
    try:
        walk = _Walk(line, cap)
        out = _render(walk, cap, host_fields or {})
    except (ValueError, IndexError):
        out = None
    if out is None or not valid_line(out):
        if not valid_line(line):
            raise ValueError("the stored line is not a JSON object")
        out = _only_host_fields(line, host_fields or {})  # JSON this walk does not read
    return out


def _render(walk: _Walk, cap: int, host_fields: dict[str, bytes]) -> bytes:
    events, line = walk.events, walk.line
    seen = {e.key[:-1] for e in events if e.kind == _PIN}
    extra = (
        []
        if walk.complete
        else [
            ENCODER.encode(k) + b":" + v
            for k, v in host_fields.items()
            if ENCODER.encode(k) not in seen
        ]
    )
    k = _cut(events, cap - sum(1 + len(m) for m in extra))
    fixed = len(_emit(line, events, k, None, extra))  # every long string as ""
    longs = sorted(e.end - e.start for e in events[:k] if e.kind == _LONG)
    lo, hi = 0, max(longs, default=0)
    while lo < hi:  # the longest common length that fits
        mid = (lo + hi + 1) // 2
        if fixed + _grow(longs, mid) <= cap:
            lo = mid
        else:
            hi = mid - 1
    return _emit(line, events, k, lo, extra)


def _grow(longs: list[int], n: int) -> int:
    """The bytes inside the long strings' quotes when each over ``n + 3`` is cut to ``n``
    and "…" (``longs`` sorted)."""
    over = bisect.bisect_right(longs, n + 3)
    return sum(longs[:over]) + (len(longs) - over) * (n + 3)


def _cut(events: list[_Event], room: int) -> int:
    """How many events the copy keeps: all when they fit with every long string at its
    shortest ("…"), else the most that do (at least the opening brace)."""
    pins = sum(1 + len(e.key) + e.end - e.start for e in events if e.kind == _PIN)
    counts = [0]  # values written in each open container
    body = 1  # "{"
    best = 1
    for k, e in enumerate(events[1:], 2):
        if e.kind == _CLOSE:
            if len(counts) == 1:
                break  # the message's own end
            counts.pop()
            body += 1
        else:
            body += (1 if counts[-1] else 0) + len(e.key)
            counts[-1] += 1
            if e.kind == _LONG:
                body += 2 + min(e.end - e.start, 3)
            elif e.kind == _OPEN:
                body += 1
                counts.append(0)
            else:
                body += e.end - e.start
            if e.kind == _PIN:
                pins -= 1 + len(e.key) + e.end - e.start
        # what is open gets closed; the pinned members past the cut, then ,"capped":true}
        if body + len(counts) - 1 + pins + len(b',"capped":true}') > room:
            break
        best = k
    return best


def _emit(line: bytes, events: list[_Event], k: int, n: int | None, extra: list[bytes]) -> bytes:
    """The copy: the first ``k`` events, long strings cut to ``n`` bytes (``None``: empty),
    what is open closed, the pinned members past ``k`` and ``extra``, then ``"capped"``."""
    out: list[bytes] = []
    closers: list[bytes] = []
    count: list[int] = []

    def member(key: bytes) -> None:
        if count[-1]:
            out.append(b",")
        count[-1] += 1
        out.append(key)

    for e in events[:k]:
        if e.kind == _CLOSE:
            if len(closers) == 1:
                break  # the message's own end: "capped" goes in first
            out.append(closers.pop())
            count.pop()
            continue
        if closers:
            member(e.key)
        if e.kind == _OPEN:
            out.append(line[e.start : e.end])
            closers.append(b"}" if line[e.start] == 0x7B else b"]")
            count.append(0)
        elif e.kind == _LONG:
            out.append(b'""' if n is None else _cut_string(line, e.start, e.end, n))
        else:
            out.append(line[e.start : e.end])
    while len(closers) > 1:
        out.append(closers.pop())
        count.pop()
    for e in events[k:]:
        if e.kind == _PIN:
            member(e.key)
            out.append(line[e.start : e.end])
    for m in extra:
        member(m)
    member(b'"capped":true}')
    return b"".join(out)


def _cut_string(line: bytes, start: int, end: int, n: int) -> bytes:
    """A long string, cut to at most ``n`` bytes with "…" when longer than ``n + 3``."""
    if end - start <= n + 3:
        return line[start - 1 : end + 1]
    for cut in range(start + n, max(start, start + n - 16) - 1, -1):
        piece = b'"' + line[start:cut] + b'"'
        if _splits_pair(piece):
            continue
        try:
            # not inside an escape or a UTF-8 sequence (a lone half of a surrogate pair, as
            # JSON.stringify writes one, is the caller's: kept)
            decode(_STR, piece, read=True)
        except msgspec.DecodeError:
            continue
        return piece[:-1] + "…".encode() + b'"'
    raise ValueError("no place to cut a string")


_HIGH_HALF = re.compile(rb"(\\+)u[dD][89abAB][0-9a-fA-F]{2}\"$")


def _splits_pair(piece: bytes) -> bool:
    """Whether a cut string ends with the first half of a surrogate pair's escape."""
    m = _HIGH_HALF.search(piece)
    return m is not None and len(m.group(1)) % 2 == 1  # an escape, not an escaped backslash


def _only_host_fields(line: bytes, host_fields: dict[str, bytes]) -> bytes:
    """The host-owned members alone, marked capped (a line this module cannot walk)."""
    try:
        fields = decode(_FIELDS, line, read=True)
        keep = {k: v for k, v in fields.items() if k in _KEEP}
    except (msgspec.MsgspecError, RecursionError):
        keep = {k: Raw(v) for k, v in host_fields.items()}
    keep["capped"] = Raw(b"true")
    return ENCODER.encode(keep)


def _short(v: str) -> bool:
    # Printable ASCII: at most 2 bytes a character once encoded (control characters take 6).
    return len(v) <= KEEP_SHORT and v.isascii() and v.isprintable()
