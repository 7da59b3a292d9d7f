"""One request's state, which the endpoint and the service share, and nothing more.

The endpoint marks it (running, cancelled) and the service puts it in its session's
queues (:mod:`host._locks`); neither needs to know the other's workings: the call holds
its places as :class:`Place` objects the endpoint can only ask to step out, back in, or
leave.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol


class Place(Protocol):
    """A call's place in a queue the service put it in."""

    def leave(self) -> None: ...
    def step_out(self) -> None: ...
    def step_in(self) -> None: ...


@dataclass(slots=True, eq=False)
class CallState:
    """What the endpoint and the service share about one request."""

    method: str
    running: bool = False  # its first step was taken
    started: bool = False  # it holds its session (or is a rider of the holder)
    cancel_requested: bool = False
    task: asyncio.Task[object] | None = field(default=None, repr=False)
    places: list[Place] = field(default_factory=list, repr=False)

    def step_out(self) -> None:
        """Leave the queues while the call waits for its client to read (its connection's
        gate holds it): a client that stops reading holds up no other. Every later call
        of its connection waits there behind it, so none of them passes it."""
        for p in self.places:
            p.step_out()

    def step_in(self) -> None:
        """Take places in the queues again, at their tails, once the gate lets it start."""
        for p in self.places:
            p.step_in()

    def end(self) -> None:
        """The call is over, however it ended: its places in the queues are given up."""
        for p in self.places:
            p.leave()
        self.places.clear()  # no cycle left for the collector
