"""The turn driver's checkpoints (ADR 0153 and its amendment), on a controllable clock.

A streaming reply is checkpointed at most every 1.5 s with a trailing write; at
``message_end`` the finished snapshot is checkpointed before the final row is enqueued;
tool rows and delegate replies go through the outbox and are never checkpointed.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from outbox._driver import TurnDriver
from tests.outbox.kit import FakeClock, FakeHost, driven, prompt, reply, until

STEP = 0.25


async def quiet(clock: FakeClock, driver: TurnDriver, sid: str) -> None:
    """Wait until the session's throttle wrote what it had to, or sleeps toward it."""
    throttle = driver.inflight[sid]
    await until(
        lambda: clock.settled() and (throttle.latest is None or clock.waiting() > 0),
        "the checkpoint throttle to write or wait",
    )


async def test_a_streamed_reply_is_checkpointed_throttled_then_stored(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    events: list[dict[str, Any]] = []
    async with driven(tmp_path, host, clock, emit=events.append) as (driver, box):
        st = await driver.begin("s", "t1", prompt("u"))

        async def agent() -> AsyncIterator[dict[str, Any]]:
            yield {"type": "turn_start", "turnId": "t1"}
            yield {"type": "tool_execution_start", "toolCallId": "c0"}
            tool = {"id": "c0", "role": "tool", "toolCallId": "c0", "content": "x" * 5000}
            yield {"type": "tool_execution_end", "toolCallId": "c0", "row": tool}
            yield {"type": "message_start", "message": reply("a", 0)}
            for n in range(1, 25):  # six seconds of streaming
                clock.advance(STEP)
                await quiet(clock, driver, "s")
                yield {"type": "message_update", "message": reply("a", n)}
                await quiet(clock, driver, "s")
                delegate = reply("d", n, delegate=True)
                yield {"type": "message_update", "message": delegate}
            yield {"type": "message_end", "message": reply("a", 25, status="complete")}
            yield {"type": "turn_end", "turnId": "t1"}
            yield {"type": "agent_end", "reason": "completed"}

        assert await driver.run(st, agent()) == "completed"
        await box.drain(10.0)

    saved = host.params("session.saveInflightMessage")
    assert {p["message"]["id"] for p in saved} == {"a"}, "tool and delegate rows: no checkpoint"
    assert all(p["turnId"] == "t1" for p in saved)
    times = [t for t, (m, _) in zip(host.times, host.calls, strict=True) if m.endswith("Inflight")]
    streaming = times[:-1]  # the last one is the finished snapshot at message_end
    assert all(b - a >= 1.5 for a, b in itertools.pairwise(streaming)), times
    assert saved[-1]["message"] == reply("a", 25, status="complete")
    # The finished snapshot is checkpointed first, then its row goes through the outbox.
    methods = host.methods()
    last_checkpoint = len(methods) - 1 - methods[::-1].index("session.saveInflightMessage")
    final_row = next(
        i
        for i, (m, p) in enumerate(host.calls)
        if m == "session.appendMessage" and b'"id":"a"' in bytes(p["message"])
    )
    assert last_checkpoint < final_row
    assert host.ids("s") == ["c0", "a"]
    assert host.rows["s"][1]["content"] == reply("a", 25)["content"]
    assert host.params("session.endTurn") == [
        {"sessionId": "s", "turnId": "t1", "status": "completed"}
    ]
    assert "s" not in driver.inflight, "the turn's checkpoint state is settled"
    reported = [e for e in events if e["event"] == "checkpoint"]
    assert len(reported) == len(saved) == driver.stats["checkpoints"]
    chars = len(reply("a", 25)["content"])
    assert reported[-1] == {
        "event": "checkpoint",
        "sessionId": "s",
        "messageId": "a",
        "chars": chars,
    }
    durable = [e["messageId"] for e in events if e["event"] == "durable"]
    assert durable == ["u", "c0", "a"]


async def test_message_end_replaces_a_pending_trailing_write(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, _box):
        st = await driver.begin("s", "t1", prompt("u"))

        async def agent() -> AsyncIterator[dict[str, Any]]:
            yield {"type": "message_update", "message": reply("a", 1)}
            await quiet(clock, driver, "s")
            yield {"type": "message_update", "message": reply("a", 2)}  # waits for 1.5 s
            await quiet(clock, driver, "s")
            yield {"type": "message_end", "message": reply("a", 3, status="complete")}
            yield {"type": "agent_end", "reason": "completed"}

        await driver.run(st, agent())
        clock.advance(60.0)
        await until(clock.settled, "every woken sleeper to resume")
    contents = [p["message"]["content"] for p in host.params("session.saveInflightMessage")]
    assert contents == ["w0", "w0 w1 w2"], "the stale trailing write never lands after the end"
