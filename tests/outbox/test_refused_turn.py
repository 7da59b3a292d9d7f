"""A row ``enqueue`` refuses, through ``drive --agent pi`` (issue 36, case 6).

The outbox takes every row the host takes (``test_bad_rows.py`` holds it to the host's
bounds): a reply nested 300 levels, which the host stores, is stored. A row refused anyway
(here a tool result over the host's 64 MiB message limit) ends its turn on the host with a
stated status, ``error``; ``drive`` says so and exits non-zero, and the other sessions go on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import run_view
from tests.outbox.kit import capture, drive_pi, finished, spawned, stored

CALL = '"arguments":{"command":"echo hi"}'  # the tool call's arguments, wherever pi prints them
T = "r1-t0"  # drive's first turn, after the session's name


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


async def turns(data: Path, session: str) -> list[tuple[str, str]]:
    code, out, err = await run_view("inspect", "--data-dir", str(data / "host"), session, "--json")
    assert code == 0, err
    return [(t["turnId"], t["status"]) for t in json.loads(out)["turns"]]


async def test_a_reply_nested_300_levels_is_stored_as_the_host_would(tmp_path: Path) -> None:
    # The model's tool call carries a plan nested 296 levels: the reply nests 300
    # (message, content, the toolCall block, its arguments, then the plan).
    plan = "[" * 296 + "]" * 296
    pi = capture(
        tmp_path / "captures",
        "tool",
        "tool",
        lambda lines: [x.replace(CALL, CALL[:-1] + f',"plan":{plan}}}') for x in lines],
    )
    data = tmp_path / "data"
    args = ("--sessions", "1", "--turns", "1")
    code, facts, err = await finished(await drive_pi(data, str(pi), *args))
    assert code == 0, err
    assert facts[-1]["outcomes"] == {"completed": 1}, err
    async with spawned(data / "host") as client:
        rows = await stored(client, "s0")
    assert [m["id"] for m in rows] == [f"s0-{T}:{n}" for n in ("u", "a0", "tool:call_mock_1", "a1")]
    assert depth(rows[1]) == 300
    assert await turns(data, "s0") == [(f"s0-{T}", "completed")]


def huge_tool_result(lines: list[str]) -> list[str]:
    """The tool's output, as pi's ``message_end`` gives it, over 64 MiB (the other events'
    copies are left small: the adapter takes the row from ``message_end`` alone)."""
    big = '"text":"' + "x" * (64 * 1024 * 1024) + '"'
    end = '{"type":"message_end","message":{"role":"toolResult"'
    return [x.replace('"text":"hi\\n"', big) if x.startswith(end) else x for x in lines]


async def test_a_refused_row_ends_its_turn_as_an_error_and_drive_says_so(tmp_path: Path) -> None:
    captures = tmp_path / "captures"
    capture(captures, "s0", "tool", huge_tool_result)  # session s0's pi
    capture(captures, "s1", "tool")  # session s1's: the capture as pi printed it
    data = tmp_path / "data"
    args = ("--sessions", "2", "--turns", "1")
    code, facts, err = await finished(await drive_pi(data, str(captures / "{session}"), *args))
    assert code == 1, err
    assert f"s0: turn s0-{T} ended as an error: row refused" in err
    assert "over the host's limit" in err
    assert "drive: 1 row(s) refused" in err.splitlines()[-1]
    done = facts[-1]
    assert done["rowsRefused"] == 1 and done["outcomes"] == {"completed": 1, "error": 1}
    async with spawned(data / "host") as client:
        s0 = [m["id"] for m in await stored(client, "s0")]
        s1 = [m["id"] for m in await stored(client, "s1")]
    assert s0 == [f"s0-{T}:u", f"s0-{T}:a0"], "the turn ends at the refused row"
    assert s1 == [f"s1-{T}:{n}" for n in ("u", "a0", "tool:call_mock_1", "a1")]
    assert await turns(data, "s0") == [(f"s0-{T}", "error")], "ended, not left running"
    assert await turns(data, "s1") == [(f"s1-{T}", "completed")]
