"""A runtime that dies mid-turn: the turn's queued rows are stored before its checkpoint.

``endTurn`` with ``recoverInflight`` appends the checkpoint at once, so the driver drains
the session's rows first: a tool row must not land after the reply, and a finished reply
still in the outbox must not be deduplicated behind an aborted copy of itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from outbox import HostClient, Outbox
from outbox._driver import TurnDriver
from tests.outbox.kit import spawned, stored


class GatedBatches:
    """The outbox's edge of a real client: batches wait until ``open`` is set (a drain
    that lags, e.g. busy with another session's backlog or in backoff)."""

    def __init__(self, client: HostClient) -> None:
        self.client = client
        self.gone = client.gone
        self.open = asyncio.Event()

    async def batch(self, calls: list[tuple[str, dict[str, Any]]], **kw: Any) -> list[Any]:
        await self.open.wait()
        return await self.client.batch(calls, **kw)

    async def call(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        return await self.client.call(method, params, **kw)


async def _crashed_turn(tmp_path: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with (
        Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        edge = GatedBatches(client)
        box.attach(edge)  # type: ignore[arg-type]
        driver = TurnDriver(client, box)
        st = await driver.begin("s", "t1", {"id": "u1", "role": "user", "content": "q"})
        real_drain = box.drain

        async def drain(*args: Any, **kwargs: Any) -> None:
            edge.open.set()  # from here on, a drain that is waited for gets through
            await real_drain(*args, **kwargs)

        box.drain = drain  # type: ignore[method-assign]

        async def agent() -> AsyncIterator[dict[str, Any]]:
            for ev in events:
                yield ev
            # ... and the runtime dies: no agent_end

        assert await driver.run(st, agent()) == "crashed"
        edge.open.set()
        await box.drain(10.0)
        return await stored(client, "s")


async def test_a_crashed_turns_promoted_reply_lands_after_its_tool_rows(tmp_path: Path) -> None:
    rows = await _crashed_turn(
        tmp_path,
        [
            {"type": "tool_execution_end", "row": {"id": "tool1", "role": "tool", "content": "o"}},
            {
                "type": "message_update",
                "message": {"id": "a1", "role": "assistant", "content": "p"},
            },
        ],
    )
    assert [m["id"] for m in rows] == ["u1", "tool1", "a1"]


async def test_a_finished_reply_is_not_stored_as_aborted_when_the_runtime_dies_after_it(
    tmp_path: Path,
) -> None:
    final = {"id": "a1", "role": "assistant", "content": "all of it", "status": "complete"}
    rows = await _crashed_turn(tmp_path, [{"type": "message_end", "message": final}])
    assert [(m["id"], m.get("status", "complete")) for m in rows] == [
        ("u1", "complete"),
        ("a1", "complete"),
    ]
