"""Lone UTF-16 surrogates: JSON text that msgspec refuses, read as JSON.parse reads it.

A streaming reply cut in the middle of an emoji holds half a surrogate pair, and
JavaScript's ``JSON.stringify`` (well-formed since ES2019) writes it as an escape:
``"Bonjour \\ud83d"``. RFC 8259's grammar allows it, JSON.parse and Python's json read
it, and the host stores the caller's bytes; but msgspec refuses it ("Input data was
truncated"), so the host answered PARSE_ERROR with ``id: null`` (issue 26, case 13).

:func:`decode` is every decode of the host's that may meet such text (a request line, a
message, a stored line, a checkpoint). It decodes as given first, so a line without a
lone surrogate costs nothing more. When that fails and the text holds lone surrogate
escapes, each is masked with the escape of a private-use character that the text does not
use anywhere (six bytes for six: nothing moves), the copy is decoded, and the result gets
the caller's bytes back: every ``Raw`` in it is unmasked, so a message (kept as ``Raw``
all the way to the file) is stored as sent, and read back the same way. A decoded string
cannot hold half a pair and be written again (UTF-8 has no encoding for it), so where the
host keeps a string as text (a title, an id, a key of a message) it is refused as a
``ValidationError``; where it only looks (``read=True``) the half pair reads as U+FFFD.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from msgspec import Raw

T = TypeVar("T")

_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u([0-9a-fA-F]{4})")
"""A ``\\uXXXX`` escape (an even run of backslashes before it is not part of it)."""
_ANY_ESCAPE = re.compile(rb"\\u([0-9a-fA-F]{4})")
"""Those six bytes wherever they are (after an escaped backslash too): never a marker."""
_PRIVATE_UTF8 = re.compile(b"\xee[\x80-\xbf][\x80-\xbf]|\xef[\x80-\xa3][\x80-\xbf]")
"""A private-use character (U+E000-U+F8FF) written as UTF-8: never a marker either."""
_PRIVATE = range(0xE000, 0xF900)


class _Masked:
    """A text with its lone surrogate escapes masked, and the way back."""

    def __init__(self, data: bytes, lone: list[int], used: set[int]) -> None:
        out = bytearray(data)
        free = (cp for cp in _PRIVATE if cp not in used)
        back: dict[bytes, bytes] = {}  # marker escape -> the caller's escape
        marks: dict[bytes, bytes] = {}
        for at in lone:
            escape = data[at : at + 6]
            mark = marks.get(escape)
            if mark is None:
                mark = marks[escape] = b"\\u%04x" % next(free)
                back[mark] = escape
            out[at : at + 6] = mark
        self.data = bytes(out)
        self._back = back
        self._marks = re.compile(b"|".join(re.escape(m) for m in back))
        self._chars = {chr(int(m[2:], 16)) for m in back}

    @classmethod
    def of(cls, data: bytes) -> _Masked | None:
        """The masked text, or ``None`` when it holds no lone surrogate (or too many kinds)."""
        units = [(m.end() - 6, int(m.group(1), 16)) for m in _ESCAPE.finditer(data)]
        lone = []
        i = 0
        while i < len(units):
            at, unit = units[i]
            if 0xD800 <= unit < 0xDC00 and i + 1 < len(units):
                nxt, low = units[i + 1]
                if nxt == at + 6 and 0xDC00 <= low < 0xE000:  # a pair: one character
                    i += 2
                    continue
            if 0xD800 <= unit < 0xE000:
                lone.append(at)
            i += 1
        if not lone:
            return None
        used = {int(h, 16) for h in _ANY_ESCAPE.findall(data)}
        used |= {ord(c.decode()) for c in _PRIVATE_UTF8.findall(data)}
        kinds = {data[at : at + 6] for at in lone}
        if len(kinds) > len(_PRIVATE) - sum(1 for cp in used if cp in _PRIVATE):
            return None  # more spellings of half pairs than free markers: never from JS
        return cls(data, lone, used)

    def restore(self, value: Any, text: Callable[[str], str]) -> Any:
        """``value`` decoded from :attr:`data`, with the caller's bytes back in every Raw."""
        if isinstance(value, Raw):
            return Raw(self._marks.sub(lambda m: self._back[m.group()], bytes(value)))
        if isinstance(value, str):
            return text(value) if any(c in self._chars for c in value) else value
        if isinstance(value, list):
            return [self.restore(v, text) for v in value]
        if isinstance(value, dict):
            return {self.restore(k, text): self.restore(v, text) for k, v in value.items()}
        if isinstance(value, msgspec.Struct):
            fields = {f: self.restore(getattr(value, f), text) for f in value.__struct_fields__}
            return msgspec.structs.replace(value, **fields)
        return value

    def read(self, value: str) -> str:
        """A string the host only looks at: each half pair reads as U+FFFD."""
        return "".join("\ufffd" if c in self._chars else c for c in value)


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
