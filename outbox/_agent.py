"""A simulated agent runtime: a deterministic stream of agent events for a seed.

It streams a reply token by token (``message_update`` snapshots), may call tools with
large outputs, and fails the way real runtimes do: a crash mid-reply (the stream just
ends), an error, a slow start. ``stop()`` is the user's Stop: the reply ends ``aborted``.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

from outbox._driver import Clock, RealClock
from outbox._events import AgentEvent

WORDS = [
    "the",
    "store",
    "keeps",
    "every",
    "line",
    "the",
    "user",
    "was",
    "shown",
    "as",
    "saved",
    "durable",
    "across",
    "crashes",
    "quits",
    "and",
    "restarts",
    "while",
    "replies",
    "stream",
    "for",
    "minutes",
    "and",
    "get",
    "regenerated",
]


@dataclass
class Plan:
    """What one simulated turn will do."""

    words: int
    tool_calls: int
    tool_bytes: int
    failure: str | None  # None, "crash", "error"
    slow_start: float


def plan_turn(rng: random.Random, reply_seconds: float, rate: float) -> Plan:
    """Draw a turn's shape from ``rng``."""
    roll = rng.random()
    failure = "crash" if roll < 0.10 else "error" if roll < 0.15 else None
    return Plan(
        words=max(3, int(rng.uniform(0.5, 1.5) * reply_seconds * rate)),
        tool_calls=rng.choice((0, 0, 1, 2)),
        tool_bytes=rng.choice((200, 4_000, 200_000)),
        failure=failure,
        slow_start=rng.choice((0.0, 0.0, 0.2)),
    )


class SimAgent:
    """One simulated runtime turn."""

    def __init__(
        self,
        turn_id: str,
        plan: Plan,
        rng: random.Random,
        *,
        rate: float = 40.0,
        clock: Clock | None = None,
    ) -> None:
        self.turn_id = turn_id
        self.plan = plan
        self.rng = rng
        self.rate = rate
        self.clock = clock or RealClock()
        self.stopped = False
        self.progress = 0.0  # 0..1 of the reply streamed

    def stop(self) -> None:
        """The user pressed Stop."""
        self.stopped = True

    def view(self) -> str:
        """How far the reply has streamed, for the live view."""
        return f"{int(self.progress * 100):3d}%"

    async def events(self) -> AsyncIterator[AgentEvent]:
        """The turn's events, as :meth:`TurnDriver.run` consumes them."""
        p = self.plan
        yield {"type": "turn_start", "turnId": self.turn_id}
        if p.slow_start:
            await self.clock.sleep(p.slow_start)
        for n in range(p.tool_calls):
            call_id = f"{self.turn_id}-c{n}"
            yield {"type": "tool_execution_start", "toolCallId": call_id}
            out = "".join(self.rng.choice("abcdefgh \n") for _ in range(min(p.tool_bytes, 512)))
            out = (out * (p.tool_bytes // max(1, len(out)) + 1))[: p.tool_bytes]
            row = {"id": call_id, "role": "tool", "toolCallId": call_id, "content": out}
            yield {"type": "tool_execution_end", "toolCallId": call_id, "row": row}
        mid = f"{self.turn_id}-a"
        text = ""
        yield {"type": "message_start", "message": {"id": mid, "role": "assistant", "content": ""}}
        crash_at = int(p.words * self.rng.uniform(0.3, 0.9)) if p.failure == "crash" else -1
        for i in range(p.words):
            if self.stopped:
                msg = {"id": mid, "role": "assistant", "content": text, "status": "aborted"}
                yield {"type": "message_end", "message": msg}
                yield {"type": "agent_end", "reason": "stopped"}
                return
            if i == crash_at:
                return  # the runtime died: no message_end, no agent_end
            await self.clock.sleep(1.0 / self.rate)
            text += ("" if not text else " ") + self.rng.choice(WORDS)
            self.progress = (i + 1) / p.words
            msg = {"id": mid, "role": "assistant", "content": text}
            yield {"type": "message_update", "message": msg}
        status = "error" if p.failure == "error" else "complete"
        msg = {"id": mid, "role": "assistant", "content": text, "status": status}
        yield {"type": "message_end", "message": msg}
        yield {"type": "turn_end", "turnId": self.turn_id}
        yield {"type": "agent_end", "reason": "error" if p.failure == "error" else "completed"}
