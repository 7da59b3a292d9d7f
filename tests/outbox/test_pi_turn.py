"""The pi runtime's turn logic on the orders real pi can print them in (issue 29).

A replay prints a capture as fast as it can, so a command's answer comes after everything
captured. Real pi answers between its events: these feed a capture's lines to
:class:`~outbox._pi.PiTurn` with pi's answer put where pi puts it, and check the ids a
model's tool call ids become.
"""

from __future__ import annotations

import json
from typing import Any

from outbox._pi import PiTurn, message_id, tool_name
from outbox._rows import is_id
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "pi-rpc"


def capture(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]


def run(turn: PiTurn, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Feed ``events``; answer the barrier's get_state where ``answer`` sits in them."""
    out: list[dict[str, Any]] = []
    for ev in events:
        if ev == ANSWER:
            assert turn.barrier_id is not None, "the answer to a barrier never asked"
            ev = {
                "type": "response",
                "command": "get_state",
                "id": turn.barrier_id,
                "success": True,
            }
        out += turn.feed(ev)
        if turn.barrier:
            turn.barrier, turn.barrier_id = False, "b1"
    return out


ANSWER = {"type": "answer"}


def ends(out: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in out if e["type"] == "agent_end"]


def finals(out: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["message"]["id"], e["message"]["status"]) for e in out if e["type"] == "message_end"]


def test_a_retry_answered_during_its_delay_stays_in_the_turn() -> None:
    events = capture("retry")
    at = next(i for i, e in enumerate(events) if e["type"] == "auto_retry_start") + 1
    out = run(PiTurn("t"), [*events[:at], ANSWER, *events[at:]])  # pi's own order
    assert ends(out) == ["completed"]
    assert finals(out) == [("t:a0", "error"), ("t:a1", "complete")]


def test_an_error_answered_before_any_retry_ends_the_turn() -> None:
    events = capture("error")
    out = run(PiTurn("t"), [*events, ANSWER])
    assert ends(out) == ["error"]
    assert finals(out) == [("t:a0", "error")]


def test_a_stop_during_the_retry_delay_ends_the_turn_stopped() -> None:
    events = capture("retry")
    at = next(i for i, e in enumerate(events) if e["type"] == "auto_retry_start") + 1
    turn = PiTurn("t")
    out = run(turn, events[:at])
    turn.stop_requested = True  # the app sends abort: pi cancels the retry's delay
    cancelled = {"type": "auto_retry_end", "success": False, "attempt": 1}
    out += run(turn, [cancelled | {"finalError": "Retry cancelled"}, ANSWER])
    assert ends(out) == ["stopped"]
    assert finals(out) == [("t:a0", "error")]


def test_retries_given_up_end_the_turn_as_an_error() -> None:
    events = capture("error")
    given_up = {"type": "auto_retry_end", "success": False, "attempt": 3, "finalError": "x"}
    out = run(PiTurn("t"), [*events, given_up, ANSWER])
    assert ends(out) == ["error"]


def test_a_prompt_pi_refuses_ends_the_turn_as_an_error() -> None:
    turn = PiTurn("t")
    turn.prompt_id = "p"
    refused = {"id": "p", "type": "response", "command": "prompt", "success": False}
    out = turn.feed(refused | {"error": "No API key found for mock."})
    assert ends(out) == ["error"] and turn.error == "No API key found for mock."


def test_tool_call_ids_become_host_ids() -> None:
    turn_id = "s0-r1-t4"
    for call_id in (
        "call_mock_1",
        "toolu_01A09q90qw90lq917835lq9",
        "call_kR8Xv2|fc_68a1b2c3d4e5f60718293a4b5c6d7e8f",  # OpenAI Responses: call|item
        "call 1/2",
        "",
        "x" * 600,  # the Responses API's ids run to 450+ characters
        "..",
    ):
        mid = message_id(turn_id, f"tool:{tool_name(call_id)}")
        assert is_id(mid), (call_id, mid)
        assert mid == message_id(turn_id, f"tool:{tool_name(call_id)}"), "the same every time"
    mapped = {tool_name(c) for c in ("a|b", "a_b", "a/b", "a b")}
    assert len(mapped) == 4, "ids that map alike stay apart"
    long_turn = "t" * 128
    assert is_id(message_id(long_turn, "a0")) and is_id(message_id(long_turn, "tool:x"))
    assert message_id(long_turn, "a0") != message_id(long_turn, "a1")


def test_a_tool_call_id_repeated_in_one_turn_gets_its_own_row() -> None:
    turn = PiTurn("t")
    result = {"role": "toolResult", "toolCallId": "call_0", "content": [], "isError": False}
    out = turn.feed({"type": "message_end", "message": result})
    out += turn.feed({"type": "message_end", "message": result})
    assert [e["message"]["id"] for e in out] == ["t:tool:call_0", "t:tool:call_0:2"]
