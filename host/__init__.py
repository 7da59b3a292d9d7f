"""hostcore's host: durable JSONL transcripts, a SQLite index, JSON-RPC 2.0 over NDJSON."""

from __future__ import annotations

__version__ = "0.1.0"

from host._errors import (
    AgentBusy,
    Conflict,
    HostError,
    InvalidParams,
    LimitExceeded,
    NotFound,
    StorageError,
)
from host._fs import FileSystem
from host._service import Host
from host._wire import MAX_LINE, METHODS, PROTOCOL_VERSION

__all__ = [
    "MAX_LINE",
    "METHODS",
    "PROTOCOL_VERSION",
    "AgentBusy",
    "Conflict",
    "FileSystem",
    "Host",
    "HostError",
    "InvalidParams",
    "LimitExceeded",
    "NotFound",
    "StorageError",
    "__version__",
]
