"""The events an agent runtime gives the turn driver, and the notices the driver gives back.

A runtime is any ``AsyncIterator[AgentEvent]``: one turn's stream, ended by
:class:`AgentEnd` (a stream that stops without one is a runtime that died: the driver
ends the turn ``aborted`` and promotes its checkpoint). The driver acts on four kinds
and passes over the rest, which runtimes send for their own UIs:

    MessageUpdate       a snapshot of the reply so far: checkpointed, throttled
    MessageEnd          a finished message: its final row goes through the outbox
    ToolExecutionEnd    a tool's result row: through the outbox, never checkpointed
    AgentEnd            how the turn ended: completed, stopped (the user's Stop) or error

Events are plain dicts typed as ``TypedDict``s, so a runtime that reads JSON events (or
builds them by hand) passes them on as they are. A message is an object with ``id`` and
``role`` and whatever else the app keeps (``content``, ``status``, usage, ...): the host
stores it as the caller's bytes, so it is typed as an open ``dict`` (:data:`Message`).
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias, TypedDict

Message: TypeAlias = dict[str, Any]
"""A message: a JSON object with ``id`` and ``role``; every other field is the app's."""

Outcome: TypeAlias = Literal["completed", "stopped", "error", "crashed"]
"""How a turn ended: an :class:`AgentEnd`'s reason, or ``crashed`` when the stream ended
without one (the runtime is gone)."""


class TurnStart(TypedDict):
    """The runtime started the turn (passed over by the driver)."""

    type: Literal["turn_start"]
    turnId: str


class MessageStart(TypedDict):
    """A message began streaming (passed over: its first update is checkpointed)."""

    type: Literal["message_start"]
    message: Message


class MessageUpdate(TypedDict):
    """The whole message so far. An assistant message's newest snapshot is checkpointed
    at most every 1.5 s, with a trailing write; a ``delegate`` message never is."""

    type: Literal["message_update"]
    message: Message


class MessageEnd(TypedDict):
    """A finished message. For an assistant message the final snapshot is checkpointed
    first; then the message is enqueued as the turn's row (``status`` as the app set it:
    ``complete``, ``aborted`` or ``error``)."""

    type: Literal["message_end"]
    message: Message


class ToolExecutionStart(TypedDict):
    """A tool call began (passed over by the driver)."""

    type: Literal["tool_execution_start"]
    toolCallId: str


class ToolExecutionEnd(TypedDict):
    """A tool call's result: ``row`` is enqueued as the turn's row, never checkpointed."""

    type: Literal["tool_execution_end"]
    toolCallId: str
    row: Message


class TurnEnd(TypedDict):
    """The runtime finished the turn's work (passed over: :class:`AgentEnd` ends it)."""

    type: Literal["turn_end"]
    turnId: str


class AgentEnd(TypedDict):
    """The last event of a turn: ``completed``, ``stopped`` (the user's Stop: the reply
    ends ``aborted``) or ``error``. The driver ends the turn on the host accordingly."""

    type: Literal["agent_end"]
    reason: Literal["completed", "stopped", "error"]


AgentEvent: TypeAlias = (
    TurnStart
    | MessageStart
    | MessageUpdate
    | MessageEnd
    | ToolExecutionStart
    | ToolExecutionEnd
    | TurnEnd
    | AgentEnd
)
"""One event of a turn's stream, as :meth:`TurnDriver.run` consumes it."""


class Durable(TypedDict):
    """Notice: a message is durable (a row in the outbox journal, or a prompt the host
    stored): it may be shown as saved."""

    event: Literal["durable"]
    sessionId: str
    messageId: str


class Checkpointed(TypedDict):
    """Notice: the host saved a checkpoint of the streaming reply (``chars`` of text)."""

    event: Literal["checkpoint"]
    sessionId: str
    messageId: str
    chars: int


class Cut(TypedDict):
    """Notice: a regenerate cut these messages away (``truncate_last_reply``)."""

    event: Literal["cut"]
    sessionId: str
    messageIds: list[str]


Notice: TypeAlias = Durable | Checkpointed | Cut
"""What the driver tells the app through its ``emit`` callback."""
