"""hostcore's producer side: the durable persistence outbox and the host client.

The turn driver, the simulated agent and ``python -m outbox drive`` are issue 5's
remaining work; what is here is the journal, the outbox drain and the host client.
"""

from __future__ import annotations

from outbox._client import CallTimeout, ClientError, HostClient, HostGone, RemoteError
from outbox._journal import Entry, Journal
from outbox._outbox import DrainTimeout, Outbox

__all__ = [
    "CallTimeout",
    "ClientError",
    "DrainTimeout",
    "Entry",
    "HostClient",
    "HostGone",
    "Journal",
    "Outbox",
    "RemoteError",
]
