"""``FileSystem.write_swap``: the checkpoint's replace, with its temp file kept between calls.

Real files under ``tmp_path``; failures come from a subclass at the seam, as a full disk
or a kernel without ``RENAME_EXCHANGE`` would give them.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from host import FileSystem
from host._fs import Buffer, read_whole


def swap(fs: FileSystem, folder: Path, data: bytes) -> None:
    fs.write_swap(str(folder / "cp.json"), str(folder / "cp.spare"), [data])


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_old_file_becomes_the_spare_and_is_overwritten_whole(tmp_path: Path) -> None:
    fs = FileSystem()
    swap(fs, tmp_path, b"x" * 1000)
    assert names(tmp_path) == ["cp.json"]  # the first: the spare was renamed in
    swap(fs, tmp_path, b"second")
    assert (tmp_path / "cp.json").read_bytes() == b"second"
    assert (tmp_path / "cp.spare").read_bytes() == b"x" * 1000
    spare_inode = (tmp_path / "cp.spare").stat().st_ino
    swap(fs, tmp_path, b"third")  # shorter than the spare it overwrites
    assert (tmp_path / "cp.json").read_bytes() == b"third"
    assert (tmp_path / "cp.json").stat().st_ino == spare_inode  # reused, not a new file
    assert (tmp_path / "cp.spare").read_bytes() == b"second"
    assert names(tmp_path) == ["cp.json", "cp.spare"]


class NoExchange(FileSystem):
    """A kernel, file system or seccomp filter without RENAME_EXCHANGE."""

    def __init__(self, code: int) -> None:
        self.code = code

    def exchange(self, a: str, b: str) -> None:
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM])
def test_without_the_exchange_the_spare_is_renamed_over_the_file(tmp_path: Path, code: int) -> None:
    fs = NoExchange(code)
    for data in (b"one", b"two", b"three"):
        swap(fs, tmp_path, data)
        assert (tmp_path / "cp.json").read_bytes() == data
        assert names(tmp_path) == ["cp.json"]


def test_a_file_a_reader_holds_is_never_overwritten_in_place(tmp_path: Path) -> None:
    """A reader beside the host (``read_whole``, as ``hostview inspect``) sees a whole file."""
    fs = FileSystem()
    swap(fs, tmp_path, b"one")
    swap(fs, tmp_path, b"two")
    with open(tmp_path / "cp.json", "rb") as reader:
        fcntl.flock(reader.fileno(), fcntl.LOCK_SH)  # what read_whole takes
        swap(fs, tmp_path, b"three")  # the reader's file becomes the spare...
        swap(fs, tmp_path, b"four")  # ...and would be overwritten here
        assert reader.read() == b"two"
    assert (tmp_path / "cp.json").read_bytes() == b"four"
    assert read_whole(str(tmp_path / "cp.json")) == b"four"
    swap(fs, tmp_path, b"five")  # no reader now: the spare is reused again
    assert (tmp_path / "cp.json").read_bytes() == b"five"


class FailingFolderSync(FileSystem):
    """A folder fsync that fails with EIO once armed."""

    armed = False

    def fsync_dir(self, path: str) -> None:
        if self.armed:
            raise OSError(errno.EIO, "Input/output error")
        super().fsync_dir(path)


def test_a_failed_folder_fsync_swaps_the_old_file_back(tmp_path: Path) -> None:
    fs = FailingFolderSync()
    swap(fs, tmp_path, b"one")
    swap(fs, tmp_path, b"two")
    fs.armed = True
    with pytest.raises(OSError) as err:
        swap(fs, tmp_path, b"three")
    assert err.value.errno == errno.EIO
    assert (tmp_path / "cp.json").read_bytes() == b"two"  # the failed replace changed nothing
    # The disk may still call the spare's file the checkpoint: it is never reused in place.
    assert names(tmp_path) == ["cp.json"]


class FailingFsync(FileSystem):
    """A file fsync, and a synced write, that fail with ENOSPC."""

    def fsync(self, fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def write_synced(self, fd: int, parts: Sequence[Buffer]) -> None:
        os.pwritev(fd, parts, 0)  # written, then the flush finds no room for it
        raise OSError(errno.ENOSPC, "No space left on device")


# Longer than the spare: one synced write; shorter: a write, a cut and an fsync.
@pytest.mark.parametrize("data", [b"three" * 1000, b"3"])
def test_a_failed_write_of_the_spare_leaves_the_file_and_frees_the_spare(
    tmp_path: Path, data: bytes
) -> None:
    swap(FileSystem(), tmp_path, b"one")
    swap(FileSystem(), tmp_path, b"two")
    with pytest.raises(OSError):
        swap(FailingFsync(), tmp_path, data)
    assert (tmp_path / "cp.json").read_bytes() == b"two"
    assert names(tmp_path) == ["cp.json"]  # on a full disk its blocks are given back
