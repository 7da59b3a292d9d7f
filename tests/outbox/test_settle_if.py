"""The settle-if rule (ADR 0153 amendment): a turn that starts while the finished reply's
checkpoint is being written keeps its own checkpoint state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.outbox.kit import WAIT, FakeClock, FakeHost, driven, prompt, reply, until


async def test_a_turn_started_during_the_final_checkpoint_keeps_its_state(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, box):
        first = await driver.begin("s", "t1", prompt("u1"))
        holds: list[tuple[asyncio.Event, asyncio.Event]] = []

        async def agent() -> AsyncIterator[dict[str, Any]]:
            yield {"type": "message_update", "message": reply("a1", 2)}
            await until(lambda: len(host.params("session.saveInflightMessage")) == 1, "a save")
            holds.append(host.block("session.saveInflightMessage"))  # the message_end write
            yield {"type": "message_end", "message": reply("a1", 3, status="complete")}
            yield {"type": "agent_end", "reason": "completed"}

        run = asyncio.create_task(driver.run(first, agent()))
        await until(lambda: holds and holds[0][0].is_set(), "the final checkpoint write")
        second = await driver.begin("s", "t2", prompt("u2"))  # during that write
        holds[0][1].set()
        async with asyncio.timeout(WAIT):
            assert await run == "completed"

        assert driver.inflight["s"] is second.throttle, "the newer turn's state survives"
        assert driver.active["s"] is second
        # And it still does its job: the newer turn's newest snapshot is flushed at quit.
        second.throttle.update(reply("a2", 1))
        await until(lambda: len(host.params("session.saveInflightMessage")) == 3, "a save")
        second.throttle.update(reply("a2", 4))  # waits for its interval
        await driver.quit(lambda: None)
        await box.drain(10.0)

    last = host.params("session.saveInflightMessage")[-1]
    assert (last["turnId"], last["message"]) == ("t2", reply("a2", 4))
    assert host.ids("s") == ["a1"], "the first turn's final row went through the outbox"


async def test_without_a_newer_turn_message_end_settles_the_state(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, _box):
        st = await driver.begin("s", "t1", prompt("u1"))
        assert driver.inflight["s"] is st.throttle

        async def agent() -> AsyncIterator[dict[str, Any]]:
            yield {"type": "message_update", "message": reply("a1", 2)}
            yield {"type": "message_end", "message": reply("a1", 3, status="complete")}
            yield {"type": "agent_end", "reason": "completed"}

        await driver.run(st, agent())
        assert "s" not in driver.inflight and "s" not in driver.active
