"""hostcore's producer side: the durable persistence outbox and the host client (issue 5)."""

from __future__ import annotations
