"""NDJSON framing: lines out of a byte stream, at most ``limit`` bytes of any line held."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from host._framing import CHUNK, TOO_LONG, read_lines


class Chunks:
    """The transport edge: a reader that returns exactly the chunks it was given."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = [c for c in chunks if c]
        self.reads = 0

    async def read(self, n: int) -> bytes:
        assert n > 0
        self.reads += 1
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        assert len(chunk) <= n
        return chunk


async def _collect(reader: object, limit: int) -> list[object]:
    return [line async for line in read_lines(reader, limit)]  # type: ignore[arg-type]


def _stream_reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=2 * CHUNK)
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_lines_split_across_real_stream_reads() -> None:
    # 300,000-byte lines: the host reads 1 MiB at a time, so lines straddle the reads.
    lines = [bytes([65 + i]) * 300_000 for i in range(9)]
    data = b"\n".join(lines) + b"\n"
    assert len(data) > 2 * CHUNK
    assert await _collect(_stream_reader(data), limit=1 << 26) == lines


async def test_lines_split_at_every_possible_point() -> None:
    data = b'{"a":1}\n\n{"b":2}\r\nlast'
    expected = [b'{"a":1}', b"", b'{"b":2}\r', b"last"]
    for cut in range(len(data) + 1):
        got = await _collect(Chunks([data[:cut], data[cut:]]), limit=100)
        assert got == expected, cut
    one_by_one = await _collect(Chunks([data[i : i + 1] for i in range(len(data))]), limit=100)
    assert one_by_one == expected


async def test_a_line_over_the_limit_is_read_through_and_the_next_is_served() -> None:
    chunks = [b"short\n", b"x" * 7, b"x" * 7, b"x" * 7, b"\nok\n", b"y" * 11, b"\n", b"z\n"]
    got = await _collect(Chunks(chunks), limit=10)
    assert got == [b"short", TOO_LONG, b"ok", TOO_LONG, b"z"]


async def test_the_limit_is_inclusive() -> None:
    got = await _collect(Chunks([b"x" * 10 + b"\n" + b"y" * 11 + b"\n"]), limit=10)
    assert got == [b"x" * 10, TOO_LONG]
    got = await _collect(Chunks([b"x" * 5, b"x" * 5, b"\n", b"y" * 6, b"y" * 5, b"\n"]), limit=10)
    assert got == [b"x" * 10, TOO_LONG]


async def test_an_over_limit_line_spanning_many_reads_counts_once() -> None:
    chunks = [b"a" * 4] * 1000 + [b"\n", b"b\n"]
    reader = Chunks(chunks)
    assert await _collect(reader, limit=16) == [TOO_LONG, b"b"]
    assert reader.reads == len(chunks) + 1  # read through to the end, then end of input


async def test_the_last_unterminated_line_counts() -> None:
    assert await _collect(Chunks([b"a\nb", b"c"]), limit=10) == [b"a", b"bc"]
    assert await _collect(Chunks([b"a\n", b"z" * 30]), limit=10) == [b"a", TOO_LONG]
    assert await _collect(Chunks([b"a\n"]), limit=10) == [b"a"]
    assert await _collect(Chunks([]), limit=10) == []
    assert await _collect(_stream_reader(b"\n"), limit=10) == [b""]


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12),
    terminated=st.booleans(),
    limit=st.integers(min_value=1, max_value=30),
)
def test_any_chunking_gives_the_same_lines(
    lines: list[bytes], cuts: list[int], terminated: bool, limit: int
) -> None:
    data = b"\n".join(lines) + (b"\n" if terminated and lines else b"")
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    expected: list[object] = [line if len(line) <= limit else TOO_LONG for line in lines]
    if lines and not terminated and lines[-1] == b"":
        expected.pop()  # "a\n" then nothing: no last line
    got = asyncio.run(_collect(Chunks(chunks), limit))
    assert got == expected
