"""Streaming checkpoints and their settlement over the protocol (ADR 0153 and its amendment).

A checkpoint is one file beside the transcript, replaced atomically, invisible to the
transcript and the index until it is promoted. Every way it is settled is here: the final
append, ``endTurn`` in each of its modes, ``recoverInflightMessages``, ``session.delete``
and the next start after a kill -9; and promotion never writes an empty reply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    Client,
    StartHost,
    dumps,
    everything,
    get_messages,
    index_state,
    msg,
    transcript,
)
from tests.e2e.turnkit import (
    boot,
    cli,
    fails,
    file_state,
    inflight,
    lines_of,
    reboot,
    reply,
    temp_files,
)


async def streaming(c: Client, sid: str, tid: str = "t1", *, prompt: str = "u1") -> None:
    """Create ``sid`` (if need be) and begin turn ``tid`` with a prompt."""
    await c.call("session.create", sessionId=sid)
    await c.call("session.beginTurn", sessionId=sid, turnId=tid, prompt=msg(prompt))


async def checkpoint(c: Client, sid: str, m: dict[str, Any], tid: str = "t1") -> bool:
    """Save ``m`` as the session's checkpoint for turn ``tid``; return ``saved``."""
    res = await c.call("session.saveInflightMessage", sessionId=sid, turnId=tid, message=m)
    return bool(res["saved"])


def stored(data: Path, sid: str, mid: str) -> dict[str, Any]:
    """The one stored line of message ``mid``."""
    (line,) = [m for m in lines_of(data, sid) if m["id"] == mid]
    return line


async def test_a_checkpoint_is_one_file_replaced_atomically_and_nothing_else(
    client: Client, data_dir: Path
) -> None:
    await streaming(client, "s")
    before = transcript(data_dir, "s").read_bytes(), await index_state(client, data_dir)
    first = reply("a1", "Hel", model="m-1")
    assert await checkpoint(client, "s", first) is True
    body = json.loads(inflight(data_dir, "s").read_bytes())
    assert (body["turnId"], body["message"]) == ("t1", first)
    newest = reply("a1", "Hello, world", model="m-1")
    assert await checkpoint(client, "s", newest) is True
    assert json.loads(inflight(data_dir, "s").read_bytes())["message"] == newest
    assert temp_files(data_dir) == []
    # The one before it is kept only as the next save's temp file, and goes with it.
    spare = data_dir / "sessions" / "s.inflight.spare"
    assert json.loads(spare.read_bytes())["message"] == first
    # Not a transcript line, not an index row, not in session.get or session.list.
    assert (transcript(data_dir, "s").read_bytes(), await index_state(client, data_dir)) == before
    assert [m["id"] for m in await get_messages(client, "s")] == ["u1"]
    (summary,) = (await client.call("session.list"))["sessions"]
    assert summary["messageCount"] == 1
    await client.call("session.appendMessage", sessionId="s", turnId="t1", message=newest)
    sessions = sorted(p.name for p in (data_dir / "sessions").iterdir())
    assert sessions == ["s.jsonl", "s.meta.json", "s.turns.log"]


async def test_a_checkpoint_of_an_indexed_id_is_dropped(client: Client, data_dir: Path) -> None:
    await streaming(client, "s")
    await client.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a1"))
    before = await everything(client, data_dir)
    # A write still in flight when the final row landed: it must not resurrect the reply.
    assert await checkpoint(client, "s", reply("a1", "stale")) is False
    assert not inflight(data_dir, "s").exists()
    assert await everything(client, data_dir) == before
    # ... and it does not disturb the checkpoint of the next reply either.
    assert await checkpoint(client, "s", reply("a2", "next")) is True
    before = await everything(client, data_dir)
    assert await checkpoint(client, "s", reply("a1", "staler")) is False
    assert await everything(client, data_dir) == before


async def test_the_final_append_of_the_same_id_removes_the_checkpoint(
    client: Client, data_dir: Path
) -> None:
    await streaming(client, "s")
    await checkpoint(client, "s", reply("a2", "partial"))
    cp = file_state(inflight(data_dir, "s"))
    await client.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a1"))
    assert file_state(inflight(data_dir, "s")) == cp  # another id: left alone
    res = await client.call(
        "session.appendMessage", sessionId="s", turnId="t1", message=reply("a2", "final")
    )
    assert res == {"line": 2, "appended": True}
    assert not inflight(data_dir, "s").exists()
    assert stored(data_dir, "s", "a2")["content"] == "final"
    assert [m["id"] for m in lines_of(data_dir, "s")] == ["u1", "a1", "a2"]


async def test_a_repeated_final_append_removes_the_checkpoint_too(
    client: Client, data_dir: Path
) -> None:
    await streaming(client, "s")
    await checkpoint(client, "s", reply("a1", "partial"))
    full = [*await get_messages(client, "s"), reply("a1", "final")]
    await client.call("session.replaceMessages", sessionId="s", messages=full)
    assert inflight(data_dir, "s").exists()
    before = file_state(transcript(data_dir, "s"))
    # The outbox delivers at least once: the row is stored, and the checkpoint goes anyway.
    res = await client.call(
        "session.appendMessage", sessionId="s", turnId="t1", message=reply("a1", "final")
    )
    assert res == {"line": 1, "appended": False}
    assert not inflight(data_dir, "s").exists()
    assert file_state(transcript(data_dir, "s")) == before


@pytest.mark.parametrize("status", ["completed", "error"])
async def test_completed_or_error_keeps_an_unindexed_checkpoint(
    client: Client, data_dir: Path, status: str
) -> None:
    await streaming(client, "s")
    await checkpoint(client, "s", reply("a1", "finished, still in the outbox"))
    before = file_state(inflight(data_dir, "s")), file_state(transcript(data_dir, "s"))
    res = await client.call("session.endTurn", sessionId="s", turnId="t1", status=status)
    assert res == {"status": status, "recovered": False}
    assert (file_state(inflight(data_dir, "s")), file_state(transcript(data_dir, "s"))) == before


@pytest.mark.parametrize("status", ["completed", "error"])
async def test_completed_or_error_removes_a_checkpoint_whose_row_is_indexed(
    client: Client, data_dir: Path, status: str
) -> None:
    await streaming(client, "s")
    await checkpoint(client, "s", reply("a1", "partial"))
    # The row reaches the index by a whole-transcript rewrite, not by its own append.
    full = [*await get_messages(client, "s"), reply("a1", "final")]
    await client.call("session.replaceMessages", sessionId="s", messages=full)
    assert inflight(data_dir, "s").exists()
    before = file_state(transcript(data_dir, "s"))
    res = await client.call("session.endTurn", sessionId="s", turnId="t1", status=status)
    assert res == {"status": status, "recovered": False}
    assert not inflight(data_dir, "s").exists()
    assert file_state(transcript(data_dir, "s")) == before
    assert stored(data_dir, "s", "a1")["content"] == "final"


async def test_aborted_with_recover_inflight_promotes_the_checkpoint(
    client: Client, data_dir: Path
) -> None:
    await streaming(client, "s")
    await client.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a0"))
    await checkpoint(client, "s", reply("a1", "half of it", model="m-1"))
    res = await client.call(
        "session.endTurn", sessionId="s", turnId="t1", status="aborted", recoverInflight=True
    )
    assert res == {"status": "aborted", "recovered": True}
    assert not inflight(data_dir, "s").exists()
    got = await get_messages(client, "s")
    assert [m["id"] for m in got] == ["u1", "a0", "a1"]
    assert got[2] == {**reply("a1", "half of it", model="m-1"), "status": "aborted", "turnId": "t1"}
    # The runtime's own final row, arriving late through the outbox, is not a second row.
    late = await client.call(
        "session.appendMessage", sessionId="s", turnId="t1", message=reply("a1", "all of it")
    )
    assert late == {"line": 2, "appended": False}
    assert [m["id"] for m in lines_of(data_dir, "s")] == ["u1", "a0", "a1"]


async def _t0_done_t1_running(c: Client) -> None:
    """Session ``s``: turn ``t0`` (prompt ``u0``) completed, then ``t1`` (``u1``) running."""
    await streaming(c, "s", "t0", prompt="u0")
    await c.call("session.endTurn", sessionId="s", turnId="t0", status="completed")
    await c.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))


async def test_recover_inflight_leaves_a_checkpoint_of_another_turn_alone(
    client: Client, data_dir: Path
) -> None:
    await _t0_done_t1_running(client)
    await checkpoint(client, "s", reply("a0", "of the old turn"), tid="t0")
    before = file_state(inflight(data_dir, "s")), file_state(transcript(data_dir, "s"))
    res = await client.call(
        "session.endTurn", sessionId="s", turnId="t1", status="aborted", recoverInflight=True
    )
    assert res == {"status": "aborted", "recovered": False}
    assert (file_state(inflight(data_dir, "s")), file_state(transcript(data_dir, "s"))) == before


async def test_plain_aborted_leaves_the_checkpoint_for_the_runtimes_own_row(
    client: Client, data_dir: Path
) -> None:
    await streaming(client, "s")
    await checkpoint(client, "s", reply("a1", "the user pressed Sto"))
    before = file_state(inflight(data_dir, "s")), file_state(transcript(data_dir, "s"))
    res = await client.call("session.endTurn", sessionId="s", turnId="t1", status="aborted")
    assert res == {"status": "aborted", "recovered": False}
    assert (file_state(inflight(data_dir, "s")), file_state(transcript(data_dir, "s"))) == before
    final = reply("a1", "the user pressed Stop", status="aborted")
    await client.call("session.appendMessage", sessionId="s", turnId="t1", message=final)
    assert not inflight(data_dir, "s").exists()
    assert stored(data_dir, "s", "a1") == {**final, "turnId": "t1"}


async def test_recover_inflight_messages_settles_every_leftover(
    client: Client, data_dir: Path
) -> None:
    # indexed: its row reached the index by a rewrite; settling drops the checkpoint.
    await streaming(client, "idx")
    await checkpoint(client, "idx", reply("a1", "partial"))
    full = [*await get_messages(client, "idx"), reply("a1", "final")]
    await client.call("session.replaceMessages", sessionId="idx", messages=full)
    # completed turn, final row still in the outbox: appended as complete.
    await streaming(client, "done")
    await checkpoint(client, "done", reply("a1", "done text"))
    await client.call("session.endTurn", sessionId="done", turnId="t1", status="completed")
    # error turn: not completed, so appended aborted.
    await streaming(client, "err")
    await checkpoint(client, "err", reply("a1", "err text"))
    await client.call("session.endTurn", sessionId="err", turnId="t1", status="error")
    # running turn: appended aborted, and the turn becomes aborted.
    await streaming(client, "run")
    await checkpoint(client, "run", reply("a1", "run text"))
    # user Stop, the runtime's row never came: appended aborted.
    await streaming(client, "stop")
    await checkpoint(client, "stop", reply("a1", "stop text"))
    await client.call("session.endTurn", sessionId="stop", turnId="t1", status="aborted")
    # an empty reply: dropped.
    await streaming(client, "empty")
    await checkpoint(client, "empty", reply("a1", ""))
    await client.call("session.create", sessionId="none")  # no checkpoint at all

    res = await client.call("session.recoverInflightMessages")
    assert sorted(res["recovered"], key=lambda r: r["sessionId"]) == [
        {"sessionId": sid, "messageId": "a1", "turnId": "t1", "status": status}
        for sid, status in [
            ("done", "complete"),
            ("err", "aborted"),
            ("run", "aborted"),
            ("stop", "aborted"),
        ]
    ]
    assert not list(data_dir.glob("sessions/*.inflight.json"))
    for sid in ("done", "err", "run", "stop"):
        row = stored(data_dir, sid, "a1")
        assert row["content"] == f"{sid} text"
        assert row["turnId"] == "t1"
        assert row.get("status", "complete") == ("complete" if sid == "done" else "aborted")
    assert stored(data_dir, "idx", "a1")["content"] == "final"
    assert [m["id"] for m in lines_of(data_dir, "empty")] == ["u1"]
    assert lines_of(data_dir, "none") == []
    ended = await client.call("session.endTurn", sessionId="run", turnId="t1", status="completed")
    assert ended == {"status": "aborted", "recovered": False}
    await client.call("session.beginTurn", sessionId="run", turnId="t2")
    # Everything is settled: a second sweep finds nothing and changes nothing.
    before = await everything(client, data_dir)
    assert await client.call("session.recoverInflightMessages") == {"recovered": []}
    assert await everything(client, data_dir) == before


EMPTY: dict[str, Any] = {
    "empty-string": "",
    "empty-list": [],
    "one-empty-text-block": [{"type": "text", "text": ""}],
    "only-empty-text-blocks": [{"type": "text", "text": ""}, {"type": "text", "text": ""}],
    "no-content": None,
}
NOT_EMPTY: dict[str, Any] = {
    "text-after-an-empty-block": [{"type": "text", "text": ""}, {"type": "text", "text": "x"}],
    "a-tool-call": [{"type": "toolCall", "id": "c1", "name": "ls", "arguments": {}}],
}


@pytest.mark.parametrize("path", ["endTurn", "recoverInflightMessages", "start"])
async def test_an_empty_checkpoint_is_never_promoted(
    start_host: StartHost, data_dir: Path, path: str
) -> None:
    host = await boot(start_host)
    c = cli(host)
    for sid, content in {**EMPTY, **NOT_EMPTY}.items():
        await streaming(c, sid)
        m = reply("a1", content)
        if content is None:
            del m["content"]
        await checkpoint(c, sid, m)
    if path == "endTurn":
        for sid in {**EMPTY, **NOT_EMPTY}:
            res = await c.call(
                "session.endTurn",
                sessionId=sid,
                turnId="t1",
                status="aborted",
                recoverInflight=True,
            )
            assert res["recovered"] is (sid in NOT_EMPTY), sid
    elif path == "recoverInflightMessages":
        res = await c.call("session.recoverInflightMessages")
        assert sorted(r["sessionId"] for r in res["recovered"]) == sorted(NOT_EMPTY)
    else:  # a start leaves them to the connect sequence (docs/protocol.md), which settles
        host = await reboot(start_host, host)
        c = cli(host)
        for sid in {**EMPTY, **NOT_EMPTY}:
            assert inflight(data_dir, sid).exists(), sid
        res = await c.call("session.recoverInflightMessages")
        assert sorted(r["sessionId"] for r in res["recovered"]) == sorted(NOT_EMPTY)
    for sid in EMPTY:
        assert [m["id"] for m in lines_of(data_dir, sid)] == ["u1"], sid
        assert not inflight(data_dir, sid).exists(), sid  # dropped, not left to retry forever
    for sid, content in NOT_EMPTY.items():
        row = stored(data_dir, sid, "a1")
        assert (row["content"], row["status"]) == (content, "aborted")
    assert await c.call("session.recoverInflightMessages") == {"recovered": []}


async def test_session_delete_removes_the_checkpoint(start_host: StartHost, data_dir: Path) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    for text in ("par", "partial"):
        await checkpoint(c, "s", reply("a1", text))
    assert (data_dir / "sessions" / "s.inflight.spare").exists()
    assert await c.call("session.delete", sessionId="s") == {"deleted": True}
    assert not list((data_dir / "sessions").glob("s.*"))
    assert await c.call("session.recoverInflightMessages") == {"recovered": []}
    host = await reboot(start_host, host)
    c = cli(host)
    assert await c.call("session.list") == {"sessions": []}
    await c.call("session.create", sessionId="s")
    assert lines_of(data_dir, "s") == []
    err = await fails(c, "session.endTurn", sessionId="s", turnId="t1", status="completed")
    assert err.data["kind"] == "turn"  # the turns went too


async def test_a_kill_mid_reply_keeps_the_last_checkpoint_as_an_aborted_row(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    await c.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a0"))
    for text in ("Once", "Once upon", "Once upon a time"):
        assert await checkpoint(c, "s", reply("a1", text)) is True
    host = await reboot(start_host, host)
    c = cli(host)
    res = await c.call("session.recoverInflightMessages")  # the connect sequence
    assert res["recovered"] == [
        {"sessionId": "s", "messageId": "a1", "turnId": "t1", "status": "aborted"}
    ]
    got = await get_messages(c, "s")
    assert [(m["id"], m["turnId"], m.get("status")) for m in got] == [
        ("u1", "t1", None),
        ("a0", "t1", None),
        ("a1", "t1", "aborted"),
    ]
    assert got[2]["content"] == "Once upon a time"
    assert not inflight(data_dir, "s").exists()
    ended = await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    assert ended == {"status": "aborted", "recovered": False}
    assert await c.call("session.recoverInflightMessages") == {"recovered": []}
    await c.call("session.beginTurn", sessionId="s", turnId="t2")


async def test_a_completed_turns_leftover_waits_at_start_and_the_finished_row_wins(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    await checkpoint(c, "s", reply("a1", "the finished snapshot, nearly"))
    await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    cp = inflight(data_dir, "s").read_bytes()
    host = await reboot(start_host, host)
    c = cli(host)
    assert [m["id"] for m in lines_of(data_dir, "s")] == ["u1"]  # not promoted at start
    assert inflight(data_dir, "s").read_bytes() == cp
    # The outbox drains after the handshake: its finished row is the one stored ...
    final = reply("a1", "the finished reply", usage={"out": 5})
    res = await c.call("session.appendMessage", sessionId="s", turnId="t1", message=final)
    assert res == {"line": 1, "appended": True}
    # ... and recovery afterwards finds nothing left to do.
    assert await c.call("session.recoverInflightMessages") == {"recovered": []}
    host = await reboot(start_host, host)
    c = cli(host)
    got = await get_messages(c, "s")
    assert [m["id"] for m in got] == ["u1", "a1"]
    assert got[1] == {**final, "turnId": "t1"}
    assert got[1].get("status", "complete") == "complete"


async def test_a_completed_turns_leftover_with_no_outbox_row_is_recovered_complete(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    await checkpoint(c, "s", reply("a1", "the finished reply"))
    await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    host = await reboot(start_host, host)
    c = cli(host)
    res = await c.call("session.recoverInflightMessages")
    assert res == {
        "recovered": [{"sessionId": "s", "messageId": "a1", "turnId": "t1", "status": "complete"}]
    }
    row = stored(data_dir, "s", "a1")
    assert (row["content"], row["turnId"], row["status"]) == (
        "the finished reply",
        "t1",
        "complete",
    )
    ended = await c.call("session.endTurn", sessionId="s", turnId="t1", status="aborted")
    assert ended == {"status": "completed", "recovered": False}


async def test_fifty_pipelined_checkpoint_writes_leave_the_last_one(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    futs, lines = [], []
    for i in range(50):
        rid = c.next_id()
        futs.append(c.expect(rid))
        params = {"sessionId": "s", "turnId": "t1", "message": reply("a1", f"chunk {i}")}
        lines.append(dumps(c.envelope("session.saveInflightMessage", params, rid)) + b"\n")
    await c.send_raw(b"".join(lines))  # one write, no waiting between them
    assert [(await c.wait(f))["result"] for f in futs] == [{"saved": True}] * 50
    assert json.loads(inflight(data_dir, "s").read_bytes())["message"]["content"] == "chunk 49"
    assert temp_files(data_dir) == []
    host = await reboot(start_host, host)
    await cli(host).call("session.recoverInflightMessages")  # the connect sequence
    assert stored(data_dir, "s", "a1")["content"] == "chunk 49"


async def test_no_temp_file_is_left_after_a_start(start_host: StartHost, data_dir: Path) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    await c.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a0"))
    await c.call("session.saveActiveRevision", sessionId="s")
    await checkpoint(c, "s", reply("a1", "renamed into place"))
    await host.kill()
    # What a host killed between writing a temp file and renaming it leaves behind.
    sessions = data_dir / "sessions"
    stale = [
        sessions / "s.inflight.json.0123456789ab.tmp",
        sessions / "s.jsonl.ba9876543210.tmp",
        sessions / "s.intent.json.aaaaaaaaaaaa.tmp",
        next((data_dir / "revisions" / "s").iterdir()) / "manifest.json.bbbbbbbbbbbb.tmp",
    ]
    for path in stale:
        path.write_bytes(b'{"sessionId":"s","turnId":"t1","messageId":"a1","mess')
    host = await boot(start_host)
    assert temp_files(data_dir) == []
    await cli(host).call("session.recoverInflightMessages")  # the connect sequence
    # The renamed checkpoint, not the torn temp file, is what got promoted.
    assert stored(data_dir, "s", "a1")["content"] == "renamed into place"
    assert [m["id"] for m in lines_of(data_dir, "s")] == ["u1", "a0", "a1"]


async def test_checkpoint_writes_in_flight_behind_the_final_row_cannot_resurrect_it(
    client: Client, data_dir: Path
) -> None:
    c = client
    await streaming(c, "s")
    final = reply("a1", "all of it")
    calls = [("session.saveInflightMessage", reply("a1", f"chunk {i}")) for i in range(5)]
    calls.append(("session.appendMessage", final))
    calls += [("session.saveInflightMessage", reply("a1", f"late {i}")) for i in range(3)]
    futs, lines = [], []
    for method, m in calls:
        rid = c.next_id()
        futs.append(c.expect(rid))
        params = {"sessionId": "s", "turnId": "t1", "message": m}
        lines.append(dumps(c.envelope(method, params, rid)) + b"\n")
    await c.send_raw(b"".join(lines))
    results = [(await c.wait(f))["result"] for f in futs]
    assert (
        results == [{"saved": True}] * 5 + [{"line": 1, "appended": True}] + [{"saved": False}] * 3
    )
    assert not inflight(data_dir, "s").exists()
    await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    assert await c.call("session.recoverInflightMessages") == {"recovered": []}
    assert lines_of(data_dir, "s")[1:] == [{**final, "turnId": "t1"}]


STAGES = ["streaming", "finished-snapshot", "ended-before-append", "appended", "ended"]


@pytest.mark.parametrize("stage", STAGES)
async def test_a_kill_at_any_stage_of_a_reply_leaves_its_final_row_or_newest_checkpoint(
    start_host: StartHost, data_dir: Path, stage: str
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    final = "Once upon a time."
    for text in ("Once", "Once upon"):
        await checkpoint(c, "s", reply("a1", text))
    want: tuple[str, str] = ("Once upon", "aborted")
    if stage != "streaming":
        await checkpoint(c, "s", reply("a1", final))  # message_end: the finished snapshot
        want = (final, "aborted")
    if stage == "ended-before-append":
        await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
        want = (final, "complete")
    if stage in ("appended", "ended"):
        await c.call(
            "session.appendMessage", sessionId="s", turnId="t1", message=reply("a1", final)
        )
        want = (final, "complete")
    if stage == "ended":
        await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    host = await reboot(start_host, host)
    c = cli(host)
    await c.call("session.recoverInflightMessages")  # what the producer does after connecting
    rows = [m for m in await get_messages(c, "s") if m["id"] == "a1"]
    assert [(m["content"], m.get("status", "complete"), m["turnId"]) for m in rows] == [
        (*want, "t1")
    ]
    assert not inflight(data_dir, "s").exists()
    await c.call("session.beginTurn", sessionId="s", turnId="t2")  # nothing left running


async def test_a_finished_row_still_in_the_outbox_wins_over_a_running_turns_checkpoint(
    start_host: StartHost, data_dir: Path
) -> None:
    # The producer made the finished reply durable in its outbox, then the host died
    # before the row and endTurn reached it: the turn is still running, with an older
    # checkpoint. Found by scripts/chaos.py: promoting it at start lost the reply.
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    assert await checkpoint(c, "s", reply("a1", "The answ")) is True
    host = await reboot(start_host, host)
    c = cli(host)
    assert inflight(data_dir, "s").exists()  # not promoted at start
    done = reply("a1", "The answer is 42.")
    res = await c.call("session.appendMessage", sessionId="s", turnId="t1", message=done)
    assert res["appended"] is True  # the outbox's drain, first in the connect sequence
    assert await c.call("session.recoverInflightMessages") == {"recovered": []}
    row = stored(data_dir, "s", "a1")
    assert (row["content"], row.get("status", "complete")) == ("The answer is 42.", "complete")
    assert not inflight(data_dir, "s").exists()


@pytest.mark.parametrize("written_by", ["this host", "the host before a kill"])
async def test_the_next_turns_checkpoint_settles_a_leftover_before_replacing_it(
    start_host: StartHost, data_dir: Path, written_by: str
) -> None:
    # The host remembers whose turn a checkpoint it saved is (no read back of a 1 MB file);
    # one written before a restart is read from the file: either way it is never lost.
    host = await boot(start_host)
    c = cli(host)
    await _t0_done_t1_running(c)
    await checkpoint(c, "s", reply("a0", "the old turn's reply"), tid="t0")  # a late write
    if written_by != "this host":
        host = await reboot(start_host, host)
        c = cli(host)
    assert await checkpoint(c, "s", reply("a1", "the new turn's"), tid="t1")
    assert json.loads(inflight(data_dir, "s").read_bytes())["turnId"] == "t1"
    got = await get_messages(c, "s")
    assert [m["id"] for m in got] == ["u0", "u1", "a0"]
    assert got[2]["content"] == "the old turn's reply"


# Found at 1e17277 by a protocol review: a snapshot of another turn, while the session's
# running turn held the checkpoint, "settled" that checkpoint as a leftover: its partial
# became an aborted row, the running turn was ended, and its finished reply, when it came,
# was deduplicated away.
async def test_a_snapshot_of_an_unknown_turn_leaves_the_running_turn_alone(
    client: Client, data_dir: Path
) -> None:
    await streaming(client, "s", "t1")
    await checkpoint(client, "s", reply("a1", "partial"))
    before = await everything(client, data_dir), file_state(inflight(data_dir, "s"))
    assert not await checkpoint(client, "s", reply("a9"), tid="t99")
    assert (await everything(client, data_dir), file_state(inflight(data_dir, "s"))) == before
    final = reply("a1", "the finished reply")
    assert (await client.call("session.appendMessage", sessionId="s", turnId="t1", message=final))[
        "appended"
    ]
    ended = await client.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    assert ended["status"] == "completed"
    assert [m["content"] for m in await get_messages(client, "s")] == [
        "text of u1",
        final["content"],
    ]


async def test_a_late_snapshot_of_an_ended_turn_leaves_the_running_turns_checkpoint_alone(
    client: Client, data_dir: Path
) -> None:
    await _t0_done_t1_running(client)
    await checkpoint(client, "s", reply("a1", "t1 streams"), tid="t1")
    mine = file_state(inflight(data_dir, "s"))
    # t0's finished snapshot, sent at its message_end, arrives only now: it is t0's reply.
    assert await checkpoint(client, "s", reply("a0", "t0's reply"), tid="t0")
    assert file_state(inflight(data_dir, "s")) == mine
    final = reply("a1", "t1 streamed")
    assert (await client.call("session.appendMessage", sessionId="s", turnId="t1", message=final))[
        "appended"
    ]
    for tid in ("t1", "t0"):  # t1 was still running; t0 stays as it ended
        ended = await client.call("session.endTurn", sessionId="s", turnId=tid, status="completed")
        assert ended["status"] == "completed"
    got = await get_messages(client, "s")
    assert [(m["id"], m.get("status", "complete"), m["turnId"]) for m in got] == [
        ("u0", "complete", "t0"),
        ("u1", "complete", "t1"),
        ("a0", "complete", "t0"),
        ("a1", "complete", "t1"),
    ]
