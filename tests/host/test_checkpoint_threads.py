"""Where a checkpoint's work runs: the loop while fsyncs are fast, a thread when they are slow.

A big snapshot on a fast disk is written (and flushed) by the loop, in a call that holds
no GIL, while its head is scanned on the scan thread. Once the moving average of durable
writes says the disk is slow, the whole replace moves to a thread, so the loop keeps
serving other sessions while it flushes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import host._turns
from host import FileSystem
from host._fs import Buffer
from host._turns import SCAN_APART
from tests.host.inproc import msg, open_host

LOOP = threading.current_thread().name  # pytest-asyncio runs the loop on this thread


class Recording(FileSystem):
    """Notes the thread of every durable write of a checkpoint's spare."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write_synced(self, fd: int, parts: Sequence[Buffer]) -> None:
        self.writes.append(threading.current_thread().name)
        super().write_synced(fd, parts)


@pytest.mark.parametrize("slow", [False, True])
async def test_a_big_checkpoint_is_flushed_on_the_loop_only_while_fsyncs_are_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool
) -> None:
    scans: list[str] = []
    real = host._turns.incoming_head

    def scan(raw: bytes, what: str = "message") -> Any:
        scans.append(threading.current_thread().name)
        return real(raw, what)

    monkeypatch.setattr(host._turns, "incoming_head", scan)
    fs = Recording()
    async with open_host(str(tmp_path / "data"), fs) as call:
        await call("session.create", sessionId="s")
        await call("session.beginTurn", sessionId="s", turnId="t")
        fsyncs = call.host.store.fsyncs
        if slow:
            fsyncs.average = 10 * fsyncs.SLOW  # as a disk taking 20 ms a flush leaves it
        big = msg("r", content="x" * (2 * SCAN_APART))
        res = await call("session.saveInflightMessage", sessionId="s", turnId="t", message=big)
        assert res == {"saved": True}
    (write,) = fs.writes
    (scanned,) = scans
    if slow:
        assert write != LOOP and scanned == LOOP  # the head first, then the replace apart
    else:
        assert write == LOOP and scanned.startswith("host-scan")
