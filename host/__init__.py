"""hostcore's host: durable JSONL transcripts, a SQLite index, JSON-RPC 2.0 over NDJSON.

It runs on Linux and macOS (``host._platform``). Elsewhere the package still imports, so
that ``python -m host`` can say so in one line (exit 4), and its public names raise
:class:`~host._platform.UnsupportedPlatform`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from host._platform import UnsupportedPlatform, unsupported
from host._version import __version__

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

if TYPE_CHECKING or unsupported() is None:
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
else:

    def __getattr__(name: str) -> object:
        """A public name fails with the platform's reason, anything else as usual."""
        if name in __all__:
            raise UnsupportedPlatform(f"host.{name}: {unsupported()}")
        raise AttributeError(f"module 'host' has no attribute {name!r}")
