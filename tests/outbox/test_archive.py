"""Regenerate archives its branch only after the drain; a failed drain skips the archive.

Also the other barrier: a session's next ``beginTurn`` waits for that session's rows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from outbox import DrainTimeout
from tests.outbox.kit import WAIT, FakeClock, FakeHost, driven, prompt, reply, until


async def finished_reply(mid: str) -> AsyncIterator[dict[str, Any]]:
    yield {"type": "message_start", "message": reply(mid, 0)}
    yield {"type": "message_end", "message": reply(mid, 5, status="complete")}
    yield {"type": "turn_end"}
    yield {"type": "agent_end", "reason": "completed"}


async def test_regenerate_with_a_failing_drain_skips_the_archive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    host.batch_gate = asyncio.Event()  # the host never answers an append
    async with driven(tmp_path, host, clock, drain_timeout=0.2) as (driver, box):
        st = await driver.begin("s", "t2", None)  # a regenerate turn: no prompt
        with caplog.at_level(logging.WARNING, logger="outbox.driver"):
            outcome = await driver.run(st, finished_reply("a2"), regenerate=True)
        assert outcome == "completed"
        assert driver.stats["skipped_archives"] == 1
        assert "session.saveActiveRevision" not in host.methods()
        assert box.depth == 1, "the reply is still in the journal, not lost"
    assert "archive of session s skipped: outbox not drained within 0.2 s" in caplog.text
    assert host.params("session.endTurn")[-1]["status"] == "completed"


async def test_regenerate_archives_after_its_rows_are_stored(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, _box):
        st = await driver.begin("s", "t2", None)
        assert await driver.run(st, finished_reply("a2"), regenerate=True) == "completed"
    assert driver.stats["skipped_archives"] == 0
    methods = host.methods()
    assert methods.count("session.saveActiveRevision") == 1
    assert methods.index("session.appendMessage") < methods.index("session.saveActiveRevision")
    assert host.params("session.saveActiveRevision") == [{"sessionId": "s"}]


async def test_a_plain_turn_does_not_archive(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    async with driven(tmp_path, host, clock) as (driver, _box):
        st = await driver.begin("s", "t1", prompt("u1"))
        await driver.run(st, finished_reply("a1"))
    assert "session.saveActiveRevision" not in host.methods()


async def test_next_begin_turn_waits_for_the_sessions_rows(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    gate = host.batch_gate = asyncio.Event()
    async with driven(tmp_path, host, clock) as (driver, box):
        await box.enqueue("s", reply("a1", 3), "t1")  # the previous reply, not yet stored
        begin = asyncio.create_task(driver.begin("s", "t2", prompt("u2")))
        await until(lambda: host.batches == 1, "the previous reply to be sent")
        assert "session.beginTurn" not in host.methods(), "no prompt ahead of the reply"
        gate.set()
        async with asyncio.timeout(WAIT):
            await begin
    methods = host.methods()
    assert methods.index("session.appendMessage") < methods.index("session.beginTurn")


async def test_begin_turn_is_not_sent_when_the_sessions_rows_cannot_drain(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost(clock)
    host.batch_gate = asyncio.Event()
    async with driven(tmp_path, host, clock, drain_timeout=0.1) as (driver, box):
        await box.enqueue("s", reply("a1", 3), "t1")
        with pytest.raises(DrainTimeout):
            await driver.begin("s", "t2", prompt("u2"))
    assert "session.beginTurn" not in host.methods()
