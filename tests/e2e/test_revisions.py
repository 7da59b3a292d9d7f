"""The regenerate pager over the protocol (ADR 0060, ADR 0216, issue 3).

The whole story first, as a user lives it, with a kill -9 and a restart between every
step: a regenerate, its new reply archived, a second regenerate, paging back to older
branches, and an edit-resend, each giving the pager numbers PROTOCOL.md defines. Then
each rule on its own: what listing shows, that a stamp which changes nothing writes
nothing, that archives die with their session, and that ``turnId`` survives every
rewrite, swap and truncation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import (
    Client,
    StartHost,
    disk_state,
    everything,
    get_messages,
    msg,
    run_cli,
    transcript,
)
from tests.e2e.turnkit import boot, cli, fails, file_state, ids_of, lines_of, reboot, reply

TRUNCATE_KEYS = {"kept", "removed", "archived", "pager"}


async def turn(
    c: Client, sid: str, tid: str, prompt: dict[str, Any] | None, *replies: dict[str, Any]
) -> None:
    """Run one turn to completion: prompt, replies appended with the turn's id, end."""
    params: dict[str, Any] = {"prompt": prompt} if prompt is not None else {}
    await c.call("session.beginTurn", sessionId=sid, turnId=tid, **params)
    for m in replies:
        await c.call("session.appendMessage", sessionId=sid, turnId=tid, message=m)
    await c.call("session.endTurn", sessionId=sid, turnId=tid, status="completed")


async def view(c: Client, sid: str) -> list[tuple[str, str | None]]:
    """The transcript as ``(id, turnId)`` pairs, read through the protocol."""
    return [(m["id"], m.get("turnId")) for m in await get_messages(c, sid)]


def pager_of(data: Path, sid: str, root: str) -> tuple[Any, Any, Any]:
    """The root's stamp as stored in the transcript file."""
    (line,) = [m for m in lines_of(data, sid) if m["id"] == root]
    return line.get("revisionRootId"), line.get("revisionCount"), line.get("activeRevision")


async def test_regenerate_page_back_and_edit_resend_across_restarts(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await c.call("session.create", sessionId="s")
    await turn(c, "s", "t0", msg("u0"), reply("a0"))
    await turn(c, "s", "t1", msg("u1"), reply("a1"), msg("tool1", "tool"))
    # Turn completion archives the branch (ADR 0060): the root is stamped for the first time.
    saved = await c.call("session.saveActiveRevision", sessionId="s")
    assert saved == {
        "rootId": "u1",
        "revisionCount": 1,
        "activeRevision": 0,
        "archived": 2,
        "stamped": True,
    }
    host = await reboot(start_host, host)
    c = cli(host)

    # 1. Regenerate: cut the reply; its branch is archived, the root stamped for the next.
    res = await c.call("session.truncateFrom", sessionId="s", fromMessageId="a1")
    assert res == {
        "kept": 3,
        "removed": 2,
        "archived": 2,
        "pager": {"rootId": "u1", "revisionCount": 2, "activeRevision": 1},
    }
    host = await reboot(start_host, host)
    c = cli(host)
    assert await view(c, "s") == [("u0", "t0"), ("a0", "t0"), ("u1", "t1")]
    assert pager_of(data_dir, "s", "u1") == ("u1", 2, 1)

    # 2. The new reply lands and turn completion archives it; the stamp is already right,
    #    so the transcript is not touched at all (the no-op rewrite of ADR 0060).
    await turn(c, "s", "t2", None, reply("a1b"))
    before = file_state(transcript(data_dir, "s"))
    saved = await c.call("session.saveActiveRevision", sessionId="s")
    assert saved == {
        "rootId": "u1",
        "revisionCount": 2,
        "activeRevision": 1,
        "archived": 1,
        "stamped": False,
    }
    assert file_state(transcript(data_dir, "s")) == before
    host = await reboot(start_host, host)
    c = cli(host)

    # 3. A second regenerate.
    res = await c.call("session.truncateFrom", sessionId="s", fromMessageId="a1b")
    assert res == {
        "kept": 3,
        "removed": 1,
        "archived": 1,
        "pager": {"rootId": "u1", "revisionCount": 3, "activeRevision": 2},
    }
    host = await reboot(start_host, host)
    c = cli(host)
    await turn(c, "s", "t3", None, reply("a1c"))
    before = file_state(transcript(data_dir, "s"))
    saved = await c.call("session.saveActiveRevision", sessionId="s")
    assert (saved["revisionCount"], saved["activeRevision"], saved["stamped"]) == (3, 2, False)
    assert file_state(transcript(data_dir, "s")) == before
    host = await reboot(start_host, host)
    c = cli(host)
    listed = await c.call("session.listRevisions", sessionId="s", rootId="u1")
    assert (listed["revisionCount"], listed["activeRevision"]) == (3, 2)
    assert [r["messageCount"] for r in listed["revisions"]] == [2, 1, 1]

    # 4. Page back to the first branch: its messages return with their own turn ids.
    res = await c.call("session.activateRevision", sessionId="s", rootId="u1", revision=0)
    assert res == {"activeRevision": 0, "revisionCount": 3}
    host = await reboot(start_host, host)
    c = cli(host)
    assert await view(c, "s") == [
        ("u0", "t0"),
        ("a0", "t0"),
        ("u1", "t1"),
        ("a1", "t1"),
        ("tool1", "t1"),
    ]
    got = await get_messages(c, "s")
    assert got[3]["content"] == "reply a1" and got[4]["role"] == "tool"
    assert pager_of(data_dir, "s", "u1") == ("u1", 3, 0)
    listed = await c.call("session.listRevisions", sessionId="s", rootId="u1")
    assert (listed["revisionCount"], listed["activeRevision"]) == (3, 0)
    assert [r["messageCount"] for r in listed["revisions"]] == [2, 1, 1]

    #    ... and forward to the second one.
    res = await c.call("session.activateRevision", sessionId="s", rootId="u1", revision=1)
    assert res == {"activeRevision": 1, "revisionCount": 3}
    host = await reboot(start_host, host)
    c = cli(host)
    assert await view(c, "s") == [("u0", "t0"), ("a0", "t0"), ("u1", "t1"), ("a1b", "t2")]
    assert pager_of(data_dir, "s", "u1") == ("u1", 3, 1)

    # 5. Regenerate from a paged-back branch: it is already archived at its slot.
    res = await c.call("session.truncateFrom", sessionId="s", fromMessageId="a1b")
    assert res["archived"] == 1
    assert res["pager"] == {"rootId": "u1", "revisionCount": 4, "activeRevision": 3}
    listed = await c.call("session.listRevisions", sessionId="s", rootId="u1")
    assert [r["messageCount"] for r in listed["revisions"]] == [2, 1, 1]
    host = await reboot(start_host, host)
    c = cli(host)

    # 6. Edit-resend: cut at the user message itself. Nothing is archived, no pager.
    prefix = transcript(data_dir, "s").read_bytes().splitlines(keepends=True)[:2]
    res = await c.call("session.truncateFrom", sessionId="s", fromMessageId="u1")
    assert res == {"kept": 2, "removed": 1, "archived": 0}
    host = await reboot(start_host, host)
    c = cli(host)
    assert transcript(data_dir, "s").read_bytes() == b"".join(prefix)
    assert await view(c, "s") == [("u0", "t0"), ("a0", "t0")]
    assert await c.call("session.beginTurn", sessionId="s", turnId="t5", prompt=msg("u1e")) == {
        "turnId": "t5",
        "line": 2,
    }
    await host.stop()
    code, out, _ = await run_cli("verify", "--data-dir", str(data_dir))
    assert code == 0, out


async def test_list_revisions_reads_payloads_only_when_asked(client: Client) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"), msg("tool1", "tool", [{"x": 1}]))
    await client.call("session.saveActiveRevision", sessionId="s")

    bare = await client.call("session.listRevisions", sessionId="s", rootId="u1")
    assert bare["rootId"] == "u1"
    assert (bare["revisionCount"], bare["activeRevision"]) == (1, 0)
    (rev,) = bare["revisions"]
    assert set(rev) == {"revision", "messageCount", "createdAt"}
    assert (rev["revision"], rev["messageCount"]) == (0, 2)

    full = await client.call(
        "session.listRevisions", sessionId="s", rootId="u1", includeMessages=True
    )
    (rev,) = full["revisions"]
    assert rev["messages"] == [
        {**reply("a1"), "turnId": "t1"},
        {**msg("tool1", "tool", [{"x": 1}]), "turnId": "t1"},
    ]


async def test_save_revision_appends_a_revision_and_leaves_the_transcript(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"))
    before = file_state(transcript(data_dir, "s"))
    first = await client.call(
        "session.saveRevision", sessionId="s", rootId="u1", messages=[reply("x1", turnId="tx")]
    )
    assert first == {"revision": 0, "revisionCount": 1}
    second = await client.call(
        "session.saveRevision", sessionId="s", rootId="u1", messages=[reply("y1"), reply("y2")]
    )
    assert second == {"revision": 1, "revisionCount": 2}
    assert file_state(transcript(data_dir, "s")) == before

    listed = await client.call(
        "session.listRevisions", sessionId="s", rootId="u1", includeMessages=True
    )
    assert [r["revision"] for r in listed["revisions"]] == [0, 1]
    assert [[m["id"] for m in r["messages"]] for r in listed["revisions"]] == [
        ["x1"],
        ["y1", "y2"],
    ]
    assert listed["revisions"][0]["messages"][0]["turnId"] == "tx"
    err = await fails(client, "session.saveRevision", sessionId="s", rootId="nope", messages=[])
    assert (err.name, err.data["kind"]) == ("NOT_FOUND", "message")


async def test_save_active_revision_with_an_empty_branch_archives_and_stamps_nothing(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    await client.call("session.endTurn", sessionId="s", turnId="t1", status="aborted")
    await turn(client, "s", "t2", msg("u2"), reply("a2"))
    await client.call("session.appendMessage", sessionId="s", message=msg("u3"))
    before = await everything(client, data_dir)
    # The last user message (nothing after it), and a root followed by the next user message.
    for params, root in (({}, "u3"), ({"rootId": "u1"}, "u1")):
        res = await client.call("session.saveActiveRevision", sessionId="s", **params)
        assert res["rootId"] == root
        assert (res["archived"], res["stamped"]) == (0, False)
    assert await everything(client, data_dir) == before
    assert not any((data_dir / "revisions").rglob("*.jsonl"))


async def test_the_branch_ends_at_the_next_user_message_and_other_lines_are_kept_verbatim(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"), msg("tool1", "tool"))
    await turn(client, "s", "t2", msg("u2"), reply("a2", "unicode: é ✓ \\n"))
    old = transcript(data_dir, "s").read_bytes().splitlines(keepends=True)
    res = await client.call("session.saveActiveRevision", sessionId="s", rootId="u1")
    assert (res["rootId"], res["archived"], res["stamped"]) == ("u1", 2, True)
    new = transcript(data_dir, "s").read_bytes().splitlines(keepends=True)
    assert len(new) == len(old)
    assert new[1:] == old[1:]  # only the root's line was rewritten
    assert pager_of(data_dir, "s", "u1") == ("u1", 1, 0)
    assert pager_of(data_dir, "s", "u2") == (None, None, None)


async def test_a_grown_branch_replaces_the_active_revision(client: Client) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"))
    await client.call("session.saveActiveRevision", sessionId="s")
    # A row the outbox delivered late: the next archive holds the whole branch, in place.
    await client.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a2"))
    res = await client.call("session.saveActiveRevision", sessionId="s")
    assert res == {
        "rootId": "u1",
        "revisionCount": 1,
        "activeRevision": 0,
        "archived": 2,
        "stamped": False,
    }
    listed = await client.call(
        "session.listRevisions", sessionId="s", rootId="u1", includeMessages=True
    )
    assert [[m["id"] for m in r["messages"]] for r in listed["revisions"]] == [["a1", "a2"]]


async def test_a_stamp_that_changes_nothing_writes_nothing(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"))
    first = await client.call("session.saveActiveRevision", sessionId="s")
    assert first["stamped"] is True
    files, stat = disk_state(data_dir), file_state(transcript(data_dir, "s"))
    # A retry (the outbox re-sends after a timeout) and a pager a caller sends back.
    again = await client.call("session.saveActiveRevision", sessionId="s")
    assert again == {**first, "stamped": False}
    assert file_state(transcript(data_dir, "s")) == stat
    assert disk_state(data_dir) == files
    stored = (await get_messages(client, "s"))[0]
    await client.call(
        "session.updateMessage", sessionId="s", message={**stored, "revisionCount": 99}
    )
    assert file_state(transcript(data_dir, "s")) == stat  # caller pager fields are ignored


async def test_activating_the_revision_already_shown_writes_nothing(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"))
    await client.call("session.saveActiveRevision", sessionId="s")
    files, stat = disk_state(data_dir), file_state(transcript(data_dir, "s"))
    res = await client.call("session.activateRevision", sessionId="s", rootId="u1", revision=0)
    assert res == {"activeRevision": 0, "revisionCount": 1}
    assert file_state(transcript(data_dir, "s")) == stat  # not even rewritten with its own bytes
    assert disk_state(data_dir) == files


async def test_pager_fields_a_caller_sends_are_ignored(client: Client, data_dir: Path) -> None:
    bogus = {"revisionRootId": "x", "revisionCount": 7, "activeRevision": 3}
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1", **bogus), reply("a1", **bogus))
    assert all(not set(bogus) & set(m) for m in lines_of(data_dir, "s"))
    await client.call("session.saveActiveRevision", sessionId="s")
    stored = await get_messages(client, "s")
    await client.call(
        "session.replaceMessages", sessionId="s", messages=[{**m, **bogus} for m in stored]
    )
    assert pager_of(data_dir, "s", "u1") == ("u1", 1, 0)
    assert pager_of(data_dir, "s", "a1") == (None, None, None)


async def test_activate_revision_is_agent_busy_while_a_turn_runs(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"))
    await client.call("session.truncateFrom", sessionId="s", fromMessageId="a1")
    await client.call("session.beginTurn", sessionId="s", turnId="t2")
    await client.call("session.appendMessage", sessionId="s", turnId="t2", message=reply("a1b"))
    before = await everything(client, data_dir)
    err = await fails(client, "session.activateRevision", sessionId="s", rootId="u1", revision=0)
    assert (err.code, err.name) == (-32005, "AGENT_BUSY")
    assert await everything(client, data_dir) == before
    await client.call("session.endTurn", sessionId="s", turnId="t2", status="completed")
    res = await client.call("session.activateRevision", sessionId="s", rootId="u1", revision=0)
    assert res == {"activeRevision": 0, "revisionCount": 2}
    assert ids_of(data_dir, "s") == ["u1", "a1"]


async def test_activating_a_revision_past_the_end_is_not_found(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"))
    await client.call("session.saveActiveRevision", sessionId="s")
    before = await everything(client, data_dir)
    for revision in (1, 99):
        err = await fails(
            client, "session.activateRevision", sessionId="s", rootId="u1", revision=revision
        )
        assert (err.code, err.name, err.data["kind"]) == (-32004, "NOT_FOUND", "revision")
    err = await fails(client, "session.activateRevision", sessionId="s", rootId="x", revision=0)
    assert (err.name, err.data["kind"]) == ("NOT_FOUND", "message")
    assert await everything(client, data_dir) == before


async def test_activating_an_older_root_keeps_every_later_line_verbatim(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await turn(client, "s", "t1", msg("u1"), reply("a1"))
    await client.call("session.truncateFrom", sessionId="s", fromMessageId="a1")
    await turn(client, "s", "t2", None, reply("a1b"), msg("tool1b", "tool"))
    await turn(client, "s", "t3", msg("u2"), reply("a2"))
    tail = transcript(data_dir, "s").read_bytes().splitlines(keepends=True)[-2:]
    res = await client.call("session.activateRevision", sessionId="s", rootId="u1", revision=0)
    assert res == {"activeRevision": 0, "revisionCount": 2}
    lines = transcript(data_dir, "s").read_bytes().splitlines(keepends=True)
    assert ids_of(data_dir, "s") == ["u1", "a1", "u2", "a2"]
    assert lines[-2:] == tail
    res = await client.call("session.activateRevision", sessionId="s", rootId="u1", revision=1)
    assert res == {"activeRevision": 1, "revisionCount": 2}
    assert await view(client, "s") == [
        ("u1", "t1"),
        ("a1b", "t2"),
        ("tool1b", "t2"),
        ("u2", "t3"),
        ("a2", "t3"),
    ]
    assert transcript(data_dir, "s").read_bytes().splitlines(keepends=True)[-2:] == tail
    assert pager_of(data_dir, "s", "u1") == ("u1", 2, 1)


async def test_archives_go_away_with_the_session(start_host: StartHost, data_dir: Path) -> None:
    host = await boot(start_host)
    c = cli(host)
    for sid in ("s", "keep"):
        await c.call("session.create", sessionId=sid)
        await turn(c, sid, "t1", msg("u1"), reply("a1"))
        await c.call("session.saveActiveRevision", sessionId=sid)
        await c.call("session.truncateFrom", sessionId=sid, fromMessageId="a1")
    assert any((data_dir / "revisions" / "s").rglob("*.jsonl"))
    assert await c.call("session.delete", sessionId="s") == {"deleted": True}
    assert not (data_dir / "revisions" / "s").exists()
    assert any((data_dir / "revisions" / "keep").rglob("*.jsonl"))
    host = await reboot(start_host, host)
    c = cli(host)
    assert not (data_dir / "revisions" / "s").exists()
    # A new session of the same id starts with no history at all.
    await c.call("session.create", sessionId="s")
    await c.call("session.appendMessage", sessionId="s", message=msg("u1"))
    listed = await c.call("session.listRevisions", sessionId="s", rootId="u1")
    assert listed["revisions"] == []
    kept = await c.call("session.listRevisions", sessionId="keep", rootId="u1")
    assert len(kept["revisions"]) == 1


async def test_turn_id_survives_every_rewrite_swap_and_truncation(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await c.call("session.create", sessionId="s")
    await turn(c, "s", "t1", msg("u1"), reply("a1"))
    await turn(c, "s", "t2", msg("u2"), reply("a2"), reply("a3"))
    want = {"u1": "t1", "a1": "t1", "u2": "t2", "a2": "t2", "a3": "t2"}

    async def check(*absent: str) -> None:
        expect = [(i, t) for i, t in want.items() if i not in absent]
        assert await view(c, "s") == expect
        assert [(m["id"], m.get("turnId")) for m in lines_of(data_dir, "s")] == expect

    # Rewrites by messages that carry no turnId, or another one.
    await c.call("session.updateMessage", sessionId="s", message=reply("a1", "edited"))
    await c.call("session.updateMessage", sessionId="s", message=reply("a2", turnId="zz"))
    await check()
    plain = [{k: v for k, v in m.items() if k != "turnId"} for m in await get_messages(c, "s")]
    plain[0]["content"] = "replaced"
    assert await c.call("session.replaceMessages", sessionId="s", messages=plain) == {"count": 5}
    await check()
    await c.call("session.deleteMessages", sessionId="s", messageIds=["a3"])
    await check("a3")
    # Stamps, a regenerate cut, and a swap back.
    await c.call("session.saveActiveRevision", sessionId="s", rootId="u1")
    await c.call("session.saveActiveRevision", sessionId="s")
    await check("a3")
    res = await c.call("session.truncateFrom", sessionId="s", fromMessageId="a2")
    assert set(res) <= TRUNCATE_KEYS
    await check("a2", "a3")
    await c.call("session.appendMessage", sessionId="s", turnId="t3", message=reply("a2b"))
    await c.call("session.activateRevision", sessionId="s", rootId="u2", revision=0)
    await check("a3")
    host = await reboot(start_host, host)
    c = cli(host)
    await check("a3")
    listed = await c.call("session.listRevisions", sessionId="s", rootId="u2", includeMessages=True)
    assert [[(m["id"], m["turnId"]) for m in r["messages"]] for r in listed["revisions"]] == [
        [("a2", "t2")],
        [("a2b", "t3")],
    ]


async def test_an_archived_line_in_its_own_spacing_comes_back_whole(
    start_host: StartHost, data_dir: Path
) -> None:
    """A branch swapped back in is indexed by the bytes written, not a re-encoding of them.

    The lines here are not in the host's own encoding (``json.dumps`` spacing, as an
    outside writer leaves them; the host indexes them at start as they are). Had the index
    kept the re-encoded lengths, the next rewrite would copy short ranges and cut a line.
    """
    host = await boot(start_host)
    await host.stop()
    with open(transcript(data_dir, "s"), "w") as f:
        for m in [msg("u0"), reply("a0"), msg("u1"), reply("a1")]:
            f.write(json.dumps(m) + "\n")
    host = await boot(start_host)
    c = cli(host)
    await c.call("session.truncateFrom", sessionId="s", fromMessageId="a0")  # archives a0
    await c.call("session.appendMessage", sessionId="s", message=reply("a0b"))
    await c.call("session.activateRevision", sessionId="s", rootId="u0", revision=0)
    await c.call("session.appendMessage", sessionId="s", message=msg("x"))
    await c.call("session.deleteMessages", sessionId="s", messageIds=["x"])  # a rewrite
    assert [m["id"] for m in await get_messages(c, "s")] == ["u0", "a0"]
    assert b'"id": "a0"' in transcript(data_dir, "s").read_bytes()  # its own bytes
    await host.stop()
    code, out, err = await run_cli("verify", "--data-dir", str(data_dir))
    assert code == 0, out + err


async def test_a_root_that_is_not_a_user_message_is_invalid_params(
    client: Client, data_dir: Path
) -> None:
    """The pager is stamped on a user root only: no revision method takes another root."""
    await client.call("session.create", sessionId="s")
    for m in [msg("u0"), reply("a0"), msg("t0", "tool")]:
        await client.call("session.appendMessage", sessionId="s", message=m)
    before = await everything(client, data_dir)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("session.saveActiveRevision", {}),
        ("session.saveRevision", {"messages": [reply("r1")]}),
        ("session.listRevisions", {}),
        ("session.activateRevision", {"revision": 0}),
    ]
    for method, extra in calls:
        for root in ("a0", "t0"):
            err = await fails(client, method, sessionId="s", rootId=root, **extra)
            assert err.name == "INVALID_PARAMS", (method, root, err)
    assert await everything(client, data_dir) == before


async def prompt_and_reply(c: Client) -> None:
    """Session ``s`` holding the user root ``u0`` and its reply ``a0``."""
    await c.call("session.create", sessionId="s")
    await c.call("session.appendMessage", sessionId="s", message=msg("u0"))
    await c.call("session.appendMessage", sessionId="s", message=reply("a0"))


async def test_a_revision_with_a_repeated_id_is_refused_before_anything_changes(
    client: Client, data_dir: Path
) -> None:
    await prompt_and_reply(client)
    before = await everything(client, data_dir)
    err = await fails(
        client, "session.saveRevision", sessionId="s", rootId="u0", messages=[reply("x")] * 2
    )
    assert err.name == "INVALID_PARAMS"
    assert await everything(client, data_dir) == before


async def test_an_activate_refused_as_a_conflict_writes_nothing(
    client: Client, data_dir: Path
) -> None:
    """The ids are checked before the current branch's payload is written, not after."""
    await prompt_and_reply(client)
    await client.call("session.saveActiveRevision", sessionId="s")  # revision 0 holds a0
    await client.call("session.truncateFrom", sessionId="s", fromMessageId="a0")
    await client.call("session.appendMessage", sessionId="s", message=reply("a1"))
    await client.call("session.saveActiveRevision", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("u1"))
    await client.call("session.appendMessage", sessionId="s", message=reply("a0"))  # a0 again
    await client.call("session.updateMessage", sessionId="s", message=reply("a1", "edited"))
    before = disk_state(data_dir), await everything(client, data_dir)
    err = await fails(client, "session.activateRevision", sessionId="s", rootId="u0", revision=0)
    assert (err.name, err.data["messageId"]) == ("CONFLICT", "a0")
    assert (disk_state(data_dir), await everything(client, data_dir)) == before
