"""NDJSON framing: split a byte stream into lines, holding at most 64 MiB of any line.

A line longer than the limit is read through to its next newline and dropped as it goes
(ADR 0216 decision 3): the reader yields :data:`TOO_LONG` for it and lives on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

from host._wire import MAX_LINE


class _TooLong:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TOO_LONG"


TOO_LONG: Final = _TooLong()
CHUNK = 1 << 20


async def read_lines(
    reader: asyncio.StreamReader, limit: int = MAX_LINE
) -> AsyncIterator[bytes | _TooLong]:
    """Yield each line (newline stripped) or ``TOO_LONG``; a last unterminated line counts."""
    buf = bytearray()
    scanned = 0  # bytes of buf already searched for a newline
    discarding = False
    while True:
        start = 0
        while True:
            nl = buf.find(b"\n", max(start, scanned))
            if nl < 0:
                break
            if discarding:
                discarding = False
                yield TOO_LONG
            elif nl - start > limit:
                yield TOO_LONG
            else:
                with memoryview(buf) as view:  # one copy of the line, not two
                    line = bytes(view[start:nl])
                yield line
            start = nl + 1
            scanned = start
        if start:
            del buf[:start]
        scanned = len(buf)
        if discarding or len(buf) > limit:
            discarding = True
            buf.clear()
            scanned = 0
        chunk = await reader.read(CHUNK)
        if not chunk:
            if discarding:
                yield TOO_LONG
            elif buf:
                yield bytes(buf)
            return
        buf += chunk
