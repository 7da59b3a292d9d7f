"""$/cancelRequest of a call that has started: it runs to its end and answers as usual.

A started write finishes atomically (docs/protocol.md, Cancellation): stopping it half-way
would leave the client without an answer for a change that may be made, or half made.
Over the wire a call cannot be caught started (tests/e2e/test_cancel.py covers the ones
still waiting); here, through the endpoint the server runs, the test holds the call
half-way with a seam (a flush that waits, a history call paused at a named point), sends
the cancel, lets it go on, and then ends the input: an answer that never came shows up as
a closed connection, never as a hang.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import msgspec

from host import FileSystem
from tests.host.inproc import Client, msg, open_host, pause_history_at

WAIT = 30.0


class HeldFlush(FileSystem):
    """A disk whose next fsync, once ``hold`` is set, waits until ``go`` (on its thread)."""

    def __init__(self) -> None:
        self.hold = False
        self.entered = threading.Event()
        self.go = threading.Event()

    def fsync(self, fd: int) -> None:
        if self.hold:
            self.hold = False
            self.entered.set()
            self.go.wait(WAIT)
        super().fsync(fd)


def line(obj: Any) -> bytes:
    return msgspec.json.encode(obj) + b"\n"


async def cancelled_once_started(
    call: Client, method: str, params: dict[str, Any], started: Any, go: Any
) -> dict[str, Any]:
    """Send ``method``; once ``started()`` says it holds its session, cancel it, ``go`` on,
    end the input; return its answer (``ConnectionError``: it never answered)."""
    answer = call.expect("held")
    call.send(line(call.envelope(method, params, "held")))
    await started()
    call.send(line(call.envelope("$/cancelRequest", {"id": "held"})))
    go()
    await call.close()  # the calls in flight finish, then the connection closes
    return await answer


async def rows(data: Path) -> list[str]:
    async with open_host(str(data)) as call:
        return [m["id"] for m in (await call("session.get", sessionId="s"))["messages"]]


async def test_a_started_append_is_not_stopped_by_a_cancel(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fs = HeldFlush()
    async with open_host(str(data), fs) as call:
        await call("session.create", sessionId="s")
        fsyncs = call.host.registry.fsyncs
        fsyncs.average = 10 * fsyncs.SLOW  # the flush runs on a thread: the loop is free
        fs.hold = True

        async def in_its_flush() -> None:
            assert await asyncio.to_thread(fs.entered.wait, WAIT), "the append never flushed"

        answer = await cancelled_once_started(
            call,
            "session.appendMessage",
            {"sessionId": "s", "message": msg("m", "user")},
            in_its_flush,
            fs.go.set,
        )
    assert answer.get("result") == {"line": 0, "appended": True}, answer
    assert await rows(data) == ["m"]


async def test_a_started_truncate_is_not_stopped_by_a_cancel(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with open_host(str(data)) as call:
        await call("session.create", sessionId="s")
        for m in (msg("u1", "user"), msg("a1"), msg("a2")):
            await call("session.appendMessage", sessionId="s", message=m)
        reached, release = pause_history_at(call, "intent-recorded")

        async def at_its_intent() -> None:
            await asyncio.wait_for(reached.wait(), WAIT)

        answer = await cancelled_once_started(
            call,
            "session.truncateFrom",
            {"sessionId": "s", "fromMessageId": "a1"},
            at_its_intent,
            release.set,
        )
    assert answer.get("result", {}).get("removed") == 2, answer
    assert await rows(data) == ["u1"]
    async with open_host(str(data)) as call:  # the regenerate's branch is archived
        revs = await call("session.listRevisions", sessionId="s", rootId="u1", includeMessages=True)
    assert [[m["id"] for m in r["messages"]] for r in revs["revisions"]] == [["a1", "a2"]]


# Found when the mutants were re-pointed at the session-owner redesign (issue 37): a cancel
# that took a started call out of its session's queue stopped nothing of it, so the tests
# above passed, but the next call of the session then ran beside it.
async def test_a_cancelled_started_call_still_holds_its_session(tmp_path: Path) -> None:
    """An append sent after a truncate runs after it, cancel or not: it is stored after
    the cut, never cut away by it, nor written while the cut is being made."""
    data = tmp_path / "data"
    async with open_host(str(data)) as call:
        await call("session.create", sessionId="s")
        for m in (msg("u1", "user"), msg("a1"), msg("a2")):
            await call("session.appendMessage", sessionId="s", message=m)
        reached, release = pause_history_at(call, "intent-recorded")
        cut = call.expect("cut")
        params = {"sessionId": "s", "fromMessageId": "a1"}
        call.send(line(call.envelope("session.truncateFrom", params, "cut")))
        await asyncio.wait_for(reached.wait(), WAIT)
        after = call.expect("after")
        params = {"sessionId": "s", "message": msg("b1")}
        call.send(line(call.envelope("session.appendMessage", params, "after")))
        call.send(line(call.envelope("$/cancelRequest", {"id": "cut"})))
        release.set()
        await call.close()
        answers = {"cut": await cut, "after": await after}
    assert answers["cut"].get("result", {}).get("removed") == 2, answers
    assert answers["after"].get("result") == {"line": 1, "appended": True}, answers
    assert await rows(data) == ["u1", "b1"]
