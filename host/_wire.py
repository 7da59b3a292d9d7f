"""The typed wire: one msgspec ``Struct`` for every method's params and result.

Decoding is two-phase (house rule 2): the envelope is decoded with ``params:
msgspec.Raw``, then the method's own decoder, built once, decodes the params. A valid
request takes a shortcut first: :data:`REQUEST`, one tagged ``Struct`` per method, decodes
envelope and params in one pass (a 1 MB snapshot is scanned once, not twice). Anything
it refuses goes the two-phase way, which alone decides the error to answer.
Messages stay ``msgspec.Raw`` (the caller's bytes) all the way to the store.
``docs/protocol.md`` is checked against :data:`METHODS` by ``tests/test_protocol_doc.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

from host._surrogates import decode

PROTOCOL_VERSION = 11
MAX_LINE = 64 * 1024 * 1024  # 67,108,864 bytes, newline excluded
MESSAGE_ROOM = 4096
"""Bytes of the line limit a message leaves for what the host adds to it once stored
(``turnId``, ``status``, the pager stamp: a few hundred bytes at most) and for the answer
that carries it alone: every stored line stays readable as a page of one."""
MAX_MESSAGE = MAX_LINE - MESSAGE_ROOM  # 67,104,768 bytes, as the caller sends it
MAX_BATCH = 1_024
"""The most elements a batch may hold (the outbox sends 256 at most)."""

ID_PATTERN = r"^(?!\.\.?\Z)[A-Za-z0-9._:-]{1,128}\Z"  # \Z: "$" would let "ab\n" in
Id = Annotated[str, Meta(pattern=ID_PATTERN)]
"""A session, turn, message or root id: 1-128 of ``[A-Za-z0-9._:-]``, not ``.``/``..``."""

RequestId = int | str | None


class Params(Struct, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    """Base of every method's params: unknown fields are INVALID_PARAMS."""


class Result(Struct, rename="camel", omit_defaults=True):
    """Base of every method's result."""


# -- envelope ---------------------------------------------------------------------------


class Envelope(Struct):
    """One JSON-RPC 2.0 request or notification, params left undecoded."""

    jsonrpc: str
    method: str
    params: Raw | UnsetType = UNSET
    id: RequestId | UnsetType = UNSET


class IdOnly(Struct):
    """Just enough of a bad request to answer it by id."""

    id: Any = None


# -- host -------------------------------------------------------------------------------


class HandshakeParams(Params):
    protocol_version: int
    client: dict[str, Any] | UnsetType = UNSET


class HandshakeResult(Result):
    protocol_version: int
    host_version: str
    methods: list[str]


class EmptyParams(Params):
    pass


class StatsResult(Result):
    uptime_seconds: float
    counters: dict[str, int]
    methods: dict[str, dict[str, float]]


class ShutdownResult(Result):
    shutting_down: bool


class CancelParams(Struct, forbid_unknown_fields=True):
    id: RequestId


# -- sessions ---------------------------------------------------------------------------


class CreateParams(Params):
    session_id: Id | UnsetType = UNSET
    title: Annotated[str, Meta(max_length=1_000)] | UnsetType | None = UNSET  # MAX_TITLE


class CreateResult(Result):
    session_id: str
    created: bool


class SessionSummary(Result, omit_defaults=False):
    session_id: str
    title: str | None
    message_count: int
    updated_at: str
    created_at: str
    meta: dict[str, Raw] | None


class ListResult(Result):
    sessions: list[SessionSummary]
    cursor: str | UnsetType = UNSET  # issue 35


class SessionParams(Params):
    session_id: Id


class DeleteResult(Result):
    deleted: bool


class GetParams(Params):
    session_id: Id
    limit: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    before_line: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    display_cap: Annotated[int, Meta(ge=1)] | UnsetType = UNSET


class GetResult(Result, omit_defaults=False):
    messages: list[Raw]
    start_line: int
    end_line: int
    total_lines: int


class AppendParams(Params):
    session_id: Id
    message: Raw
    turn_id: Id | UnsetType = UNSET


class AppendResult(Result, omit_defaults=False):
    line: int
    appended: bool


class UpdateParams(Params):
    session_id: Id
    message: Raw


class LineResult(Result):
    line: int


class DeleteMessagesParams(Params):
    session_id: Id
    message_ids: list[Id]


class CountDeletedResult(Result, omit_defaults=False):
    deleted: int


class ReplaceParams(Params):
    session_id: Id
    messages: list[Raw]


class CountResult(Result, omit_defaults=False):
    count: int


# -- turns ------------------------------------------------------------------------------

TurnEnd = Literal["completed", "error", "aborted"]


class BeginTurnParams(Params):
    session_id: Id
    turn_id: Id
    prompt: Raw | UnsetType = UNSET


class BeginTurnResult(Result):
    turn_id: str
    line: int | UnsetType = UNSET


class EndTurnParams(Params):
    session_id: Id
    turn_id: Id
    status: TurnEnd
    recover_inflight: bool = False


class EndTurnResult(Result, omit_defaults=False):
    status: str
    recovered: bool


# -- checkpoints ------------------------------------------------------------------------


class SaveInflightParams(Params):
    session_id: Id
    turn_id: Id
    message: Raw


class SavedResult(Result, omit_defaults=False):
    saved: bool


class RecoveredRow(Result, omit_defaults=False):
    session_id: str
    message_id: str
    turn_id: str | None
    status: str


MAX_KEEP = 1_024
"""Sessions a ``session.recoverInflightMessages`` may name in ``keep``."""


class RecoverParams(Params):
    keep: Annotated[list[Id], Meta(max_length=MAX_KEEP)] | UnsetType = UNSET


class RecoverResult(Result, omit_defaults=False):
    recovered: list[RecoveredRow]


# -- revisions --------------------------------------------------------------------------


class SaveRevisionParams(Params):
    session_id: Id
    root_id: Id
    messages: list[Raw]


class SaveRevisionResult(Result, omit_defaults=False):
    revision: int
    revision_count: int


class ListRevisionsParams(Params):
    session_id: Id
    root_id: Id
    include_messages: bool = False


class RevisionInfo(Result):
    revision: int
    message_count: int
    created_at: str
    messages: list[Raw] | UnsetType = UNSET


class ListRevisionsResult(Result, omit_defaults=False):
    root_id: str
    revision_count: int
    active_revision: int | None
    revisions: list[RevisionInfo]


class SaveActiveParams(Params):
    session_id: Id
    root_id: Id | UnsetType = UNSET


class SaveActiveResult(Result, omit_defaults=False):
    root_id: str
    revision_count: int
    active_revision: int | None
    archived: int
    stamped: bool


class TruncateParams(Params):
    session_id: Id
    from_message_id: Id | UnsetType = UNSET
    truncate_before: Annotated[int, Meta(ge=0)] | UnsetType = UNSET


class Pager(Result, omit_defaults=False):
    root_id: str
    revision_count: int
    active_revision: int


class TruncateResult(Result):
    kept: int
    removed: int
    archived: int
    pager: Pager | UnsetType = UNSET


class ActivateParams(Params):
    session_id: Id
    root_id: Id
    revision: Annotated[int, Meta(ge=0)]


class ActivateResult(Result, omit_defaults=False):
    active_revision: int
    revision_count: int


# -- watching (issue 34: host/_watch.py) --------------------------------------------------

CURSOR_PATTERN = r"^[0-9a-f]{16}(\.(0|[1-9][0-9]{0,14})){3}\Z"
Cursor = Annotated[str, Meta(pattern=CURSOR_PATTERN)]
"""A position in what a session holds on disk: ``epoch.lines.turnLogBytes.checkpoint``,
its numbers in their shortest form, as the host writes them (a cursor is honoured exactly
when the answer's ``cursor`` is ``after``: one spelled otherwise could not be)."""


class WatchParams(Params):
    session_id: Id
    after: Cursor | UnsetType = UNSET


class WatchResult(Result, omit_defaults=False):
    watch_id: str
    cursor: str
    total_lines: int


class UnwatchParams(Params):
    watch_id: Annotated[str, Meta(max_length=64)]


class UnwatchResult(Result, omit_defaults=False):
    unwatched: bool


class PublishParams(Params):
    session_id: Id
    turn_id: Id
    data: Raw


class PublishResult(Result, omit_defaults=False):
    watchers: int


class Event(Struct, tag_field="kind", rename="camel", omit_defaults=True):
    """Base of what a ``session.event`` notification carries (its ``kind`` the tag)."""


class AppendedEvent(Event, tag="appended"):
    line: int
    message: Raw


class TurnEvent(Event, tag="turn"):
    turn_id: str
    status: Literal["running", "completed", "aborted", "error", "void"]
    at: str
    prompt_id: str | UnsetType = UNSET


class CheckpointEvent(Event, tag="checkpoint"):
    turn_id: str
    message: Raw


class ResetEvent(Event, tag="reset"):
    reason: Literal["rewritten", "expired", "overflow"]
    total_lines: int


class DeletedEvent(Event, tag="deleted"):
    pass


class LiveEvent(Event, tag="live"):
    turn_id: str
    data: Raw


AnyEvent = AppendedEvent | TurnEvent | CheckpointEvent | ResetEvent | DeletedEvent | LiveEvent


class SessionEventParams(Struct, rename="camel"):
    """The params of the host's ``session.event`` notification."""

    watch_id: str
    cursor: str
    event: AnyEvent


# -- find and organise (issue 35) --------------------------------------------------------

MAX_TITLE = 1_000
"""Characters a title may hold (``create``, ``update``); a title stored before this bound
is clipped to it in ``session.list``."""
MAX_META = 16_384
"""Bytes a session's ``meta`` may hold, encoded as stored (after a merge)."""
LIST_PAGE, LIST_PAGE_MAX = 100, 1_000
"""``session.list``'s page without ``limit``, and its largest ``limit``: a page of
titles and ``meta`` at their bounds holds under 23 MB, far from the 64 MiB answer limit."""
SEARCH_PAGE, SEARCH_PAGE_MAX = 20, 100
"""``session.search``'s page without ``limit``, and its largest ``limit``."""
MAX_QUERY = 1_000
"""Characters a search query may hold (more is LIMIT_EXCEEDED)."""
MAX_CURSOR = 1_024
"""Characters of a ``cursor`` (``session.list``, ``session.search``)."""
Title = Annotated[str, Meta(max_length=MAX_TITLE)]


class ListParams(Params):
    limit: Annotated[int, Meta(ge=1, le=LIST_PAGE_MAX)] | UnsetType = UNSET
    cursor: Annotated[str, Meta(max_length=MAX_CURSOR)] | UnsetType = UNSET
    order: Literal["updated", "created"] = "updated"
    pinned_first: bool = False


class UpdateSessionParams(Params):
    session_id: Id
    title: Title | UnsetType | None = UNSET
    meta: dict[str, Raw] | UnsetType = UNSET


class UpdateSessionResult(Result, omit_defaults=False):
    session_id: str
    title: str | None
    meta: dict[str, Raw] | None
    changed: bool


class ForkParams(Params):
    session_id: Id
    at_message_id: Id
    new_session_id: Id | UnsetType = UNSET


class ForkResult(Result, omit_defaults=False):
    session_id: str
    created: bool
    message_count: int


class SearchParams(Params):
    query: str
    session_id: Id | UnsetType = UNSET
    limit: Annotated[int, Meta(ge=1, le=SEARCH_PAGE_MAX)] | UnsetType = UNSET
    cursor: Annotated[str, Meta(max_length=MAX_CURSOR)] | UnsetType = UNSET
    tools: bool = False
    scope: Literal["active", "all"] = "active"


class Snippet(Result, omit_defaults=False):
    text: str
    ranges: list[tuple[int, int]]


class SearchHit(Result):
    session_id: str
    message_id: str
    line: int
    role: str
    score: float
    snippet: Snippet
    root_id: str | UnsetType = UNSET
    revision: int | UnsetType = UNSET


class SearchResult(Result):
    hits: list[SearchHit]
    partial: bool
    pending: int
    candidates: int
    cursor: str | UnsetType = UNSET


# -- the method table -------------------------------------------------------------------

METHODS: dict[str, tuple[type[Struct], type[Struct]]] = {
    "handshake": (HandshakeParams, HandshakeResult),
    "session.create": (CreateParams, CreateResult),
    "session.list": (ListParams, ListResult),
    "session.delete": (SessionParams, DeleteResult),
    "session.get": (GetParams, GetResult),
    "session.appendMessage": (AppendParams, AppendResult),
    "session.updateMessage": (UpdateParams, LineResult),
    "session.deleteMessages": (DeleteMessagesParams, CountDeletedResult),
    "session.replaceMessages": (ReplaceParams, CountResult),
    "session.beginTurn": (BeginTurnParams, BeginTurnResult),
    "session.endTurn": (EndTurnParams, EndTurnResult),
    "session.saveInflightMessage": (SaveInflightParams, SavedResult),
    "session.recoverInflightMessages": (RecoverParams, RecoverResult),
    "session.saveRevision": (SaveRevisionParams, SaveRevisionResult),
    "session.listRevisions": (ListRevisionsParams, ListRevisionsResult),
    "session.saveActiveRevision": (SaveActiveParams, SaveActiveResult),
    "session.truncateFrom": (TruncateParams, TruncateResult),
    "session.activateRevision": (ActivateParams, ActivateResult),
    "session.watch": (WatchParams, WatchResult),
    "session.unwatch": (UnwatchParams, UnwatchResult),
    "session.publish": (PublishParams, PublishResult),
    "session.update": (UpdateSessionParams, UpdateSessionResult),  # issue 35
    "session.fork": (ForkParams, ForkResult),
    "session.search": (SearchParams, SearchResult),
    "host.stats": (EmptyParams, StatsResult),
    "host.shutdown": (EmptyParams, ShutdownResult),
}
"""Every method the host serves: name -> (params type, result type)."""

DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    name: msgspec.json.Decoder(params) for name, (params, _) in METHODS.items()
}
ENVELOPE = msgspec.json.Decoder(Envelope)


def _request_type(method: str, params: type[Struct]) -> type[Struct]:
    """One method's whole request, tagged by its ``method`` (ids and params typed)."""
    return msgspec.defstruct(
        "Request_" + method.replace(".", "_"),
        [
            ("jsonrpc", str),
            ("params", params | UnsetType, UNSET),
            ("id", RequestId | UnsetType, UNSET),
        ],
        tag_field="method",
        tag=method,
    )


REQUEST_TYPES: dict[type[Struct], str] = {
    _request_type(name, params): name
    for name, (params, _) in METHODS.items()
    if name != "handshake"
}
"""The shortcut's request types (a handshake is always decoded two-phase): type -> method."""
REQUEST: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Union[tuple(REQUEST_TYPES)])  # noqa: UP007
"""Decodes a valid request to its method's type in one pass; raises on anything else.

msgspec finds the tag without a second pass when ``method`` comes before ``params`` (as
every client here sends it); after them, it costs the two passes of the two-phase way.
"""
_NO_ELEMENT = Raw(b"")
_BATCH = msgspec.json.Decoder(
    msgspec.defstruct(
        "Batch",
        [(f"e{i}", Raw, msgspec.field(default=_NO_ELEMENT)) for i in range(MAX_BATCH + 1)],
        array_like=True,
    )
)


class BatchTooLong(Exception):
    """Raised by :func:`batch_items` for a batch of more than :data:`MAX_BATCH` elements."""


def batch_items(line: bytes) -> list[Raw]:
    """The elements of a batch line (a JSON array), at most :data:`MAX_BATCH` of them.

    Decoded as an array-like Struct of ``MAX_BATCH + 1`` fields, which keeps no more than
    that (the rest is checked to be JSON and skipped): a 64 MiB line of ``[1,1,...]`` costs
    one scan, not 33 million objects. ``msgspec.DecodeError`` when the line is not JSON,
    :class:`BatchTooLong` past the cap.
    """
    batch = decode(_BATCH, line)  # a half surrogate pair in an element is JSON too
    # An element is never empty (b"" is no JSON); told apart by identity it was not: the
    # surrogate decode rebuilds every Raw, so each absent element counted as one.
    items = [x for x in msgspec.structs.astuple(batch) if len(x)]
    if len(items) > MAX_BATCH:
        raise BatchTooLong(f"a batch may hold at most {MAX_BATCH:,} elements")
    return items


ID_ONLY = msgspec.json.Decoder(IdOnly)
ENCODER = msgspec.json.Encoder()
CANCEL = msgspec.json.Decoder(CancelParams)
