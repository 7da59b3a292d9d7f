"""Turns over the protocol: one running turn per session, idempotent begin and end.

``beginTurn`` appends its prompt directly with the turn's id; a second turn while one
runs is ``AGENT_BUSY``; repeating a begin or an end changes nothing (a client that timed
out and retries must not get a second prompt or a second settlement).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Client, StartHost, dumps, everything, msg, transcript
from tests.e2e.turnkit import boot, cli, fails, file_state, inflight, lines_of, reboot, reply


async def test_begin_turn_with_prompt_appends_it_stamped_with_the_turn(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("u0"))
    # The prompt names another turn: the call's turnId is the one stored.
    res = await client.call(
        "session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", turnId="other")
    )
    assert res == {"turnId": "t1", "line": 1}
    stored = lines_of(data_dir, "s")
    assert [m["id"] for m in stored] == ["u0", "u1"]
    assert stored[1]["turnId"] == "t1"
    assert stored[1]["content"] == "text of u1"
    got = await client.call("session.get", sessionId="s")
    assert got["messages"][1]["turnId"] == "t1"


# Found at 5dc1f2c by a protocol review: an assistant "prompt" was appended and its turn
# opened; PROTOCOL.md's beginTurn appends the user prompt.
@pytest.mark.parametrize("role", ["assistant", "tool", "system"])
async def test_begin_turn_with_a_prompt_that_is_no_user_message_changes_nothing(
    client: Client, data_dir: Path, role: str
) -> None:
    await client.call("session.create", sessionId="s")
    before = await everything(client, data_dir)
    err = await fails(
        client, "session.beginTurn", sessionId="s", turnId="t1", prompt=msg("x1", role)
    )
    assert (err.code, err.name) == (-32602, "INVALID_PARAMS") and role in err.error["message"]
    assert await everything(client, data_dir) == before
    ok = await client.call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("u2"))
    assert ok["turnId"] == "t2"  # no turn was left running


async def test_begin_turn_without_prompt_appends_nothing(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    assert await client.call("session.beginTurn", sessionId="s", turnId="t1") == {"turnId": "t1"}
    assert transcript(data_dir, "s").read_bytes() == b""


async def test_second_turn_while_one_runs_is_agent_busy_and_changes_nothing(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    before = await everything(client, data_dir)
    err = await fails(client, "session.beginTurn", sessionId="s", turnId="t2", prompt=msg("u2"))
    assert (err.code, err.name) == (-32005, "AGENT_BUSY")
    assert await everything(client, data_dir) == before  # the refused prompt was not appended

    # Another session is not busy; and once t1 ends, t2 may begin.
    await client.call("session.create", sessionId="other")
    await client.call("session.beginTurn", sessionId="other", turnId="t2")
    await client.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    res = await client.call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("u2"))
    assert res == {"turnId": "t2", "line": 1}


async def test_two_turns_begun_in_one_write_the_second_is_busy(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    futs, lines = [], []
    for tid, prompt in (("t1", "u1"), ("t2", "u2")):
        rid = client.next_id()
        futs.append(client.expect(rid))
        params = {"sessionId": "s", "turnId": tid, "prompt": msg(prompt)}
        lines.append(dumps(client.envelope("session.beginTurn", params, rid)) + b"\n")
    await client.send_raw(b"".join(lines))
    first, second = [await client.wait(f) for f in futs]
    assert first["result"] == {"turnId": "t1", "line": 0}
    assert second["error"]["data"]["code"] == "AGENT_BUSY"
    assert [m["id"] for m in lines_of(data_dir, "s")] == ["u1"]


async def test_same_turn_again_is_a_no_op(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    first = await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    before = file_state(transcript(data_dir, "s"))
    # A retry of the same call, while the turn runs: not AGENT_BUSY, no second prompt line.
    again = await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    assert again == first == {"turnId": "t1", "line": 0}
    # The same turn with another prompt: still a no-op, that prompt is not appended.
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u9"))
    assert file_state(transcript(data_dir, "s")) == before
    # Once ended, beginning it again does not reopen it: the next turn is not busy.
    await client.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    end = await client.call("session.endTurn", sessionId="s", turnId="t1", status="error")
    assert end == {"status": "completed", "recovered": False}
    await client.call("session.beginTurn", sessionId="s", turnId="t2")
    assert [m["id"] for m in lines_of(data_dir, "s")] == ["u1"]


@pytest.mark.parametrize("first", ["completed", "error", "aborted"])
async def test_ending_an_ended_turn_returns_its_state_and_changes_nothing(
    client: Client, data_dir: Path, first: str
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    done = await client.call("session.endTurn", sessionId="s", turnId="t1", status=first)
    assert done == {"status": first, "recovered": False}
    # A checkpoint of that turn arrives late; ending again must not settle it.
    saved = await client.call(
        "session.saveInflightMessage", sessionId="s", turnId="t1", message=reply("a1")
    )
    assert saved == {"saved": True}
    before = await everything(client, data_dir)
    for status in ("completed", "error", "aborted"):
        again = await client.call(
            "session.endTurn", sessionId="s", turnId="t1", status=status, recoverInflight=True
        )
        assert again == {"status": first, "recovered": False}
    assert await everything(client, data_dir) == before
    assert inflight(data_dir, "s").exists()


async def test_end_turn_of_an_unknown_turn_is_not_found(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1")
    before = await everything(client, data_dir)
    err = await fails(client, "session.endTurn", sessionId="s", turnId="nope", status="completed")
    assert (err.code, err.name, err.data["kind"]) == (-32004, "NOT_FOUND", "turn")
    assert await everything(client, data_dir) == before
    # A turn of another session is unknown here too.
    await client.call("session.create", sessionId="s2")
    err = await fails(client, "session.endTurn", sessionId="s2", turnId="t1", status="aborted")
    assert err.data["kind"] == "turn"


UNKNOWN_SESSION_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("session.beginTurn", {"turnId": "t1", "prompt": msg("u1")}),
    ("session.endTurn", {"turnId": "t1", "status": "completed"}),
    ("session.saveInflightMessage", {"turnId": "t1", "message": reply("a1")}),
    ("session.saveRevision", {"rootId": "u1", "messages": [reply("a1")]}),
    ("session.listRevisions", {"rootId": "u1"}),
    ("session.saveActiveRevision", {}),
    ("session.activateRevision", {"rootId": "u1", "revision": 0}),
    ("session.truncateFrom", {"truncateBefore": 0}),
]


@pytest.mark.parametrize(
    ("method", "params"), UNKNOWN_SESSION_CALLS, ids=[m for m, _ in UNKNOWN_SESSION_CALLS]
)
async def test_unknown_session_is_not_found_and_creates_nothing(
    client: Client, data_dir: Path, method: str, params: dict[str, Any]
) -> None:
    await client.call("session.create", sessionId="s")
    before = await everything(client, data_dir)
    err = await fails(client, method, sessionId="ghost", **params)
    assert (err.code, err.name, err.data["kind"]) == (-32004, "NOT_FOUND", "session")
    assert await everything(client, data_dir) == before
    assert not list(data_dir.rglob("ghost*"))


async def test_a_running_turn_is_aborted_by_a_restart(start_host: StartHost) -> None:
    host = await boot(start_host)
    c = cli(host)
    await c.call("session.create", sessionId="s")
    await c.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    host = await reboot(start_host, host)
    c = cli(host)
    # Not busy any more: the new turn begins, and the old one reads back as aborted.
    await c.call("session.beginTurn", sessionId="s", turnId="t2")
    end = await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    assert end == {"status": "aborted", "recovered": False}
