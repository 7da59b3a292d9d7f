"""Outbox replay after kill -9 of the producer: every durable row stored exactly once."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from outbox import Outbox
from tests.outbox.kit import WAIT, kill_group, python, reap, spawned, stored_ids

# A producer: its own host, two sessions, rows enqueued one after another; it prints a
# row's index once enqueue returned. With "detach" the host is detached after the first
# rows, so the rest are durable in the journal but never sent.
PRODUCER = """
import asyncio, os, sys
from outbox import HostClient, Outbox

async def main(root, mode):
    async with Outbox.open(os.path.join(root, "app", "outbox.jsonl")) as box:
        client = await HostClient.spawn(os.path.join(root, "host"))
        await client.handshake()
        for sid in ("s0", "s1"):
            await client.call("session.create", {"sessionId": sid})
        box.attach(client)
        for i in range(1_000_000):
            if mode == "detach" and i == 10:
                await box.drain(30.0)
                box.attach(None)
            role = "user" if i % 4 < 2 else "assistant"
            row = {"id": "m%d" % i, "role": role, "content": "row %d " % i + "x" * (i % 500)}
            await box.enqueue("s%d" % (i % 2), row, None)
            print(i, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize(("mode", "seed"), [("attached", 1), ("attached", 2), ("detach", 3)])
async def test_rows_durable_before_kill_9_are_stored_once_in_order(
    tmp_path: Path, mode: str, seed: int
) -> None:
    root = tmp_path / "data"
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER)
    proc = await python(str(script), str(root), mode, start_new_session=True)
    assert proc.stdout is not None
    kill_after = random.Random(seed).randrange(15, 300)
    printed: list[int] = []
    async with asyncio.timeout(WAIT):
        while len(printed) < kill_after:
            line = await proc.stdout.readline()
            assert line, f"the producer died early: {await reap(proc)}"
            printed.append(int(line))
    printed += [int(n) for n in (await kill_group(proc, root / "host")).split()]
    assert printed == list(range(len(printed)))

    # The next run: the same journal, a new host on the same data dir.
    async with Outbox.open(str(root / "app" / "outbox.jsonl")) as box:
        if mode == "detach":
            assert box.depth >= len(printed) - 10, "undrained rows wait in the journal"
        async with spawned(root / "host") as client:
            box.attach(client)
            await box.drain(WAIT)
            assert box.depth == 0
            s0, s1 = await stored_ids(client, "s0"), await stored_ids(client, "s1")

    # At most the one row whose enqueue was in flight at the kill may be there as well.
    for landed in (len(printed), len(printed) + 1):
        want = [f"m{i}" for i in range(landed)]
        if (s0, s1) == (want[0::2], want[1::2]):
            break
    else:
        raise AssertionError(
            f"{len(printed)} rows were durable; stored s0={s0[-5:]}… ({len(s0)}),"
            f" s1={s1[-5:]}… ({len(s1)}): lost, duplicated or out of order"
        )
