"""One transcript file on real disk: appends, atomic rewrites and their undo, torn tails."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from host._fs import FileSystem
from host._transcript import Transcript, iter_lines

LINES = [b'{"id":"a","role":"user"}\n', b'{"id":"b","role":"assistant"}\n', b'{"id":"c"}\n']


@pytest.fixture
def t(tmp_path: Path) -> Iterator[Transcript]:
    path = tmp_path / "s.jsonl"
    tr = Transcript.create(FileSystem(), str(path))
    tr.write(b"".join(LINES))
    tr.sync()
    yield tr
    tr.close()


def _path(t: Transcript) -> Path:
    return Path(t.path)


def test_create_makes_an_empty_private_file(tmp_path: Path) -> None:
    path = tmp_path / "new.jsonl"
    tr = Transcript.create(FileSystem(), str(path))
    try:
        assert path.read_bytes() == b""
        assert os.stat(path).st_mode & 0o777 == 0o600
        with pytest.raises(FileExistsError):
            Transcript.create(FileSystem(), str(path))
    finally:
        tr.close()


def test_reads_and_stamp_follow_appends(t: Transcript) -> None:
    size = sum(map(len, LINES))
    assert t.stamp().size == size
    assert t.read(len(LINES[0]), len(LINES[1])) == LINES[1]
    t.write(b'{"id":"d"}\n')
    assert t.stamp().size == size + 11
    assert _path(t).read_bytes().endswith(b'{"id":"d"}\n')


def test_a_prepared_file_replaces_nothing_until_installed(t: Transcript) -> None:
    path = _path(t)
    before = path.read_bytes()
    name = t.prepare([b"something else entirely\n"])
    assert path.read_bytes() == before
    assert (path.parent / name).read_bytes() == b"something else entirely\n"
    assert name.startswith("s.jsonl.") and name.endswith(".tmp")


def test_cut_removes_a_tail(t: Transcript) -> None:
    t.cut(len(LINES[0]))
    assert _path(t).read_bytes() == LINES[0]


def _lines(t: Transcript, offset: int = 0, chunk: int = 1 << 20) -> list[tuple[int, bytes, bool]]:
    return list(iter_lines(t.fs, t.fd, offset, chunk))


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
def test_iter_lines_gives_offsets_and_flags_a_torn_tail(t: Transcript, chunk: int) -> None:
    t.write(b'{"id":"d","con')
    a, b, c = (len(x) for x in LINES)
    assert _lines(t, chunk=chunk) == [
        (0, LINES[0][:-1], True),
        (a, LINES[1][:-1], True),
        (a + b, LINES[2][:-1], True),
        (a + b + c, b'{"id":"d","con', False),
    ]
    assert _lines(t, a + b, chunk) == [
        (a + b, LINES[2][:-1], True),
        (a + b + c, b'{"id":"d","con', False),
    ]


def test_iter_lines_of_whole_lines_has_no_torn_tail(t: Transcript) -> None:
    assert all(complete for _, _, complete in _lines(t, chunk=5))
    assert _lines(t, sum(map(len, LINES))) == []
    t.write(b"\n")  # an empty line is a line (and not a valid message)
    assert _lines(t)[-1] == (sum(map(len, LINES)), b"", True)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_lines_come_out_whole_whatever_the_read_size(tmp_path: Path, chunk: int) -> None:
    lines = [b"", b"a", b"bb" * 40, b"", b"ccc", b"d" * 5]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\ntorn")
    fs = FileSystem()
    fd = os.open(path, os.O_RDONLY)
    try:
        got = list(iter_lines(fs, fd, 0, chunk))
    finally:
        os.close(fd)
    offsets = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines) + 1)]
    want = [(offsets[i], x, True) for i, x in enumerate(lines)] + [(offsets[-1], b"torn", False)]
    assert got == want
