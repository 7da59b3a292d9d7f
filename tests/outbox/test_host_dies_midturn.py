"""The host dies while a reply streams and the app's runtime goes on (a real host, killed).

Found at 4d444d5 (helper-22's producer pass): the reconnect's connect sequence settled
every checkpoint, the streaming turn's too, so its partial was stored ``aborted`` and
the finished reply, which the app had been told was saved, was deduplicated behind it.
A reconnect now names the driver's running sessions in ``keep``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from outbox import HostClient, Outbox, TurnDriver
from tests.outbox.kit import WAIT, stored, until


async def connect(data: Path, box: Outbox, keep: list[str]) -> HostClient:
    """A host spawned, and the connect sequence (``keep`` on a reconnect)."""
    client = await HostClient.spawn(str(data), log_path=str(data) + ".log")
    assert await box.connect(client, keep=keep) == []
    return client


async def test_a_reply_streaming_across_a_host_restart_is_stored_whole(tmp_path: Path) -> None:
    data = tmp_path / "host"
    durable: list[str] = []
    async with Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box:
        client = await connect(data, box, [])
        await client.call("session.create", {"sessionId": "s"})
        driver = TurnDriver(client, box, emit=lambda n: durable.append(n["messageId"]))
        st = await driver.begin("s", "t1", {"id": "u1", "role": "user", "content": "q"})
        restarted = asyncio.Event()

        async def agent() -> AsyncIterator[dict[str, Any]]:
            nonlocal client
            reply = {"id": "a1", "role": "assistant", "content": "Once upon"}
            yield {"type": "message_update", "message": reply}
            await until(lambda: driver.stats["checkpoints"] >= 1, "its first checkpoint")
            client.kill()  # the host dies; the runtime streams on
            await client.gone.wait()
            client = await connect(data, box, driver.running())
            driver.client = client
            restarted.set()
            reply = {**reply, "content": "Once upon a time, the end.", "status": "complete"}
            yield {"type": "message_update", "message": reply}
            yield {"type": "message_end", "message": reply}
            yield {"type": "agent_end", "reason": "completed"}

        assert await driver.run(st, agent()) == "completed"
        assert restarted.is_set()
        await box.drain(WAIT)
        rows = await stored(client, "s")
        await client.close()
    assert "a1" in durable, "the app was told the finished reply is saved"
    got = [(m["id"], m["content"], m.get("status")) for m in rows]
    assert got == [("u1", "q", None), ("a1", "Once upon a time, the end.", "complete")]
