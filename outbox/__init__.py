"""hostcore's producer side: what an app's main process wires its agent loop with.

- :class:`HostClient` spawns ``python -m host serve`` (or connects to its socket) and
  calls it: ids, deadlines with ``$/cancelRequest``, :class:`HostGone` when it exits.
- :class:`Outbox` over a :class:`Journal`: rows are fsynced into the app's own journal
  before they count as saved, then delivered to the host at least once and in order
  (the host deduplicates by message id).
- :class:`TurnDriver` turns an agent runtime's events (:data:`AgentEvent`) into
  durable rows, throttled checkpoints of the streaming reply (ADR 0153) and turn ends,
  and tells the app what is saved (:data:`Notice`).

The connect sequence comes first on every connection (:meth:`Outbox.connect`):
``handshake``, attach and drain the outbox, then ``session.recoverInflightMessages``
(``keep``: on a reconnect, the driver's running sessions). ``docs/python-api.md`` shows an
agent loop of one's own persisted this way; ``python -m outbox drive`` runs the same
pieces with the simulated runtime in ``outbox._agent``.

    ClientError
    ├── HostGone        the host process or socket went away
    ├── CallTimeout     a call's deadline passed (a cancel was sent)
    └── RemoteError     the host answered with a JSON-RPC error (``code``, ``name``, ``data``)
    DrainTimeout        the outbox did not see its rows acknowledged in time
    RowRefused          (a ValueError) a row the host could never store: ``enqueue`` wrote
                        nothing; ``TurnDriver.run`` ended its turn ``error`` first
"""

from __future__ import annotations

from outbox._client import CallTimeout, ClientError, HostClient, HostGone, RemoteError
from outbox._driver import Clock, TurnDriver, TurnState
from outbox._events import (
    AgentEnd,
    AgentEvent,
    Checkpointed,
    Cut,
    Durable,
    Message,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    Notice,
    Outcome,
    ToolExecutionEnd,
    ToolExecutionStart,
    TurnEnd,
    TurnStart,
)
from outbox._journal import Entry, Journal, JournalBusy
from outbox._outbox import DrainTimeout, Outbox
from outbox._rows import RowRefused

__all__ = [
    "AgentEnd",
    "AgentEvent",
    "CallTimeout",
    "Checkpointed",
    "ClientError",
    "Clock",
    "Cut",
    "DrainTimeout",
    "Durable",
    "Entry",
    "HostClient",
    "HostGone",
    "Journal",
    "JournalBusy",
    "Message",
    "MessageEnd",
    "MessageStart",
    "MessageUpdate",
    "Notice",
    "Outbox",
    "Outcome",
    "RemoteError",
    "RowRefused",
    "ToolExecutionEnd",
    "ToolExecutionStart",
    "TurnDriver",
    "TurnEnd",
    "TurnStart",
    "TurnState",
]
