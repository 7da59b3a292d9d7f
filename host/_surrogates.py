"""Lone UTF-16 surrogates: JSON text that msgspec refuses, read as JSON.parse reads it.

A streaming reply cut in the middle of an emoji holds half a surrogate pair, and
JavaScript's ``JSON.stringify`` (well-formed since ES2019) writes it as an escape:
``"Bonjour \\ud83d"``. RFC 8259's grammar allows it, JSON.parse and Python's json read
it, and the host stores the caller's bytes; but msgspec refuses it ("Input data was
truncated"), so the host answered PARSE_ERROR with ``id: null`` (issue 26, case 13).

:func:`decode` is every decode of the host's that may meet such text (a request line, a
message, a stored line, a checkpoint). It decodes as given first, so a line without a
lone surrogate costs nothing more. When that fails and the text holds lone surrogate
escapes, each is masked (six bytes for six: nothing moves) with a character of plane 16
(private use) that the text does not hold, the copy is decoded, and the result gets the
caller's bytes back: every ``Raw`` in it is unmasked, so a message (kept as ``Raw`` all the
way to the file) is stored as sent, and read back the same way. A decoded string cannot
hold half a pair and be written again (UTF-8 has no encoding for it), so where the host
keeps a string as text (a title, an id, a key of a message) it is refused as a
``ValidationError``; where it only looks (``read=True``) the half pair reads as U+FFFD.

The way round costs a few scans at ``bytes.find``'s and ``bytes.replace``'s speed and a
Python step per ``\\u`` escape, at most :data:`MAX_ESCAPES` of them, whatever a client sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from msgspec import Raw

T = TypeVar("T")

MAX_ESCAPES = 10_000
"""``\\uXXXX`` escapes a line may hold for its lone surrogates to be read (JSON.stringify
escapes only those and control characters): past it the line is not JSON to the host."""
_FILL = b"__"
_HEX = b"0123456789abcdefABCDEF"
_PLANE_16 = 0x100000  # U+100000-U+10FFFD: private use, four bytes of UTF-8 (+ _FILL: six)


class _Masked:
    """A text with its lone surrogate escapes masked, and the way back."""

    def __init__(self, data: bytes, lone: list[int]) -> None:
        out = bytearray(data)
        marks: dict[bytes, bytes] = {}  # the caller's escape -> its mask
        for at in lone:
            escape = data[at : at + 6]
            mark = marks.get(escape)
            if mark is None:
                mark = marks[escape] = _mask(len(marks))
            out[at : at + 6] = mark
        self.data = out  # decoded as it is: no copy of a 64 MiB line more
        self._back = {mark: escape for escape, mark in marks.items()}
        self._texts = [mark.decode() for mark in self._back]

    @classmethod
    def of(cls, data: bytes) -> _Masked | None:
        """The masked text, or ``None`` when it holds no lone surrogate, or too many escapes
        (:data:`MAX_ESCAPES`), or holds a mask itself (a plane-16 character: never JS's)."""
        if data.find(b"\xf4") >= 0:  # a plane-16 character: masks could be mistaken
            return None
        # An escaped backslash, paired from the left as JSON reads it, is no escape's start:
        # with those blanked (same length), every backslash left starts an escape.
        plain = data.replace(b"\\\\", _FILL)
        units: list[tuple[int, int]] = []
        at, seen = plain.find(b"\\u"), 0
        while at >= 0:
            seen += 1
            digits = plain[at + 2 : at + 6]
            if seen > MAX_ESCAPES or len(digits) < 4 or digits.strip(_HEX):
                return None  # too many escapes to be JSON.stringify's, or not JSON at all
            unit = int(digits, 16)
            if 0xD800 <= unit < 0xE000:
                units.append((at, unit))
            at = plain.find(b"\\u", at + 6)
        lone = _lone(units)
        return cls(data, lone) if lone else None

    def restore(self, value: Any, text: Callable[[str], str]) -> Any:
        """``value`` decoded from :attr:`data`, with the caller's bytes back in every Raw."""
        if isinstance(value, Raw):
            return Raw(self._unmask(bytes(value)))
        if isinstance(value, str):
            return text(value) if any(t in value for t in self._texts) else value
        if isinstance(value, list):
            return [self.restore(v, text) for v in value]
        if isinstance(value, dict):
            return {self.restore(k, text): self.restore(v, text) for k, v in value.items()}
        if isinstance(value, msgspec.Struct):
            fields = {f: self.restore(getattr(value, f), text) for f in value.__struct_fields__}
            return msgspec.structs.replace(value, **fields)
        return value

    def _unmask(self, data: bytes) -> bytes:
        """``data`` with each mask (the only ``\xf4`` bytes in it) back as the caller's escape:
        split at ``memchr``'s speed, a step per mask."""
        parts = data.split(b"\xf4")
        out = [parts[0]]
        for part in parts[1:]:
            out += (self._back[b"\xf4" + part[:5]], part[5:])
        return b"".join(out)

    def read(self, value: str) -> str:
        """A string the host only looks at: each half pair reads as U+FFFD."""
        for t in self._texts:
            value = value.replace(t, "\ufffd")
        return value


def _mask(n: int) -> bytes:
    return chr(_PLANE_16 + n).encode() + _FILL


def _lone(units: list[tuple[int, int]]) -> list[int]:
    """Offsets of the escapes of ``units`` (offset, code unit; in order) that are no pair."""
    lone = []
    i = 0
    while i < len(units):
        at, unit = units[i]
        if unit < 0xDC00 and i + 1 < len(units):
            nxt, low = units[i + 1]
            if nxt == at + 6 and low >= 0xDC00:  # a high half, then a low one: a character
                i += 2
                continue
        lone.append(at)
        i += 1
    return lone


def _refuse(value: str) -> str:
    raise msgspec.ValidationError(
        "a lone UTF-16 surrogate escape (half an emoji) is kept only inside a message's"
        " values, not in a string the host keeps as text (a title, an id, a key)"
    )


def decode(
    decoder: msgspec.json.Decoder[T], data: bytes | memoryview | Raw, *, read: bool = False
) -> T:
    """``decoder.decode(data)``, letting lone UTF-16 surrogate escapes through.

    Raises what the decode raises: ``msgspec.DecodeError`` for text that is not JSON even
    so, ``msgspec.ValidationError`` for one of the wrong shape, or for a half pair in a
    string the host would keep; with ``read`` (strings it only looks at) that is U+FFFD.
    """
    try:
        return decoder.decode(data)
    except msgspec.DecodeError:
        masked = _Masked.of(bytes(data))
        if masked is None:
            raise
    out = decoder.decode(masked.data)
    restored: T = masked.restore(out, masked.read if read else _refuse)
    return restored
