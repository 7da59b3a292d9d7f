"""Quit (ADR 0153 §3): flush checkpoints, abort active turns, wait at most 2 s to drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from outbox import DrainTimeout, Journal
from outbox._driver import QUIT_DRAIN, TurnDriver
from outbox._pi import PiTurn
from tests.conftest import REPO
from tests.outbox.kit import FakeClock, FakeHost, driven, prompt, reply, until


class StuckOutbox:
    """An outbox edge whose drain cannot finish once ``stuck``; records what it was asked."""

    def __init__(self, order: list[Any]) -> None:
        self.order = order
        self.stuck = False
        self.drains: list[tuple[float, str | None]] = []

    async def drain(self, timeout: float, session_id: str | None = None) -> None:
        self.drains.append((timeout, session_id))
        if self.stuck:
            self.order.append(("drain", timeout))
            raise DrainTimeout(f"outbox not drained within {timeout:.1f} s: 1 entr(ies) pending")

    async def enqueue(self, session_id: str, message: Any, turn_id: str | None = None) -> None:
        self.order.append(("enqueue", message["id"]))


class RecordingHost(FakeHost):
    def __init__(self, clock: FakeClock, order: list[Any]) -> None:
        super().__init__(clock)
        self.order = order

    async def call(self, method: str, params: Any = None, *, timeout: float | None = None) -> Any:
        if method == "session.saveInflightMessage":
            self.order.append(("checkpoint", params["message"]["content"]))
        return await super().call(method, params, timeout=timeout)


async def test_quit_with_an_outbox_that_cannot_drain_returns_within_its_bound() -> None:
    order: list[Any] = []
    clock = FakeClock()
    host = RecordingHost(clock, order)
    outbox = StuckOutbox(order)
    driver = TurnDriver(host, outbox, clock=clock)  # type: ignore[arg-type]
    st = await driver.begin("s", "t1", prompt("u1"))
    st.throttle.update(reply("a1", 1))
    await until(lambda: len(order) == 1, "the first checkpoint")
    st.throttle.update(reply("a1", 7))  # newest, waiting for its interval
    outbox.stuck = True

    await driver.quit(lambda: order.append("stop agents"))

    assert order == [
        ("checkpoint", reply("a1", 1)["content"]),
        ("checkpoint", reply("a1", 7)["content"]),  # flushed first
        "stop agents",  # then the active turns are aborted
        ("drain", 2.0),  # then a bounded wait for their rows
    ]
    assert outbox.drains[-1] == (QUIT_DRAIN, None) == (2.0, None)


async def test_quit_over_a_host_that_never_answers_keeps_the_rows(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    host.batch_gate = asyncio.Event()  # never answers an append
    async with driven(tmp_path, host, clock) as (driver, box):
        await driver.begin("s", "t1", prompt("u1"))
        await box.enqueue("s", reply("a1", 2, status="aborted"), "t1")  # the aborted row
        stopped: list[bool] = []
        await asyncio.wait_for(driver.quit(lambda: stopped.append(True), wait=0.1), 10.0)
        assert stopped == [True]
        assert host.ids("s") == []
    async with Journal.open(str(tmp_path / "app" / "outbox.jsonl")) as journal:
        assert len(journal.pending) == 1, "the aborted row waits in the journal for next run"


async def test_quit_waits_for_the_aborted_rows_of_active_turns(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, _box):
        st = await driver.begin("s", "t1", prompt("u1"))
        stop = asyncio.Event()

        async def agent() -> AsyncIterator[dict[str, Any]]:
            yield {"type": "message_update", "message": reply("a1", 2)}
            await stop.wait()  # streaming until the user quits
            yield {"type": "message_end", "message": reply("a1", 3, status="aborted")}
            yield {"type": "agent_end", "reason": "stopped"}

        run = asyncio.create_task(driver.run(st, agent()))
        await until(lambda: host.params("session.saveInflightMessage"), "a checkpoint")
        await driver.quit(stop.set)
        stored_at_quit = host.ids("s")
        assert await run == "stopped"
    assert stored_at_quit == ["a1"], "quit returned before the aborted row was stored"


async def test_quit_flushes_the_newest_snapshot_of_a_turn_s_later_reply(tmp_path: Path) -> None:
    """pi's tool turn has two replies; quit in the second must checkpoint it (issue 29)."""
    turn = PiTurn("t1")
    lines = (REPO / "tests" / "fixtures" / "pi-rpc" / "tool.jsonl").read_text().splitlines()
    mapped = [e for line in lines for e in turn.feed(msgspec.json.decode(line))]
    second = [i for i, e in enumerate(mapped) if e.get("message", {}).get("id") == "t1:a1"]
    streamed = mapped[: second[3] + 1]  # the first reply, the tool row, 4 updates of t1:a1
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, _box):
        st = await driver.begin("s", "t1", prompt("t1:u"))
        stop = asyncio.Event()

        async def agent() -> AsyncIterator[dict[str, Any]]:
            for ev in streamed:
                yield ev
                await asyncio.sleep(0)  # the throttle saves t1:a0's first snapshot at once
            await stop.wait()  # streaming until the user quits
            aborted = {**streamed[-1]["message"], "status": "aborted", "stopReason": "aborted"}
            yield {"type": "message_end", "message": aborted}
            yield {"type": "agent_end", "reason": "stopped"}

        run = asyncio.create_task(driver.run(st, agent()))
        newest = streamed[-1]["message"]
        await until(lambda: st.throttle.latest is newest and clock.waiting(), "t1:a1 to wait")
        assert host.ids("s") == ["t1:a0", "t1:tool:call_mock_1"]
        saved: list[dict[str, Any]] = []

        def stop_agents() -> None:  # what quit had checkpointed before it stopped the agents
            saved.extend(host.params("session.saveInflightMessage"))
            stop.set()

        await driver.quit(stop_agents)
        assert await run == "stopped"
    assert saved[-1]["message"] is newest, "the newest snapshot of t1:a1, flushed"
