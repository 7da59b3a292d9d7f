"""Host-side truncation over the protocol (ADR 0216, issue 3).

The cut is resolved against the durable transcript (identity first, count as fallback),
fails without changing anything, is a cheap no-op when retried, settles a running turn in
the same call, answers with counts only, costs what is cut rather than what is kept, and
holds across a kill -9 right after its answer. (A kill at each step *inside* a truncation
is tested in-process in ``tests/host/test_crash_points.py``.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    Client,
    StartHost,
    everything,
    get_messages,
    make_session,
    msg,
    run_cli,
    transcript,
)
from tests.e2e.turnkit import boot, cli, fails, file_state, ids_of, inflight, reply

KEYS = {"kept", "removed", "archived", "pager"}


async def cut(c: Client, sid: str, **params: Any) -> dict[str, Any]:
    """Call ``truncateFrom`` and check its answer carries counts, never messages."""
    res: dict[str, Any] = await c.call("session.truncateFrom", sessionId=sid, **params)
    assert set(res) <= KEYS, res
    assert all(isinstance(res[k], int) for k in ("kept", "removed", "archived"))
    return res


async def test_identity_comes_first(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 6)
    res = await cut(client, "s", fromMessageId="m4", truncateBefore=1)
    assert res == {"kept": 4, "removed": 2, "archived": 0}
    assert ids_of(data_dir, "s") == ["m0", "m1", "m2", "m3"]
    assert [m["id"] for m in await get_messages(client, "s")] == ["m0", "m1", "m2", "m3"]


async def test_count_is_the_fallback_for_an_unknown_id(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 6)
    res = await cut(client, "s", fromMessageId="gone", truncateBefore=2)
    assert res == {"kept": 2, "removed": 4, "archived": 0}
    assert ids_of(data_dir, "s") == ["m0", "m1"]
    res = await cut(client, "s", truncateBefore=0)
    assert res == {"kept": 0, "removed": 2, "archived": 0}
    assert transcript(data_dir, "s").read_bytes() == b""


async def test_neither_given_is_invalid_params(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 4)
    before = await everything(client, data_dir)
    err = await fails(client, "session.truncateFrom", sessionId="s")
    assert (err.code, err.name) == (-32602, "INVALID_PARAMS")
    err = await fails(client, "session.truncateFrom", sessionId="s", truncateBefore=-1)
    assert err.name == "INVALID_PARAMS"
    assert await everything(client, data_dir) == before


async def test_neither_resolving_is_not_found_and_changes_nothing(
    client: Client, data_dir: Path
) -> None:
    await make_session(client, "s", 4)
    before, stat = await everything(client, data_dir), file_state(transcript(data_dir, "s"))
    err = await fails(client, "session.truncateFrom", sessionId="s", fromMessageId="gone")
    assert (err.code, err.name, err.data["kind"]) == (-32004, "NOT_FOUND", "message")
    assert file_state(transcript(data_dir, "s")) == stat
    assert await everything(client, data_dir) == before


async def test_not_found_leaves_a_running_turn_and_its_checkpoint_alone(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    await client.call(
        "session.saveInflightMessage", sessionId="s", turnId="t1", message=reply("a1", "part")
    )
    before = await everything(client, data_dir)
    err = await fails(client, "session.truncateFrom", sessionId="s", fromMessageId="gone")
    assert err.name == "NOT_FOUND"
    # no promoted row, the checkpoint still there
    assert await everything(client, data_dir) == before
    busy = await fails(client, "session.beginTurn", sessionId="s", turnId="t2")
    assert busy.name == "AGENT_BUSY"  # the turn still runs


@pytest.mark.parametrize(
    "params",
    [
        {"truncateBefore": 6},
        {"truncateBefore": 1000},
        {"fromMessageId": "gone", "truncateBefore": 6},
    ],
    ids=["at-end", "past-end", "unknown-id-count-at-end"],
)
async def test_a_cut_at_or_past_the_end_is_a_no_op(
    client: Client, data_dir: Path, params: dict[str, Any]
) -> None:
    await make_session(client, "s", 6)
    before, stat = await everything(client, data_dir), file_state(transcript(data_dir, "s"))
    assert await cut(client, "s", **params) == {"kept": 6, "removed": 0, "archived": 0}
    assert file_state(transcript(data_dir, "s")) == stat  # same inode, size, mtime, bytes
    assert await everything(client, data_dir) == before


async def test_a_retried_regenerate_cuts_and_archives_once(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("u0"))
    await client.call("session.appendMessage", sessionId="s", message=reply("a0"))
    await client.call("session.appendMessage", sessionId="s", message=reply("a0b"))
    first = await cut(client, "s", fromMessageId="a0", truncateBefore=1)
    assert first == {
        "kept": 1,
        "removed": 2,
        "archived": 2,
        "pager": {"rootId": "u0", "revisionCount": 2, "activeRevision": 1},
    }
    before, stat = await everything(client, data_dir), file_state(transcript(data_dir, "s"))
    # The client timed out and sends the same call again: the cut is already made.
    again = await cut(client, "s", fromMessageId="a0", truncateBefore=1)
    assert again == {"kept": 1, "removed": 0, "archived": 0}
    assert file_state(transcript(data_dir, "s")) == stat
    assert await everything(client, data_dir) == before
    listed = await client.call("session.listRevisions", sessionId="s", rootId="u0")
    assert [r["messageCount"] for r in listed["revisions"]] == [2]


async def test_a_cut_in_the_middle_of_a_branch_archives_nothing(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    for m in (msg("u0"), reply("a0"), msg("tool0", "tool"), reply("a1")):
        await client.call("session.appendMessage", sessionId="s", message=m)
    res = await cut(client, "s", fromMessageId="tool0")
    assert res == {"kept": 2, "removed": 2, "archived": 0}
    assert ids_of(data_dir, "s") == ["u0", "a0"]
    assert not any((data_dir / "revisions").rglob("*.jsonl"))


async def test_a_running_turn_is_aborted_and_its_checkpoint_archived_with_the_cut(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    await client.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a1"))
    await client.call(
        "session.saveInflightMessage",
        sessionId="s",
        turnId="t1",
        message=reply("a2", "half a reply"),
    )
    # The UI regenerates while the turn still runs (its runtime is stuck or gone).
    res = await cut(client, "s", fromMessageId="a1")
    assert res == {
        "kept": 1,
        "removed": 2,
        "archived": 2,
        "pager": {"rootId": "u1", "revisionCount": 2, "activeRevision": 1},
    }
    assert ids_of(data_dir, "s") == ["u1"]
    assert not inflight(data_dir, "s").exists()
    # The turn was ended aborted in that call: the next turn begins, not AGENT_BUSY.
    assert await client.call("session.beginTurn", sessionId="s", turnId="t2") == {"turnId": "t2"}
    ended = await client.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    assert ended == {"status": "aborted", "recovered": False}
    listed = await client.call(
        "session.listRevisions", sessionId="s", rootId="u1", includeMessages=True
    )
    (rev,) = listed["revisions"]
    assert [(m["id"], m["turnId"], m.get("status")) for m in rev["messages"]] == [
        ("a1", "t1", None),
        ("a2", "t1", "aborted"),
    ]
    assert rev["messages"][1]["content"] == "half a reply"


async def test_regenerate_from_the_streaming_reply_cuts_its_promoted_row(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    await client.call(
        "session.saveInflightMessage", sessionId="s", turnId="t1", message=reply("a1", "so far")
    )
    # The UI shows the streaming reply with its id and regenerates from it.
    res = await cut(client, "s", fromMessageId="a1")
    assert res == {
        "kept": 1,
        "removed": 1,
        "archived": 1,
        "pager": {"rootId": "u1", "revisionCount": 2, "activeRevision": 1},
    }
    assert ids_of(data_dir, "s") == ["u1"]
    assert not inflight(data_dir, "s").exists()
    await client.call("session.beginTurn", sessionId="s", turnId="t2")


async def test_a_cut_that_keeps_the_promoted_checkpoint_keeps_it_as_aborted(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("u0"))
    await client.call("session.appendMessage", sessionId="s", message=reply("a0"))
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    await client.call(
        "session.saveInflightMessage", sessionId="s", turnId="t1", message=reply("a1", "so far")
    )
    # A retried cut past the end still settles the running turn, and cuts nothing.
    res = await cut(client, "s", truncateBefore=100)
    assert (res["removed"], res["archived"]) == (0, 0)
    got = await get_messages(client, "s")
    assert [(m["id"], m.get("status"), m.get("turnId")) for m in got] == [
        ("u0", None, None),
        ("a0", None, None),
        ("u1", None, "t1"),
        ("a1", "aborted", "t1"),
    ]
    assert got[3]["content"] == "so far"
    await client.call("session.beginTurn", sessionId="s", turnId="t2")


async def test_cutting_the_tail_of_a_long_transcript_does_not_copy_it(
    client: Client, data_dir: Path
) -> None:
    n = 20_000
    await client.call("session.create", sessionId="s")
    big = [msg(f"m{i}", "user" if i % 2 == 0 else "assistant") for i in range(n)]
    assert await client.call("session.replaceMessages", sessionId="s", messages=big) == {"count": n}
    path = transcript(data_dir, "s")
    old = path.read_bytes()
    offsets = [0]
    for line in old.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    ino = os.stat(path).st_ino

    # A plain cut of the last 10 lines (at a user message): the file is cut in place.
    res = await cut(client, "s", truncateBefore=n - 10)
    assert res == {"kept": n - 10, "removed": 10, "archived": 0}
    assert os.stat(path).st_ino == ino
    assert path.read_bytes() == old[: offsets[n - 10]]

    # A regenerate near the end: the root's line is restamped, everything before it kept.
    res = await cut(client, "s", fromMessageId=f"m{n - 19}")
    assert (res["kept"], res["removed"], res["archived"]) == (n - 19, 9, 1)
    assert res["pager"] == {"rootId": f"m{n - 20}", "revisionCount": 2, "activeRevision": 1}
    assert os.stat(path).st_ino == ino
    data = path.read_bytes()
    assert data[: offsets[n - 20]] == old[: offsets[n - 20]]
    assert data.count(b"\n") == n - 19
    page = await client.call("session.get", sessionId="s", limit=2)
    assert [m["id"] for m in page["messages"]] == [f"m{n - 21}", f"m{n - 20}"]
    assert page["messages"][1]["activeRevision"] == 1
    assert page["totalLines"] == n - 19


async def test_a_cut_holds_after_a_kill_right_after_its_answer(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await c.call("session.create", sessionId="s")
    await c.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    await c.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a1"))
    await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    await c.call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("u2"))
    await c.call("session.appendMessage", sessionId="s", turnId="t2", message=reply("a2"))
    await c.call("session.appendMessage", sessionId="s", turnId="t2", message=reply("a3"))
    res = await cut(c, "s", fromMessageId="a2")
    assert res["archived"] == 2
    want = file_state(transcript(data_dir, "s"))[3]
    await host.kill()
    # The data dir as the dead host left it is already consistent ...
    code, out, _ = await run_cli("verify", "--data-dir", str(data_dir))
    assert code == 0, out
    host = await boot(start_host)
    c = cli(host)
    # ... and the next host serves the cut.
    assert transcript(data_dir, "s").read_bytes() == want
    got = await get_messages(c, "s")
    assert [(m["id"], m["turnId"]) for m in got] == [("u1", "t1"), ("a1", "t1"), ("u2", "t2")]
    assert got[2]["revisionCount"] == 2 and got[2]["activeRevision"] == 1
    listed = await c.call("session.listRevisions", sessionId="s", rootId="u2", includeMessages=True)
    assert [m["id"] for m in listed["revisions"][0]["messages"]] == ["a2", "a3"]
    await c.call("session.beginTurn", sessionId="s", turnId="t3")
    assert await host.stop() == 0
    code, out, _ = await run_cli("verify", "--data-dir", str(data_dir))
    assert code == 0, out


async def test_an_edit_resend_after_a_stop_does_not_bring_the_stopped_reply_back(
    client: Client, data_dir: Path
) -> None:
    # The user pressed Stop (plain aborted: the checkpoint waits for the runtime's own
    # final row, which never came), then edited the prompt and resent it.
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    await client.call(
        "session.saveInflightMessage", sessionId="s", turnId="t1", message=reply("a1", "half")
    )
    await client.call("session.endTurn", sessionId="s", turnId="t1", status="aborted")
    res = await cut(client, "s", fromMessageId="u1")
    assert (res["kept"], res["archived"]) == (0, 0)
    assert not inflight(data_dir, "s").exists()
    await client.call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("u1e"))
    await client.call("session.appendMessage", sessionId="s", turnId="t2", message=reply("a2"))
    await client.call("session.endTurn", sessionId="s", turnId="t2", status="completed")
    assert (await client.call("session.recoverInflightMessages"))["recovered"] == []
    assert ids_of(data_dir, "s") == ["u1e", "a2"]
