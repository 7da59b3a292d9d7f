"""Big checkpoints: a snapshot over ``SCAN_APART`` is written before its head is scanned.

Its bytes go into the spare while a thread scans the message's head, and only then are
the head's checks made and the spare swapped in. So every check that fails after the
write must still leave the checkpoint as it was, and every answer must be the one the same
call with a small snapshot gets. The file has no ``messageId`` now; one written before
(with it) must still be read and promoted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from host._turns import SCAN_APART
from tests.conftest import Client, StartHost, everything, get_messages
from tests.e2e.test_checkpoints import checkpoint, streaming
from tests.e2e.turnkit import boot, cli, fails, file_state, inflight, reboot, reply

BIG = 3 * SCAN_APART  # characters of content: well past the threshold


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
    sizes = [BIG, 2 * BIG, BIG + 7, SCAN_APART + 1, 2 * BIG]
    for i, size in enumerate(sizes):
        snap = reply("a1", str(i % 10) * size)
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
    assert (file_state(inflight(data_dir, "s")), await kept(client, data_dir)) == before


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
