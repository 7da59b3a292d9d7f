"""The checkpoint throttle (ADR 0153): at most one save per 1.5 s, newest snapshot last.

Time is a :class:`~tests.outbox.kit.FakeClock` the test moves by hand: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from outbox._driver import CHECKPOINT_INTERVAL, Throttle
from tests.outbox.kit import FakeClock, until

STEP = 0.25  # a snapshot every quarter second (exact in binary, like 1.5)


class Saves:
    """The save callback: records (time, snapshot number); can hold a save open."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.done: list[tuple[float, int]] = []
        self.gate: asyncio.Event | None = None
        self.started = 0

    async def __call__(self, snapshot: dict[str, Any]) -> None:
        self.started += 1
        if self.gate is not None:
            await self.gate.wait()
        self.done.append((self.clock.now(), snapshot["n"]))


async def quiet(clock: FakeClock, throttle: Throttle) -> None:
    """Wait until the throttle wrote what it had to, or sleeps toward its trailing write."""
    await until(
        lambda: clock.settled() and (throttle.latest is None or clock.waiting() > 0),
        "the throttle to write or wait",
    )


def snap(n: int) -> dict[str, Any]:
    return {"id": "a", "role": "assistant", "content": "w " * n, "n": n}


async def test_a_stream_of_snapshots_is_saved_at_most_every_interval() -> None:
    clock = FakeClock()
    saves = Saves(clock)
    throttle = Throttle(saves, clock)
    assert throttle.interval == CHECKPOINT_INTERVAL == 1.5
    for n in range(1, 41):  # ten seconds of snapshots
        if n > 1:
            clock.advance(STEP)
            await quiet(clock, throttle)
        throttle.update(snap(n))
        await quiet(clock, throttle)
    clock.advance(CHECKPOINT_INTERVAL)
    await quiet(clock, throttle)

    times = [t for t, _ in saves.done]
    assert saves.done[0] == (0.0, 1), "the first snapshot is written at once"
    assert all(b - a >= CHECKPOINT_INTERVAL for a, b in itertools.pairwise(times))
    assert len(saves.done) <= 10 / CHECKPOINT_INTERVAL + 2
    # Each trailing write carries the newest snapshot of its moment: the one taken a step
    # ago (snapshot n arrives at (n - 1) * STEP) ...
    assert all(n == round(t / STEP) for t, n in saves.done[1:-1]), saves.done
    # ... and once the stream stops, the trailing write still writes the very last one.
    assert saves.done[-1][1] == 40, saves.done


async def test_nothing_is_written_inside_the_interval_then_the_newest_is() -> None:
    clock = FakeClock()
    saves = Saves(clock)
    throttle = Throttle(saves, clock)
    throttle.update(snap(1))
    await quiet(clock, throttle)
    for n in (2, 3, 4):
        clock.advance(STEP)
        throttle.update(snap(n))
        await quiet(clock, throttle)
    assert saves.done == [(0.0, 1)]
    clock.advance(1.5 - 3 * STEP)
    await quiet(clock, throttle)
    assert saves.done == [(0.0, 1), (1.5, 4)]
    clock.advance(60.0)
    await quiet(clock, throttle)
    assert saves.done == [(0.0, 1), (1.5, 4)], "no snapshot, no write"


async def test_a_snapshot_arriving_during_a_save_gets_its_trailing_write() -> None:
    clock = FakeClock()
    saves = Saves(clock)
    saves.gate = asyncio.Event()
    throttle = Throttle(saves, clock)
    throttle.update(snap(1))
    await until(lambda: saves.started == 1, "the first save to start")
    throttle.update(snap(2))  # while the first write is still on its way
    saves.gate.set()
    await quiet(clock, throttle)
    assert saves.done == [(0.0, 1)]
    clock.advance(1.5)
    await quiet(clock, throttle)
    assert saves.done == [(0.0, 1), (1.5, 2)]


async def test_flush_writes_the_newest_snapshot_now_and_cancels_the_trailing_write() -> None:
    clock = FakeClock()
    saves = Saves(clock)
    throttle = Throttle(saves, clock)
    throttle.update(snap(1))
    await quiet(clock, throttle)
    clock.advance(STEP)
    throttle.update(snap(2))
    throttle.update(snap(3))
    await quiet(clock, throttle)
    await throttle.flush()
    assert saves.done == [(0.0, 1), (STEP, 3)]
    clock.advance(60.0)
    await quiet(clock, throttle)
    assert saves.done == [(0.0, 1), (STEP, 3)], "the flushed snapshot is not written again"
    await throttle.flush()
    assert len(saves.done) == 2, "nothing waiting, nothing flushed"
