"""What pi prints that a plain decode cannot read, through ``drive --agent pi`` (issue 36, 4).

pi is Node: its grep tool cuts long lines with ``line.slice(0, 500)``, which can split a
surrogate pair, and ``JSON.stringify`` writes the half as ``\\ud83d``. The host reads such
text (``host/_surrogates.py``) and so must the pi adapter: the tool row is stored and the
turn ends. A line that cannot be read even so ends its turn as an error, logged, never
left waiting for an ``agent_end`` that was in it.

The stand-in pi plays pi's own capture of a tool call (``tests/fixtures/pi-rpc/tool``), its
lines edited only where the case says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import run_view
from tests.outbox.kit import capture, drive_pi, finished, spawned, stored

OUTPUT = '"text":"hi\\n"'  # the tool's output, in every line that holds it (JSON text)
HALF = '"text":"hi \\ud83d\\n"'  # "hi 😀\n" cut inside the emoji, as JSON.stringify writes it
DEEP = "[" * 3000 + "]" * 3000  # nested past what any decoder here reads
T = "s0-r1-t0"  # drive's first turn of session s0


def half_emoji(lines: list[str]) -> list[str]:
    return [line.replace(OUTPUT, HALF) for line in lines]


def deep_details(lines: list[str]) -> list[str]:
    """The tool result's ``details`` (an extension tool's own data) nested 3,000 levels."""
    result = OUTPUT + '}],"isError":false'  # the toolResult message, wherever pi prints it
    return [line.replace(result, f'{result},"details":{DEEP}') for line in lines]


async def turns(data: Path, session: str) -> list[tuple[str, str]]:
    code, out, err = await run_view("inspect", "--data-dir", str(data / "host"), session, "--json")
    assert code == 0, err
    return [(t["turnId"], t["status"]) for t in json.loads(out)["turns"]]


def text(row: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in row["content"])


async def test_a_tool_row_holding_half_an_emoji_is_stored_and_its_turn_completes(
    tmp_path: Path,
) -> None:
    pi = capture(tmp_path / "captures", "tool", "tool", half_emoji)
    data = tmp_path / "data"
    code, facts, err = await finished(
        await drive_pi(data, str(pi), "--sessions", "1", "--turns", "1")
    )
    assert code == 0, err
    assert facts[-1]["outcomes"] == {"completed": 1}, err
    async with spawned(data / "host") as client:
        rows = await stored(client, "s0")
    assert [(m["id"], m["role"]) for m in rows] == [
        (f"{T}:u", "user"),
        (f"{T}:a0", "assistant"),
        (f"{T}:tool:call_mock_1", "tool"),
        (f"{T}:a1", "assistant"),
    ]
    # A half pair cannot be text in Python: it is read as the host reads what it only
    # looks at, as U+FFFD (pi's message is rebuilt as the row, so it is kept as text).
    assert text(rows[2]) == "hi \ufffd\n"
    assert await turns(data, "s0") == [(T, "completed")]


async def test_a_line_that_cannot_be_read_ends_its_turn_as_an_error_and_says_so(
    tmp_path: Path,
) -> None:
    pi = capture(tmp_path / "captures", "tool", "tool", deep_details)
    data = tmp_path / "data"
    code, facts, err = await finished(
        await drive_pi(data, str(pi), "--sessions", "1", "--turns", "1")
    )
    assert code == 0, err
    assert facts[-1]["outcomes"] == {"error": 1}
    assert "pi printed a line that cannot be read" in err
    assert f"turn {T} ends as an error" in err
    async with spawned(data / "host") as client:
        rows = await stored(client, "s0")
    # Stored up to the line that was lost; nothing after it is taken as the turn's.
    assert [m["id"] for m in rows] == [f"{T}:u", f"{T}:a0"]
    assert await turns(data, "s0") == [(T, "error")]
