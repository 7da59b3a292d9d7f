"""Big checkpoints: snapshots of hundreds of KB, saved whole, or refused changing nothing.

A streaming reply's snapshot is saved again and again, growing and shrinking, into the
spare that is then swapped in; every check that fails must leave the checkpoint as it
was, and every answer must be the one the same call with a small snapshot gets. The file
has no ``messageId`` now; one written before (with it) must still be read and promoted.

A line in the outbox's shape (``id`` before ``params``, ``message`` last) and the same
request in another order must get the same answer and leave the same files: until issue
27 the first was served by a path of its own.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.conftest import Client, StartHost, disk_state, everything, get_messages
from tests.e2e.test_checkpoints import checkpoint, streaming
from tests.e2e.turnkit import boot, cli, fails, file_state, inflight, reboot, reply

SCAN_APART = 1 << 16  # the size past which a snapshot once took a path of its own
BIG = 3 * SCAN_APART  # characters of content
_RIDS = itertools.count(9000)
SAVE = b"session.saveInflightMessage"


def save_line(message: bytes, *, split: bool, sid: str = "s", tid: str = "t1") -> tuple[bytes, int]:
    """A saveInflightMessage line with ``message`` as written, and its id.

    ``split``: in the outbox's shape (id first, message last); else with the id last.
    """
    rid = next(_RIDS)
    params = b'"params":{"sessionId":"%s","turnId":"%s","message":%s}' % (
        sid.encode(),
        tid.encode(),
        message,
    )
    if split:
        line = b'{"jsonrpc":"2.0","id":%d,"method":"%s",%s}' % (rid, SAVE, params)
    else:
        line = b'{"jsonrpc":"2.0","method":"%s",%s,"id":%d}' % (SAVE, params, rid)
    return line, rid


async def _store_counters(client: Client) -> dict[str, int]:
    """``host.stats``'s counters but the calls' own (``host.stats`` is a call too) and the
    search index's (it indexes in the background, whatever a call does)."""
    counters = (await client.call("host.stats"))["counters"]
    return {k: v for k, v in counters.items() if not k.startswith(("calls.", "search."))}


def bare(reply: dict[str, Any], rid: Any) -> dict[str, Any]:
    """``reply`` to the request ``rid``, checked for its id and without it.

    A parse error's id is null, and its text names a byte of the line: only its start
    is kept.
    """
    error = reply.get("error")
    parse = error is not None and error["data"]["code"] == "PARSE_ERROR"
    assert reply.pop("id") == (None if parse else rid)
    if parse:
        assert error["message"].startswith("parse error: ")
        error["message"] = "parse error"
    return reply


async def answer(client: Client, message: bytes, *, split: bool, sid: str = "s") -> Any:
    """The reply to a saveInflightMessage of ``message`` sent alone (see :func:`bare`)."""
    line, rid = save_line(message, split=split, sid=sid)
    await client.send_raw(line + b"\n")  # no id registered: whatever comes back is unmatched
    return bare(await client.next_unmatched(), rid)


async def kept(client: Client, data: Path) -> Any:
    """What a refused call must not change: every file and index row but the spare.

    The spare is scratch (never read, removed at every start), and a refused big snapshot
    may have been written into it already.
    """
    files, rows = await everything(client, data)
    return {k: v for k, v in files.items() if not k.endswith(".inflight.spare")}, rows


def body(data: Path, sid: str) -> dict[str, Any]:
    """The checkpoint file of ``sid``, parsed: the whole file must be one JSON object."""
    parsed = json.loads(inflight(data, sid).read_bytes())
    assert isinstance(parsed, dict)
    return parsed


async def test_big_snapshots_are_saved_whole_growing_or_shrinking_and_survive_a_kill(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    # Growing (a synced write over the spare), then shorter than the spare it reuses.
    sizes = [BIG, 2 * BIG, BIG + 7, SCAN_APART + 1, 2 * BIG, BIG]
    for i, size in enumerate(sizes):
        snap = reply("a1", str(i % 10) * size)
        if i % 2:  # in the outbox's shape
            got = await answer(c, msgspec.json.encode(snap), split=True)
            assert got["result"] == {"saved": True}
        else:
            assert await checkpoint(c, "s", snap) is True
        got = body(data_dir, "s")
        assert (got["sessionId"], got["turnId"], got["message"]) == ("s", "t1", snap)
        assert "messageId" not in got  # the message's own id is the one
    host = await reboot(start_host, host)
    c = cli(host)
    res = await c.call("session.recoverInflightMessages")
    assert res["recovered"] == [
        {"sessionId": "s", "messageId": "a1", "turnId": "t1", "status": "aborted"}
    ]
    (last,) = [m for m in await get_messages(c, "s") if m["id"] == "a1"]
    assert last["content"] == str((len(sizes) - 1) % 10) * sizes[-1]


async def test_a_late_big_snapshot_changes_nothing(client: Client, data_dir: Path) -> None:
    await streaming(client, "s")
    await client.call("session.appendMessage", sessionId="s", turnId="t1", message=reply("a1"))
    assert await checkpoint(client, "s", reply("a2", "y" * BIG)) is True
    before = file_state(inflight(data_dir, "s")), await kept(client, data_dir)
    # Written into the spare before its id was known to be indexed: never swapped in.
    assert await checkpoint(client, "s", reply("a1", "z" * BIG)) is False
    assert (file_state(inflight(data_dir, "s")), await kept(client, data_dir)) == before
    assert await checkpoint(client, "s", reply("a2", "w" * BIG)) is True  # the spare is reused
    assert body(data_dir, "s")["message"] == reply("a2", "w" * BIG)


@pytest.mark.parametrize(
    ("bad", "code", "name"),
    [
        ({"role": "assistant", "content": "x"}, -32602, "INVALID_PARAMS"),  # no id
        ({"id": "a1", "role": "robot", "content": "x"}, -32602, "INVALID_PARAMS"),
        ({"id": "a1", "role": "assistant", "content": "x", "capped": True}, -32006, "CONFLICT"),
    ],
)
@pytest.mark.parametrize("size", [10, BIG])
async def test_a_bad_snapshot_gets_the_same_error_big_or_small_and_changes_nothing(
    client: Client, data_dir: Path, bad: dict[str, Any], code: int, name: str, size: int
) -> None:
    await streaming(client, "s")
    assert await checkpoint(client, "s", reply("a1", "kept")) is True
    before = file_state(inflight(data_dir, "s")), await kept(client, data_dir)
    message = {**bad, "content": "x" * size}
    for sid in ("s", "nobody"):  # the message is judged before the session is looked up
        err = await fails(
            client, "session.saveInflightMessage", sessionId=sid, turnId="t1", message=message
        )
        assert (err.code, err.name) == (code, name)
        if size == BIG:  # and the same again when the line is split
            got = await answer(client, msgspec.json.encode(message), split=True, sid=sid)
            assert (got["error"]["code"], got["error"]["data"]["code"]) == (code, name)
    assert (file_state(inflight(data_dir, "s")), await kept(client, data_dir)) == before


GOOD = b'{"id":"a1","role":"assistant","content":"%s"}' % (b"y" * BIG)
CUT = b'{"id":"a1","role":"assistant","content":"' + b"x" * BIG + b"}"  # its string never ends


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (CUT, "PARSE_ERROR"),
        (b'{"id":5,"role":"assistant","content":"' + b"x" * BIG + b"}", "PARSE_ERROR"),
        (GOOD[:-1] + b',"deep":' + b"[" * 5000 + b"]" * 5000 + b"}", "PARSE_ERROR"),
        (GOOD + b',"extra":{}', "INVALID_PARAMS"),
        (GOOD + b'],"x":{}', "PARSE_ERROR"),
    ],
    ids=["cut-short", "bad-field-then-cut-short", "too-deep", "param-after", "junk-after"],
)
async def test_a_split_message_that_is_not_one_json_value_gets_the_whole_lines_answer(
    client: Client, data_dir: Path, message: bytes, code: str
) -> None:
    await streaming(client, "s")
    assert await checkpoint(client, "s", reply("a1", "kept")) is True
    before = file_state(inflight(data_dir, "s")), await kept(client, data_dir)
    unsplit = await answer(client, message, split=False)
    assert unsplit["error"]["data"]["code"] == code
    assert await answer(client, message, split=True) == unsplit
    assert (file_state(inflight(data_dir, "s")), await kept(client, data_dir)) == before


async def test_a_split_message_with_a_repeated_message_key_after_it_saves_the_last(
    client: Client, data_dir: Path
) -> None:
    """Duplicate keys: msgspec keeps the last, so the unsplit line saves that one."""
    await streaming(client, "s")
    later = reply("a1", "z" * BIG)
    message = GOOD + b',"message":' + msgspec.json.encode(later)
    for split in (False, True):
        assert await answer(client, message, split=split) == {
            "jsonrpc": "2.0",
            "result": {"saved": True},
        }
        assert body(data_dir, "s")["message"] == later
        inflight(data_dir, "s").unlink()
        await client.call("session.recoverInflightMessages")  # forget the removed file


async def test_a_big_snapshot_of_another_turn_leaves_the_running_turns_checkpoint_alone(
    client: Client, data_dir: Path
) -> None:
    await streaming(client, "s", "t0", prompt="u0")
    await client.call("session.endTurn", sessionId="s", turnId="t0", status="completed")
    await client.call("session.beginTurn", sessionId="s", turnId="t1")
    assert await checkpoint(client, "s", reply("a1", "t1 " * (BIG // 3)), tid="t1")
    mine = file_state(inflight(data_dir, "s"))
    # t0's finished snapshot arrives late: it becomes t0's row, and t1's checkpoint stays.
    assert await checkpoint(client, "s", reply("a0", "t0 " * (BIG // 3)), tid="t0")
    assert file_state(inflight(data_dir, "s")) == mine
    got = await get_messages(client, "s")
    assert [(m["id"], m["turnId"]) for m in got] == [("u0", "t0"), ("a0", "t0")]


async def test_a_checkpoint_file_written_with_its_message_id_is_still_promoted(
    start_host: StartHost, data_dir: Path
) -> None:
    host = await boot(start_host)
    c = cli(host)
    await streaming(c, "s")
    await host.kill()
    old = {  # as hosts before this change wrote it: messageId beside the message
        "sessionId": "s",
        "turnId": "t1",
        "messageId": "a1",
        "message": reply("a1", "from an older host"),
        "savedAt": "2026-12-01T00:00:00.000Z",
    }
    inflight(data_dir, "s").write_bytes(json.dumps(old).encode())
    c = cli(await boot(start_host))
    res = await c.call("session.recoverInflightMessages")
    assert res["recovered"] == [
        {"sessionId": "s", "messageId": "a1", "turnId": "t1", "status": "aborted"}
    ]
    assert (await get_messages(c, "s"))[-1]["content"] == "from an older host"


async def test_a_deeply_nested_message_gets_the_same_answer_split_or_not(
    client: Client, data_dir: Path
) -> None:
    """msgspec refuses nesting past what is left of the recursion limit, which depends on
    how deep the decoding thread's stack is: the split's proof on its thread must never
    accept what the whole line's decode on the loop refuses."""
    await streaming(client, "s")
    seen = set()
    for depth in range(880, 1000):
        message = GOOD[:-1] + b',"deep":' + b"[" * depth + b"]" * depth + b"}"
        unsplit = await answer(client, message, split=False)
        assert await answer(client, message, split=True) == unsplit, depth
        seen.add("result" in unsplit)
    assert seen == {True, False}  # the depths crossed the limit


async def test_a_cancel_in_the_same_write_as_a_split_line_gets_the_unsplit_answers(
    client: Client,
) -> None:
    await streaming(client, "s")
    got = []
    for split in (False, True):
        line, rid = save_line(CUT, split=split)
        cancel = {"jsonrpc": "2.0", "id": f"c{rid}", "method": "$/cancelRequest"}
        cancel["params"] = {"id": rid}
        await client.send_raw(line + b"\n" + msgspec.json.encode(cancel) + b"\n")
        replies = [await client.next_unmatched() for _ in range(2)]
        by_id = {r["id"]: r for r in replies}
        assert set(by_id) == {None, f"c{rid}"}
        got.append((bare(by_id[None], rid), by_id[f"c{rid}"]["result"]))
    assert got[0] == got[1]
    assert got[0][0]["error"]["data"]["code"] == "PARSE_ERROR"


async def test_calls_in_one_write_behind_a_split_line_keep_their_order(
    client: Client, data_dir: Path
) -> None:
    """The split line's message repeats its key (so it is decoded whole, and saves the
    later one); the snapshot sent behind it in the same write must still land last."""
    await streaming(client, "s")
    first = GOOD + b',"message":' + msgspec.json.encode(reply("a1", "z" * BIG))
    for split in (False, True):
        a, _ = save_line(first, split=split)
        b, _ = save_line(msgspec.json.encode(reply("a1", "behind")), split=False)
        await client.send_raw(a + b"\n" + b + b"\n")
        replies = [await client.next_unmatched() for _ in range(2)]
        assert [r["result"] for r in replies] == [{"saved": True}] * 2
        assert body(data_dir, "s")["message"] == reply("a1", "behind")


async def test_a_split_line_not_json_touches_nothing_of_a_session_not_open(
    start_host: StartHost, data_dir: Path
) -> None:
    """Nothing but the spare may change before a message is proved JSON: a session that
    is not open yet is opened (and its corrupt checkpoint quarantined) only after."""
    host = await boot(start_host)
    await streaming(cli(host), "s")
    await host.kill()
    inflight(data_dir, "s").write_bytes(b'{"garbage"')
    host = await boot(start_host)
    c = cli(host)
    counters = await _store_counters(c)
    files = disk_state(data_dir)
    got = await answer(c, CUT, split=True)
    assert got["error"]["data"]["code"] == "PARSE_ERROR"
    assert disk_state(data_dir) == files
    assert await _store_counters(c) == counters
    # A good one then takes the awaited way: the session opens, the bad file is set aside.
    assert (await answer(c, GOOD, split=True))["result"] == {"saved": True}
    assert body(data_dir, "s")["message"] == json.loads(GOOD)
    assert (data_dir / "sessions" / "s.jsonl.quarantine").exists()
