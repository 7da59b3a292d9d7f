"""Regenerate against a real host: cut the last reply, stream the new one, archive it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from outbox import Outbox
from outbox._driver import TurnDriver
from tests.outbox.kit import WAIT, prompt, reply, spawned, stored, stored_ids


def tool_row(cid: str) -> dict[str, Any]:
    return {"id": cid, "role": "tool", "toolCallId": cid, "content": "output of " + cid}


async def a_reply(mid: str, box: Outbox | None = None) -> AsyncIterator[dict[str, Any]]:
    """A tool call then a reply; with ``box``, the reply's row stays in the outbox."""
    cid = mid + "-c"
    yield {"type": "tool_execution_start", "toolCallId": cid}
    yield {"type": "tool_execution_end", "toolCallId": cid, "row": tool_row(cid)}
    if box is not None:
        await box.drain(10.0)  # the tool row is stored ...
        box.attach(None)  # ... and then the outbox falls behind (a retry backoff, say)
    yield {"type": "message_update", "message": reply(mid, 2)}
    yield {"type": "message_end", "message": reply(mid, 4, status="complete")}
    yield {"type": "agent_end", "reason": "completed"}


async def test_regenerate_replaces_the_last_reply_and_archives_it(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    async with (
        Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        box.attach(client)
        driver = TurnDriver(client, box, emit=events.append)
        st = await driver.begin("s", "t1", prompt("u1"))
        assert await driver.run(st, a_reply("a1")) == "completed"

        assert await driver.truncate_last_reply("s") == ("u1", ["a1-c", "a1"])
        st = await driver.begin("s", "t2", None)
        assert await driver.run(st, a_reply("a2"), regenerate=True) == "completed"
        assert driver.stats["skipped_archives"] == 0
        messages = await stored(client, "s")
    assert [m["id"] for m in messages] == ["u1", "a2-c", "a2"]
    assert messages[2]["content"] == reply("a2", 4)["content"]
    assert {"event": "cut", "sessionId": "s", "messageIds": ["a1-c", "a1"]} in events


async def test_regenerate_waits_for_a_reply_still_in_the_outbox_then_cuts_it(
    tmp_path: Path,
) -> None:
    async with (
        Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        box.attach(client)
        driver = TurnDriver(client, box)
        st = await driver.begin("s", "t1", prompt("u1"))
        assert await driver.run(st, a_reply("a1", box)) == "completed"
        assert box.depth == 1, "the reply a1 is durable, in the outbox"
        assert await stored_ids(client, "s") == ["u1", "a1-c"]

        cutting = asyncio.create_task(driver.truncate_last_reply("s"))  # Regenerate
        box.attach(client)  # the outbox catches up
        async with asyncio.timeout(WAIT):
            assert await cutting == ("u1", ["a1-c", "a1"])
        assert await stored_ids(client, "s") == ["u1"], "the whole old reply is cut"


# Found at 39c443b: acks are not fsynced, so a power cut during a regenerate could lose the
# cut reply's ack; the replay after the restart then stored the cut reply again.
async def test_a_power_cut_after_a_regenerate_brings_no_cut_reply_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = tmp_path / "app" / "outbox.jsonl"
    synced: list[bytes] = []  # the journal as each fsync of it left it on disk
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if os.readlink(f"/proc/self/fd/{fd}") == str(journal):
            synced.append(journal.read_bytes())

    monkeypatch.setattr(os, "fsync", fsync)
    async with (
        Outbox.open(str(journal)) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        box.attach(client)
        driver = TurnDriver(client, box)
        st = await driver.begin("s", "t1", prompt("u1"))
        assert await driver.run(st, a_reply("a1")) == "completed"
        assert await driver.truncate_last_reply("s") == ("u1", ["a1-c", "a1"])
        await driver.begin("s", "t2", None)  # the new reply streams; then the power goes
        client.kill()
    journal.write_bytes(synced[-1])  # what the disk kept

    async with (
        Outbox.open(str(journal)) as box,
        spawned(tmp_path / "host") as client,
    ):
        box.attach(client)
        await box.drain(WAIT)  # the connect sequence's drain replays what is pending
        assert await stored_ids(client, "s") == ["u1"]
