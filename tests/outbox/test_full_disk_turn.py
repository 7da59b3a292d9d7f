"""A turn whose row the journal cannot take: the app's disk is full (a real small tmpfs).

Found at 4d444d5 (helper-22's producer pass): ``TurnDriver.run`` raised the ``OSError``
and left the turn running on the host, so every later turn of the session was refused
``AGENT_BUSY`` until the host restarted. Now the turn ends as a crash would: its reply,
checkpointed at ``message_end``, is promoted ``aborted``, and the next turn goes on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from outbox import Outbox, TurnDriver
from tests.outbox.kit import spawned, stored


def fill(path: Path) -> None:
    """Take every free byte of the file system ``path`` is on."""
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 16, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)


async def events(mid: str, before_end: Any = None) -> AsyncIterator[dict[str, Any]]:
    text = "x" * 9000
    yield {"type": "message_update", "message": {"id": mid, "role": "assistant", "content": "x"}}
    if before_end is not None:
        before_end()
    end = {"id": mid, "role": "assistant", "content": text, "status": "complete"}
    yield {"type": "message_end", "message": end}
    yield {"type": "agent_end", "reason": "completed"}


async def test_a_row_a_full_disk_refuses_ends_its_turn_and_the_next_goes_on(
    tmp_path: Path, small_disk: Path
) -> None:
    filler = small_disk / "filler"
    async with (
        Outbox.open(str(small_disk / "app" / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        box.attach(client)
        await box.drain(10)
        await client.call("session.recoverInflightMessages")
        await client.call("session.create", {"sessionId": "s"})
        driver = TurnDriver(client, box)
        st = await driver.begin("s", "t1", {"id": "u1", "role": "user", "content": "q1"})
        with pytest.raises(OSError):
            await driver.run(st, events("a1", lambda: fill(filler)))
        os.unlink(filler)
        assert "s" not in driver.active
        st = await driver.begin("s", "t2", {"id": "u2", "role": "user", "content": "q2"})
        assert await driver.run(st, events("a2")) == "completed"
        await box.drain(10)
        rows = await stored(client, "s")
    assert [(m["id"], m.get("status")) for m in rows] == [
        ("u1", None),
        ("a1", "aborted"),  # the finished snapshot, checkpointed before its row failed
        ("u2", None),
        ("a2", "complete"),
    ]
    assert rows[1]["content"] == "x" * 9000
