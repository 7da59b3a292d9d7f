"""How a turn ends on the host: completed, user Stop, runtime crash, error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.outbox.kit import FakeClock, FakeHost, driven, prompt, reply, until


async def test_stop_sends_the_runtimes_aborted_row_through_the_outbox(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, box):
        st = await driver.begin("s", "t1", prompt("u"))

        async def agent() -> AsyncIterator[dict[str, Any]]:
            yield {"type": "message_update", "message": reply("a", 2)}
            yield {"type": "message_end", "message": reply("a", 3, status="aborted")}
            yield {"type": "agent_end", "reason": "stopped"}

        assert await driver.run(st, agent()) == "stopped"
        await box.drain(10.0)
    assert host.params("session.endTurn") == [
        {"sessionId": "s", "turnId": "t1", "status": "aborted"}
    ]
    assert host.rows["s"] == [reply("a", 3, status="aborted")]


async def test_runtime_crash_flushes_the_checkpoint_and_asks_to_recover_it(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, _box):
        st = await driver.begin("s", "t1", prompt("u"))

        async def agent() -> AsyncIterator[dict[str, Any]]:
            yield {"type": "message_update", "message": reply("a", 1)}
            await until(lambda: host.params("session.saveInflightMessage"), "a checkpoint")
            yield {"type": "message_update", "message": reply("a", 6)}  # inside the interval
            # ... and the runtime dies: no message_end, no agent_end.

        assert await driver.run(st, agent()) == "crashed"
    saved = host.params("session.saveInflightMessage")
    assert [p["message"] for p in saved] == [reply("a", 1), reply("a", 6)]
    assert host.params("session.endTurn") == [
        {"sessionId": "s", "turnId": "t1", "status": "aborted", "recoverInflight": True}
    ]
    assert host.methods().index("session.endTurn") > host.methods().index(
        "session.saveInflightMessage"
    )
    assert "session.appendMessage" not in host.methods()


@pytest.mark.parametrize(("reason", "status"), [("error", "error"), ("completed", "completed")])
async def test_error_and_completed_end_the_turn_with_their_status(
    tmp_path: Path, reason: str, status: str
) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, box):
        st = await driver.begin("s", "t1", prompt("u"))

        async def agent() -> AsyncIterator[dict[str, Any]]:
            final = reply("a", 3, status="error" if reason == "error" else "complete")
            yield {"type": "message_end", "message": final}
            yield {"type": "agent_end", "reason": reason}

        assert await driver.run(st, agent()) == reason
        await box.drain(10.0)
    assert host.params("session.endTurn")[-1]["status"] == status
    assert "recoverInflight" not in host.params("session.endTurn")[-1]
    assert host.ids("s") == ["a"]
