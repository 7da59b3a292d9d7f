"""Helpers for the producer-side tests (issue 5).

The real pieces (journal files under ``tmp_path``, ``python -m host serve`` spawned by
:class:`~outbox.HostClient`) are used wherever the outcome depends on them. Fakes stand
only at the transport edge: :class:`FakeHost` answers like a host that hangs, fails N
times or blocks a call until the test releases it, and :class:`FakeClock` is a clock the
test advances by hand, so throttling is tested without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec

from outbox import HostClient, HostGone, Outbox, RemoteError
from outbox._driver import TurnDriver
from tests.conftest import REPO

WAIT = 20.0  # the bound of every wait in these tests (pytest-timeout is the outer guard)
CAPTURES = REPO / "tests" / "fixtures" / "pi-rpc"  # pi 0.73.1's own stdout (README there)
FAKE_PI = REPO / "tests" / "outbox" / "fake_pi.py"
CODES = {"NOT_FOUND": -32004, "STORAGE_ERROR": -32007, "PARSE_ERROR": -32700}


async def until(cond: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    """Poll ``cond`` (bounded) until it holds; fail saying ``what`` never happened."""
    try:
        async with asyncio.timeout(timeout):
            spins = 0
            while not cond():
                spins += 1
                await asyncio.sleep(0 if spins < 50 else 0.005)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def remote_error(name: str) -> RemoteError:
    """The error a host answers with for the protocol error ``name``."""
    return RemoteError({"code": CODES[name], "message": name.lower(), "data": {"code": name}})


def text(message: dict[str, Any]) -> str:
    """The content of a message as stored (string content only, as the agent sends it)."""
    content = message.get("content")
    return content if isinstance(content, str) else ""


@contextlib.asynccontextmanager
async def spawned(data_dir: Path, **kw: Any) -> AsyncIterator[HostClient]:
    """A real host spawned by :meth:`HostClient.spawn`, handshaken; killed if left running."""
    client = await HostClient.spawn(str(data_dir), log_path=str(data_dir) + ".log", **kw)
    try:
        await client.handshake(timeout=WAIT)  # a start, not a call: not the calls' deadline
        yield client
    finally:
        if not client.gone.is_set() and client.proc is not None:
            client.kill()
        await client.close()


async def stored(client: HostClient, session_id: str) -> list[dict[str, Any]]:
    """Every message of a session as a fresh ``session.get`` returns it."""
    page = await client.call("session.get", {"sessionId": session_id})
    return list(page["messages"])


async def stored_ids(client: HostClient, session_id: str) -> list[str]:
    return [m["id"] for m in await stored(client, session_id)]


async def python(*args: str, **kw: Any) -> asyncio.subprocess.Process:
    """Start ``python ARGS`` in the repository with stdout piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        **kw,
    )


def capture(
    folder: Path, name: str, source: str, edit: Callable[[list[str]], list[str]] = list
) -> Path:
    """A copy of pi's capture ``source`` as ``folder/name`` for ``fake_pi.py``; ``edit`` may
    change its lines (pi's stdout), whose timeline stays the capture's. Returns its stem."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = (CAPTURES / f"{source}.jsonl").read_text().splitlines()
    (folder / f"{name}.jsonl").write_text("".join(f"{line}\n" for line in edit(lines)))
    (folder / f"{name}.timeline.txt").write_text((CAPTURES / f"{source}.timeline.txt").read_text())
    return folder / name


async def drive_pi(data: Path, fixture: str, *args: str, **kw: Any) -> asyncio.subprocess.Process:
    """``python -m outbox drive --agent pi --json`` on ``data``, pi being ``fake_pi.py``
    playing ``fixture`` (``{session}`` in it: each session its own capture)."""
    pi = shlex.join([sys.executable, str(FAKE_PI), "--fixture", fixture, "--mode", "rpc"])
    return await python(
        "-m",
        "outbox",
        "drive",
        "--agent",
        "pi",
        "--pi-command",
        pi,
        "--json",
        "--data-dir",
        str(data),
        *args,
        start_new_session=True,
        **kw,
    )


async def finished(proc: asyncio.subprocess.Process) -> tuple[int, list[dict[str, Any]], str]:
    """Wait (bounded) for a ``drive`` started with ``start_new_session`` to end: its exit
    code, the facts it printed, its stderr.

    One that has not ended in :data:`WAIT` is killed with its group (its host, its pis),
    and the test fails, saying what it had printed.
    """
    talk = asyncio.ensure_future(proc.communicate())
    done, _ = await asyncio.wait([talk], timeout=WAIT)
    if not done:
        assert os.getpgid(proc.pid) == proc.pid, "drive in a group of its own"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = await talk
        raise AssertionError(
            f"drive did not end within {WAIT:.0f} s; its stderr ends:\n{err.decode()[-2000:]}"
        )
    out, err = talk.result()
    facts = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    assert proc.returncode is not None
    return proc.returncode, facts, err.decode(errors="replace")


async def reap(proc: asyncio.subprocess.Process) -> str:
    """Wait (bounded) for a process that was killed or is ending; return its stderr."""
    async with asyncio.timeout(WAIT):
        _, err = await proc.communicate()
    return err.decode(errors="replace")


def host_lock_free(host_dir: Path) -> bool:
    """Whether no process holds the host data dir's lock (a killed host is really gone)."""
    try:
        fd = os.open(host_dir / "host.lock", os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock we may have taken
    return True


async def kill_group(proc: asyncio.subprocess.Process, host_dir: Path) -> str:
    """SIGKILL a process started with ``start_new_session`` and its host child; reap it.

    Returns what the process had written on stdout before it died.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    async with asyncio.timeout(WAIT):
        out, _ = await proc.communicate()
    await until(lambda: host_lock_free(host_dir), "the killed host to release its data dir")
    return out.decode()


class FakeClock:
    """A clock that moves only when the test calls :meth:`advance`."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleepers: list[tuple[float, asyncio.Event]] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        entry = (self.t + seconds, asyncio.Event())
        self.sleepers.append(entry)
        try:
            await entry[1].wait()
        finally:
            self.sleepers.remove(entry)

    def advance(self, seconds: float) -> int:
        """Move time on and wake every sleeper whose time has come; return how many."""
        self.t += seconds
        woken = 0
        for due, event in self.sleepers:
            if due <= self.t and not event.is_set():
                event.set()
                woken += 1
        return woken

    def waiting(self) -> int:
        """How many sleepers wait for a time still to come (woken ones not counted)."""
        return sum(1 for _, event in self.sleepers if not event.is_set())

    def settled(self) -> bool:
        """Whether every sleeper that was woken has resumed."""
        return all(not event.is_set() for _, event in self.sleepers)


class FakeHost:
    """A HostClient-like edge: records every call, stores appends, fails or hangs on demand.

    ``batch_failures`` makes the next N batches raise :class:`HostGone` (the host down);
    ``append_errors`` answers the next appends with those protocol errors, in order;
    ``failing_sessions`` answers every append of a session with that protocol error;
    ``batch_gate`` makes every batch wait until that event is set (never: a host that
    never answers);
    ``block(method)`` makes the next call of ``method`` wait until the test releases it.
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock
        self.gone = asyncio.Event()
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.times: list[float] = []  # the clock's time of each call, beside ``calls``
        self.sent: list[str] = []  # message ids of every appendMessage sent, in order
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.batch_failures = 0
        self.append_errors: list[str] = []
        self.failing_sessions: dict[str, str] = {}  # session -> the error it always gets
        self.batch_gate: asyncio.Event | None = None
        self.batches = 0
        self._blocks: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}

    def block(self, method: str) -> tuple[asyncio.Event, asyncio.Event]:
        """Hold the next ``method`` call; return (entered, release) events."""
        pair = (asyncio.Event(), asyncio.Event())
        self._blocks[method] = pair
        return pair

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]

    async def call(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> Any:
        params = params or {}
        self._record(method, params)
        if method in self._blocks:
            entered, release = self._blocks.pop(method)
            entered.set()
            await release.wait()
        if method == "session.saveInflightMessage":
            return {"saved": True}
        if method == "session.appendMessage":
            return self._append(params)
        return {}

    async def batch(
        self, calls: list[tuple[str, dict[str, Any]]], *, timeout: float | None = None
    ) -> list[Any]:
        self.batches += 1
        if self.batch_gate is not None:
            await self.batch_gate.wait()
        if self.batch_failures:
            self.batch_failures -= 1
            raise HostGone("the host went away before answering")
        out: list[Any] = []
        for method, params in calls:
            assert method == "session.appendMessage", method
            self._record(method, params)
            out.append(self._append(params))
        return out

    def _record(self, method: str, params: dict[str, Any]) -> None:
        self.calls.append((method, params))
        self.times.append(self.clock.now() if self.clock is not None else 0.0)

    def params(self, method: str) -> list[dict[str, Any]]:
        """The params of every ``method`` call, in order."""
        return [p for m, p in self.calls if m == method]

    def _append(self, params: dict[str, Any]) -> Any:
        message = msgspec.json.decode(params["message"])
        self.sent.append(message["id"])
        if self.append_errors:
            return remote_error(self.append_errors.pop(0))
        if params["sessionId"] in self.failing_sessions:
            return remote_error(self.failing_sessions[params["sessionId"]])
        rows = self.rows.setdefault(params["sessionId"], [])
        if all(r["id"] != message["id"] for r in rows):  # the host deduplicates by id
            rows.append(message)
        return {"line": len(rows) - 1}

    def ids(self, session_id: str) -> list[str]:
        return [r["id"] for r in self.rows.get(session_id, [])]


@contextlib.asynccontextmanager
async def driven(
    tmp_path: Path, host: FakeHost, clock: FakeClock, **kw: Any
) -> AsyncIterator[tuple[TurnDriver, Outbox]]:
    """A turn driver over ``host`` with a real outbox journal under ``tmp_path``."""
    async with Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box:
        box.backoff = (0.001, 0.01)
        box.attach(host)  # type: ignore[arg-type]
        yield TurnDriver(host, box, clock=clock, **kw), box  # type: ignore[arg-type]


def prompt(mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": f"question {mid}"}


def reply(mid: str, words: int, **extra: Any) -> dict[str, Any]:
    """An assistant snapshot of ``words`` words."""
    content = " ".join(f"w{i}" for i in range(words))
    return {"id": mid, "role": "assistant", "content": content, **extra}
