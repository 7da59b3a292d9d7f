"""The checkpoint's swap (``FileSystem.write_swap``) under a power cut after an earlier failure.

The swap overwrites the spare in place, which is safe only while the disk does not still
call the spare's file the checkpoint: that is, when the last exchange was followed by a
folder fsync that succeeded. Two ways it would not be: the process dies between the
exchange and the folder fsync and a restarted host saves the same turn at once (same
kernel: nothing forced the folder to disk), or the folder fsync fails after the journal
committed the exchange. A power cut during the next overwrite must still leave a whole
snapshot, the acknowledged one or a later one.

``PowerLossFileSystem`` keeps the old synced bytes of an unsynced in-place overwrite
whole; ``Strict`` tears it (new first half, old rest), as ext4 in data=ordered mode may
write some overwritten pages back and not others.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from host import FileSystem
from host._fs import Buffer
from tests.conftest import RpcError
from tests.host.inproc import Client, Crash, msg, open_host
from tests.host.powerloss import PowerLossFileSystem


class Strict(PowerLossFileSystem):
    """Tears unsynced in-place overwrites; dies or fails where a test asks."""

    crash_on_fsync_dir = False  # the process dies at the next folder fsync
    eio_after_fsync_dir = False  # the next folder fsync reaches the disk, then says EIO
    cut_after_write = False  # the power goes at the first write's end, before its fsync

    def die(self, why: str) -> None:
        self.crash_at = self.calls + 1  # this call and every one after it: nothing runs
        raise Crash(why)

    def write_all(self, fd: int, data: bytes | memoryview) -> None:
        self._tick()
        FileSystem.write_all(self, fd, data)
        if self.cut_after_write:
            self.die("power cut after a write, before its fsync")

    def write_synced(self, fd: int, parts: Sequence[Buffer]) -> None:
        if not self.cut_after_write:
            return super().write_synced(fd, parts)
        self._tick()
        FileSystem.write_all(self, fd, b"".join(parts))  # written, never flushed
        self.die("power cut after a write, before its flush")

    def fsync_dir(self, path: str) -> None:
        if self.crash_on_fsync_dir:
            self.crash_on_fsync_dir = False
            self.die("process killed before the folder fsync")
        super().fsync_dir(path)
        if self.eio_after_fsync_dir:
            self.eio_after_fsync_dir = False
            raise OSError(errno.EIO, "Input/output error (after the commit)")

    def image(self, target: str, *, torn: bool = False, index: str = "current") -> None:
        super().image(target, torn=torn, index=index)
        path_of = {}
        for folder in self.dirs:
            for name in os.listdir(folder):
                p = os.path.join(folder, name)
                if os.path.isfile(p):
                    path_of[os.stat(p).st_ino] = p
        ino_of = {uid: ino for ino, uid in self.uid.items()}
        for folder in sorted(self.dirs):
            for name, uid in self.names.get(folder, {}).items():
                ino = ino_of.get(uid)
                if ino not in path_of or name.startswith("index.sqlite3"):
                    continue
                now, synced = Path(path_of[ino]).read_bytes(), self.data.get(uid, b"")
                if now.startswith(synced):
                    continue  # unchanged, or appended to (the base model tears those)
                k = min(len(now), len(synced)) // 2
                Path(target, os.path.relpath(folder, self.root), name).write_bytes(
                    now[:k] + synced[k:]
                )


def snapshot(n: int) -> dict[str, Any]:
    return msg("r", content=f"snapshot {n} " + str(n) * 20000)


async def save(call: Client, n: int) -> Any:
    return await call("session.saveInflightMessage", sessionId="s", turnId="t", message=snapshot(n))


async def recovered(data: str) -> list[str]:
    """The reply the connect sequence promotes from ``data`` (its content)."""
    async with open_host(data) as call:
        got = await call("session.recoverInflightMessages")
        page = await call("session.get", sessionId="s")
        ids = {r["messageId"] for r in got["recovered"]}
        return [m["content"] for m in page["messages"] if m["id"] in ids]


async def streaming(data: str) -> Strict:
    async with open_host(data) as call:
        await call("session.create", sessionId="s")
        await call("session.beginTurn", sessionId="s", turnId="t", prompt=msg("u", "user"))
    return Strict(data)  # tracks from here: all of the above is durable


async def two_answered(call: Client, fs: Strict) -> None:
    """Save snapshots 1 and 2, the first ones tracked: 2 is answered, so it must survive."""
    fs.arm()
    assert await save(call, 1) == {"saved": True}
    assert await save(call, 2) == {"saved": True}


async def assert_a_whole_one_survives(fs: Strict, img: Path) -> None:
    """After the power cut, the reply promoted is snapshot 2 (answered) or a later one, whole."""
    fs.image(str(img))
    assert await recovered(str(img)) in [[snapshot(n)["content"]] for n in (2, 3, 4)]


async def test_a_save_after_a_kill_between_swap_and_folder_fsync_keeps_a_whole_one(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    fs = await streaming(data)
    async with open_host(data, fs) as call:
        await two_answered(call, fs)
        fs.crash_on_fsync_dir = True
        with pytest.raises(Crash):
            await save(call, 3)  # swapped, then the process dies
    fs.crash_at = 0  # restarted at once on the same kernel: the disk lags the names
    async with open_host(data, fs) as call:
        fs.cut_after_write = True
        with pytest.raises(Crash):
            await save(call, 4)  # the same turn's next snapshot, before the connect sequence
    await assert_a_whole_one_survives(fs, tmp_path / "img")


async def test_a_save_after_a_failed_folder_fsync_keeps_a_whole_one(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    fs = await streaming(data)
    async with open_host(data, fs) as call:
        await two_answered(call, fs)
        fs.eio_after_fsync_dir = True
        with pytest.raises(RpcError) as failed:
            await save(call, 3)  # swapped back, unsynced
        assert failed.value.name == "STORAGE_ERROR"
        fs.cut_after_write = True
        with pytest.raises(Crash):
            await save(call, 4)
    await assert_a_whole_one_survives(fs, tmp_path / "img")
