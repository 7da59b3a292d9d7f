"""A slow disk holds up only the session writing to it.

Durable writes run on the loop while fsyncs are fast (``FsyncPolicy``): a thread hop
costs as much as a fast fsync. Once the moving average says the disk is slow, they run on
a thread, so a 1 MB checkpoint stuck in its flush leaves the loop serving other sessions.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from host import FileSystem
from host._fs import Buffer
from tests.host.inproc import Client, msg, open_host


class StallingFlush(FileSystem):
    """A disk whose checkpoint flushes stall, once ``stall`` is set, until ``go``."""

    def __init__(self) -> None:
        self.stall = False
        self.entered = threading.Event()
        self.go = threading.Event()

    def write_synced(self, fd: int, parts: Sequence[Buffer]) -> None:
        if self.stall:
            self.entered.set()
            self.go.wait(5)
        super().write_synced(fd, parts)


async def test_a_checkpoint_stuck_on_a_slow_disk_holds_up_no_other_session(
    tmp_path: Path,
) -> None:
    fs = StallingFlush()
    async with open_host(str(tmp_path / "data"), fs) as call:
        for sid in ("s", "o"):
            await call("session.create", sessionId=sid)
        await call("session.beginTurn", sessionId="s", turnId="t")
        fsyncs = call.host.registry.fsyncs
        fsyncs.average = 10 * fsyncs.SLOW  # as a disk taking 20 ms a flush leaves it
        await _others_served_while_stuck(call, fs, _snapshot((1 << 20) - 100))


async def _others_served_while_stuck(call: Client, fs: StallingFlush, snap: object) -> None:
    """Save ``snap`` in session ``s`` with its flush stuck: session ``o`` is written, read
    and answered meanwhile (the loop is free), and the save ends once the flush does."""
    fs.stall = True
    save = asyncio.ensure_future(
        call("session.saveInflightMessage", sessionId="s", turnId="t", message=snap)
    )
    try:
        assert await asyncio.to_thread(fs.entered.wait, 30), "the save never flushed"
        got = await call("session.appendMessage", sessionId="o", message=msg("m", "user"))
        assert got == {"line": 0, "appended": True}
        page = await call("session.get", sessionId="o")
        assert [m["id"] for m in page["messages"]] == ["m"]
        assert not save.done()
    finally:
        fs.go.set()
    assert await save == {"saved": True}


class SlowFlush(StallingFlush):
    """A disk whose checkpoint flushes take ``delay`` seconds each (and stall as above)."""

    def __init__(self) -> None:
        super().__init__()
        self.delay = 0.0

    def write_synced(self, fd: int, parts: Sequence[Buffer]) -> None:
        time.sleep(self.delay)
        super().write_synced(fd, parts)


def _snapshot(size: int) -> dict[str, object]:
    return msg("r", content="x" * size)


async def _on_loop_after_saves(call: Client, n: int) -> int:
    """Save ``n`` snapshots of about 200 KB in session ``s``; then ``fsyncs.onLoop``."""
    for i in range(n):
        got = await call(
            "session.saveInflightMessage", sessionId="s", turnId="t", message=_snapshot(200_000 + i)
        )
        assert got == {"saved": True}
    return int((await call("host.stats"))["counters"]["fsyncs.onLoop"])


async def test_a_disk_that_turns_slow_under_big_snapshots_is_learned(tmp_path: Path) -> None:
    """A reply past 64 KiB sends only big snapshots; when the disk turns slow then, their
    own time must move the writes off the loop (else every save stalls every session)."""
    fs = SlowFlush()
    async with open_host(str(tmp_path / "data"), fs) as call:
        for sid in ("s", "o"):
            await call("session.create", sessionId=sid)
        await call("session.beginTurn", sessionId="s", turnId="t")
        fs.delay = 0.03  # every flush takes 30 ms from now on
        assert await _on_loop_after_saves(call, 3) == 0
        # longer than the spare: one synced write fills it
        await _others_served_while_stuck(call, fs, _snapshot(300_000))


async def test_a_disk_fast_again_under_big_snapshots_brings_writes_back_to_the_loop(
    tmp_path: Path,
) -> None:
    """The way back: big snapshots alone, on a disk fast again, return writes to the loop."""
    async with open_host(str(tmp_path / "data")) as call:
        await call("session.create", sessionId="s")
        await call("session.beginTurn", sessionId="s", turnId="t")
        fsyncs = call.host.registry.fsyncs
        fsyncs.SLOW = 0.05  # a loaded CI disk's fsync stays under it: "fast" here
        fsyncs.average = 10 * fsyncs.SLOW  # as a slow spell leaves it
        assert await _on_loop_after_saves(call, 60) == 1
