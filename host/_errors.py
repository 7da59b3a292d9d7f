"""The host's one error tree and its mapping onto JSON-RPC error objects.

    HostError
    ├── ParseError            the line is not JSON (or not UTF-8)
    ├── InvalidRequest        not a JSON-RPC 2.0 request object, or an empty batch
    ├── MethodNotFound        unknown method
    ├── InvalidParams         missing, mistyped or ill-formed params; a bad id
    ├── Internal              a bug; the write did not happen
    ├── ProtocolMismatch      handshake version is not exactly 11
    ├── NotHandshaken         any method but handshake before a good handshake
    ├── LimitExceeded         past one of the host's bounds (docs/protocol.md, Limits)
    ├── NotFound              session, message, turn or revision absent
    ├── AgentBusy             another turn is running in that session
    ├── Conflict              the call contradicts durable state
    ├── StorageError          disk full or I/O error; nothing changed on disk
    └── RequestCancelled      cancelled before it started

Foreign exceptions (``OSError``, ``sqlite3.Error``) become ``StorageError`` in
:func:`to_error_object` and nowhere else; tracebacks go to the log, never into ``data``.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
from typing import Any, ClassVar, Literal

from msgspec import UNSET, Struct, UnsetType

log = logging.getLogger("host")

NotFoundKind = Literal["session", "message", "turn", "revision"]


class ErrorData(Struct, rename="camel", omit_defaults=True, forbid_unknown_fields=True):
    """Base of the members an error's ``data`` carries beside ``code`` (the schema's source)."""


class ProtocolMismatchData(ErrorData):
    expected: int
    got: Any


class LimitExceededData(ErrorData):
    limit: int | UnsetType = UNSET


class NotHandshakenData(ErrorData):
    limit: float | UnsetType = UNSET  # at a socket connection's handshake deadline: seconds


class NotFoundData(ErrorData):
    kind: NotFoundKind


class AgentBusyData(ErrorData):
    turn_id: str


class ConflictData(ErrorData):
    message_id: str | UnsetType = UNSET  # the message a write or a revision conflicts on
    session_id: str | UnsetType = UNSET  # the session whose id differs only in case


class StorageErrorData(ErrorData):
    errno: str | UnsetType = UNSET
    session_id: str | UnsetType = UNSET


class HostError(Exception):
    """Base of every error the host answers with."""

    code: ClassVar[int] = -32603
    name: ClassVar[str] = "INTERNAL"
    data_type: ClassVar[type[ErrorData]] = ErrorData
    """What ``data`` holds beside ``code`` (``scripts/gen_schema.py`` types it per code)."""

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_object(self) -> dict[str, Any]:
        """Return the JSON-RPC error object for this error."""
        return {
            "code": self.code,
            "message": self.message,
            "data": {"code": self.name, **self.data},
        }


class ParseError(HostError):
    """Raised when a line is not valid UTF-8 JSON."""

    code, name = -32700, "PARSE_ERROR"


class InvalidRequest(HostError):
    """Raised when a value is not a JSON-RPC 2.0 request object, or a batch is empty."""

    code, name = -32600, "INVALID_REQUEST"


class MethodNotFound(HostError):
    """Raised when the method is not one the host serves."""

    code, name = -32601, "METHOD_NOT_FOUND"


class InvalidParams(HostError):
    """Raised when params are missing, mistyped or ill-formed, or an id is not allowed."""

    code, name = -32602, "INVALID_PARAMS"


class Internal(HostError):
    """Raised for a bug in the host; the write did not happen."""

    code, name = -32603, "INTERNAL"


class ProtocolMismatch(HostError):
    """Raised when a handshake names a protocol version other than the host's."""

    code, name = -32001, "PROTOCOL_MISMATCH"
    data_type = ProtocolMismatchData


class NotHandshaken(HostError):
    """Raised for any method but ``handshake`` before a good handshake on the connection."""

    code, name = -32002, "NOT_HANDSHAKEN"
    data_type = NotHandshakenData


class LimitExceeded(HostError):
    """Raised when a request or its answer would pass one of the host's bounds (a 64 MiB
    line, a message over 64 MiB - 4 KiB, a batch's elements, the request bytes held, the
    connections)."""

    code, name = -32003, "LIMIT_EXCEEDED"
    data_type = LimitExceededData


class NotFound(HostError):
    """Raised when a session, message, turn or revision is absent (``data.kind``)."""

    code, name = -32004, "NOT_FOUND"
    data_type = NotFoundData

    def __init__(self, kind: NotFoundKind, ident: str | int | None = None) -> None:
        what = kind if ident is None else f"{kind} {ident!r}"
        super().__init__(f"{what} not found", kind=kind)


class AgentBusy(HostError):
    """Raised when another turn of the session is running."""

    code, name = -32005, "AGENT_BUSY"
    data_type = AgentBusyData


class Conflict(HostError):
    """Raised when a call contradicts durable state (a display-capped row written back)."""

    code, name = -32006, "CONFLICT"
    data_type = ConflictData


class StorageError(HostError):
    """Raised when the disk fails (full, I/O error); nothing changed on disk."""

    code, name = -32007, "STORAGE_ERROR"
    data_type = StorageErrorData


class RequestCancelled(HostError):
    """Raised when ``$/cancelRequest`` reached a request still waiting for its lock."""

    code, name = -32800, "REQUEST_CANCELLED"


def to_error_object(exc: BaseException, method: str | None = None) -> dict[str, Any]:
    """Map any exception raised by a call onto its JSON-RPC error object."""
    if isinstance(exc, HostError):
        return exc.to_object()
    if isinstance(exc, OSError):
        name = errno.errorcode.get(exc.errno or 0, "EIO")
        log.error("storage error in %s: %s", method, exc)
        return StorageError(f"storage error: {exc.strerror or exc}", errno=name).to_object()
    if isinstance(exc, sqlite3.Error):
        log.error("index error in %s: %s", method, exc)
        return StorageError(f"index error: {exc}").to_object()
    log.exception("internal error in %s", method, exc_info=exc)
    return Internal(f"internal error in {method}: {type(exc).__name__}").to_object()
