"""A call that has started runs to its end, whatever its client does (issue 33).

Client A sends a call that writes, and the disk holds it (a :class:`host.FileSystem` whose
one chosen call waits on an event, as a slow disk does); A leaves (end of input) and
:data:`host._server.CLOSE_WAIT` (shortened here) passes, so the host drops A's connection.
Client B then appends to the same session and gets it acknowledged, and the disk lets go.
What must hold, read back through the protocol, after a restart, and by ``host verify``:

- every acknowledged append is in the transcript;
- A's call, which had started (the disk was holding its write), happened whole;
- the session serves B.

Issue 33's loss: a call cancelled at ``CLOSE_WAIT`` released its session while its
thread went on; B's append went into the old file and the thread's rename then dropped
it (``updateMessage``), or the call's own undo raced the write it undid (an append cut
back, a truncation put back).

A leaves by ending its input while its answer is still being made, so the answer cannot
be written within ``CLOSE_WAIT`` either: a client that closed without reading meets the
same timeout (and this in-process edge stands for the transport only). B's append is
sent once the host has let A's connection go. A host that keeps the session held for A's
started call cannot answer it before the disk lets go, and nothing a client can see
happens meanwhile, so the test waits for B's answer at most :data:`HELD` seconds before it
lets the disk go (the host on main answers at once: its B writes into the old file).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

import host._server
from host import FileSystem
from tests.conftest import WAIT, RpcError, run_cli
from tests.host.inproc import Client, msg, open_host

HELD = 2.0
"""Seconds B's append may stay unanswered while the disk holds A's call (see above)."""
CLOSE_WAIT = 0.05
pytestmark = pytest.mark.slow  # HELD seconds each on a host that keeps the session held


class HeldDisk(FileSystem):
    """A disk whose first call ``hold`` picks, once armed, waits until ``go`` is set.

    ``entered`` is set when the held call has begun to wait; ``done`` once the work it
    belongs to has reached the disk: after the first :meth:`fsync_dir` of the transcript's
    folder or :meth:`fsync` of the transcript that follows the held call.
    """

    def __init__(self, transcript: str) -> None:
        self.transcript = transcript
        self.hold: Callable[[str, tuple[Any, ...]], bool] | None = None
        self.entered = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()

    def _maybe_hold(self, name: str, args: tuple[Any, ...]) -> None:
        if self.hold is not None and not self.entered.is_set() and self.hold(name, args):
            self.entered.set()
            self.go.wait(WAIT)

    def is_transcript(self, fd: int) -> bool:
        """Whether ``fd`` is open on the transcript (the file its path names now)."""
        try:
            return os.fstat(fd).st_ino == os.stat(self.transcript).st_ino
        except OSError:
            return False

    def copy_range(self, src: int, dst: int, offset: int, size: int) -> None:
        self._maybe_hold("copy_range", (src, dst, offset, size))
        super().copy_range(src, dst, offset, size)

    def fsync(self, fd: int) -> None:
        transcript = self.is_transcript(fd)
        self._maybe_hold("fsync", (fd,))
        super().fsync(fd)
        if transcript and self.go.is_set():
            self.done.set()

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        if self.go.is_set() and os.path.samefile(path, os.path.dirname(self.transcript)):
            self.done.set()


@asynccontextmanager
async def two_clients(data: Path, fs: FileSystem) -> AsyncIterator[tuple[Client, Client]]:
    """A host on ``data`` and two handshaken clients of it, A and B."""
    async with open_host(str(data), fs) as b:
        a = Client(b.host)
        await a.connect()
        try:
            yield a, b
        finally:
            await a.close(abandon=True)


def watch_drop(client: Client) -> asyncio.Event:
    """An event set when the host lets the client's connection go (closes or aborts it)."""
    dropped = asyncio.Event()
    edge = client.edge

    def closing(method: Callable[[], None]) -> Callable[[], None]:
        def call() -> None:
            method()
            dropped.set()

        return call

    edge.close = closing(edge.close)  # type: ignore[method-assign]
    edge.abort = closing(edge.abort)  # type: ignore[method-assign]
    return dropped


async def messages(c: Client, sid: str = "s") -> list[dict[str, Any]]:
    """Every message of the session; read again once when it was found damaged (the
    protocol's ``STORAGE_ERROR`` with ``sessionId``: rescanned, read again)."""
    try:
        page = await c("session.get", sessionId=sid)
    except RpcError as exc:
        if exc.name != "STORAGE_ERROR" or "sessionId" not in exc.data:
            raise
        page = await c("session.get", sessionId=sid)
    return list(page["messages"])


async def leave_while_held(
    a: Client, b: Client, fs: HeldDisk, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    """A sends ``method`` and the disk holds it; A leaves; once the host has let A's
    connection go, B appends ``b`` to session ``s``; then the disk lets go.

    Return B's answer, once A's call has reached the disk whole.
    """
    dropped = watch_drop(a)
    call = asyncio.ensure_future(a(method, **params))
    try:
        assert await asyncio.to_thread(fs.entered.wait, WAIT), f"{method} never reached the disk"
        leaving = asyncio.ensure_future(a.close())
        async with asyncio.timeout(WAIT):
            await dropped.wait()  # end of input, then CLOSE_WAIT: A is gone
        append = asyncio.ensure_future(
            b("session.appendMessage", sessionId="s", message=msg("b", "user", "from B"))
        )
        await asyncio.wait({append}, timeout=HELD)  # bounded: see the module docstring
    finally:
        fs.go.set()
    async with asyncio.timeout(WAIT):
        answer = await append
        await leaving
    assert await asyncio.to_thread(fs.done.wait, WAIT), f"{method} never finished on disk"
    with suppress(ConnectionError, RpcError):
        await call  # its answer, if any, could reach no one
    return answer


async def verified(data: Path) -> str:
    """``host verify``'s report; it must find no problem."""
    code, out, err = await run_cli("verify", "--data-dir", str(data))
    assert code == 0 and " 0 problem(s)" in out, out + err
    return out


async def test_a_rewrite_whose_client_left_loses_no_later_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host._server, "CLOSE_WAIT", CLOSE_WAIT)
    data = tmp_path / "data"
    fs = HeldDisk(str(data / "sessions" / "s.jsonl"))
    big = ["x" * 128 * 1024 + str(i) for i in range(8)]  # 1 MiB: a rewrite of a few ms
    async with two_clients(data, fs) as (a, b):
        await b("session.create", sessionId="s")
        for i, text in enumerate(big):
            await b("session.appendMessage", sessionId="s", message=msg(f"m{i}", content=text))
        fs.hold = lambda name, _args: name == "copy_range"  # the rewrite's copy of a range
        update = {"sessionId": "s", "message": msg("m3", content="updated")}
        answer = await leave_while_held(a, b, fs, "session.updateMessage", update)
        assert answer == {"line": 8, "appended": True}
        got = await messages(b)
        assert [m["id"] for m in got] == [*(f"m{i}" for i in range(8)), "b"], "B's append lost"
        assert got[3]["content"] == "updated", "A's started update did not happen whole"
    async with open_host(str(data)) as c:
        got = await messages(c)
        assert [m["id"] for m in got] == [*(f"m{i}" for i in range(8)), "b"], "lost at restart"
        assert got[3]["content"] == "updated"
        assert [m["content"] for m in got[:3]] == big[:3]
    await verified(data)


async def test_a_started_append_whose_client_left_happens_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host._server, "CLOSE_WAIT", CLOSE_WAIT)
    data = tmp_path / "data"
    fs = HeldDisk(str(data / "sessions" / "s.jsonl"))
    text = "y" * (3 << 19)  # 1.5 MiB: a write the host makes off its loop
    async with two_clients(data, fs) as (a, b):
        await b("session.create", sessionId="s")
        for i in range(3):
            await b("session.appendMessage", sessionId="s", message=msg(f"m{i}"))
        # its bytes are written: the fsync that makes them durable is held
        fs.hold = lambda name, args: name == "fsync" and fs.is_transcript(args[0])
        big = {"sessionId": "s", "message": msg("big", content=text)}
        answer = await leave_while_held(a, b, fs, "session.appendMessage", big)
        assert answer["appended"] is True
        want = ["m0", "m1", "m2", "big", "b"]
        got = await messages(b)
        assert [m["id"] for m in got] == want, "A's started append did not happen whole"
        assert got[3]["content"] == text
    async with open_host(str(data)) as c:
        got = await messages(c)
        assert [m["id"] for m in got] == want
        assert got[3]["content"] == text
    await verified(data)


async def test_a_started_truncation_whose_client_left_happens_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host._server, "CLOSE_WAIT", CLOSE_WAIT)
    data = tmp_path / "data"
    fs = HeldDisk(str(data / "sessions" / "s.jsonl"))
    async with two_clients(data, fs) as (a, b):
        await b("session.create", sessionId="s")
        for i in range(6):
            await b(
                "session.appendMessage", sessionId="s", message=msg(f"m{i}", content="z" * 4096)
            )
        # the cut's file work has begun: the fsync that makes it durable is held
        fs.hold = lambda name, args: name == "fsync" and fs.is_transcript(args[0])
        cut = {"sessionId": "s", "fromMessageId": "m3"}
        answer = await leave_while_held(a, b, fs, "session.truncateFrom", cut)
        assert answer["appended"] is True
        want = ["m0", "m1", "m2", "b"]
        got = await messages(b)
        assert [m["id"] for m in got] == want, "A's started cut did not happen whole"
        assert got[-1]["content"] == "from B"
    async with open_host(str(data)) as c:
        assert [m["id"] for m in await messages(c)] == want
    await verified(data)
