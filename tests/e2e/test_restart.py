"""Durability and start-up recovery: what a user finds after a stop, a crash, or an edit.

Every test stops (or kill -9s) a real host, changes the data dir the way a crash or a
person would, starts a new host on it, and looks at what the protocol serves.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from tests.conftest import (
    Client,
    HostProcess,
    StartHost,
    dumps,
    get_messages,
    make_session,
    msg,
    restart,
    restart_host,
    run_cli,
    transcript,
)


def _line(m: dict[str, object]) -> bytes:
    return dumps(m) + b"\n"


async def _verify_clean(data: Path) -> None:
    code, out, err = await run_cli("verify", "--data-dir", str(data))
    assert code == 0, out + err


async def test_sessions_and_messages_survive_a_restart(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    a = await make_session(client, "a", 3, title="Alpha")
    b = await make_session(client, "b", 1)
    await client.call("session.updateMessage", sessionId="a", message=msg("m1", content="edit"))
    a[1] = msg("m1", content="edit")
    listing = (await client.call("session.list"))["sessions"]
    files = {p.name: p.read_bytes() for p in (data_dir / "sessions").iterdir()}
    client2 = await restart(start_host, host)
    assert (await client2.call("session.list"))["sessions"] == listing
    assert await get_messages(client2, "a") == a
    assert await get_messages(client2, "b") == b
    assert {p.name: p.read_bytes() for p in (data_dir / "sessions").iterdir()} == files
    # And the new host carries on where the old one stopped.
    res = await client2.call("session.appendMessage", sessionId="a", message=msg("m3"))
    assert res == {"line": 3, "appended": True}
    res = await client2.call("session.appendMessage", sessionId="a", message=msg("m0"))
    assert res == {"line": 0, "appended": False}
    await _verify_clean(data_dir)


async def test_the_index_is_rebuilt_from_the_transcripts(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    a = await make_session(client, "a", 4, title="Alpha")
    await make_session(client, "empty", 0)
    assert await host.stop() == 0
    for name in os.listdir(data_dir):
        if name.startswith("index.sqlite3"):
            os.unlink(data_dir / name)
    host2 = await start_host()
    assert host2.client is not None
    client2 = host2.client
    await client2.handshake()
    rows = {r["sessionId"]: r for r in (await client2.call("session.list"))["sessions"]}
    assert set(rows) == {"a", "empty"}
    assert (rows["a"]["title"], rows["a"]["messageCount"]) == ("Alpha", 4)
    assert await get_messages(client2, "a") == a
    assert (await client2.call("session.appendMessage", sessionId="a", message=msg("m2")))[
        "appended"
    ] is False
    await _verify_clean(data_dir)


@pytest.mark.parametrize(
    "torn",
    [
        b'{"id":"m9","role":"user","content":"never fini',
        b'{"id":"m9","role":"user","content":"complete json but no newline"}',
        b"{",
    ],
)
async def test_a_torn_last_line_is_cut_and_the_rest_is_served(
    host: HostProcess,
    client: Client,
    start_host: StartHost,
    data_dir: Path,
    torn: bytes,
) -> None:
    sent = await make_session(client, "s", 3)
    assert await host.stop() == 0
    path = transcript(data_dir, "s")
    good = path.read_bytes()
    with open(path, "ab") as f:
        f.write(torn)  # a crash in the middle of an append: no newline, never acknowledged
    host2 = await start_host()
    client2 = host2.client
    assert client2 is not None
    await client2.handshake()
    assert await get_messages(client2, "s") == sent
    assert path.read_bytes() == good
    await host2.wait_for_log("torn")  # reported in the log
    res = await client2.call("session.appendMessage", sessionId="s", message=msg("m9"))
    assert res == {"line": 3, "appended": True}
    assert path.read_bytes() == good + _line(msg("m9"))
    assert await host2.stop() == 0
    await _verify_clean(data_dir)


async def test_lines_appended_while_the_host_was_down_are_indexed(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    sent = await make_session(client, "s", 2)
    assert await host.stop() == 0
    extra = [msg("x1", "assistant", turnId="t7"), msg("x2")]
    with open(transcript(data_dir, "s"), "ab") as f:
        f.write(b"".join(_line(m) for m in extra))
    host2 = await start_host()
    client2 = host2.client
    assert client2 is not None
    await client2.handshake()
    assert await get_messages(client2, "s") == sent + extra
    page = await client2.call("session.get", sessionId="s", beforeLine=4, limit=1)
    assert page["messages"] == [extra[1]] and page["startLine"] == 3
    (row,) = (await client2.call("session.list"))["sessions"]
    assert row["messageCount"] == 4
    res = await client2.call("session.appendMessage", sessionId="s", message=extra[0])
    assert res == {"line": 2, "appended": False}  # indexed: deduplicated
    res = await client2.call("session.appendMessage", sessionId="s", message=msg("x3"))
    assert res == {"line": 4, "appended": True}
    assert await host2.stop() == 0
    await _verify_clean(data_dir)


async def test_a_transcript_that_appeared_while_the_host_was_down_is_served(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    await make_session(client, "s", 1)
    assert await host.stop() == 0
    new = [msg("n0"), msg("n1", "assistant")]
    transcript(data_dir, "copied-in").write_bytes(b"".join(_line(m) for m in new))
    host2 = await start_host()
    assert host2.client is not None
    await host2.client.handshake()
    assert await get_messages(host2.client, "copied-in") == new
    ids = {r["sessionId"] for r in (await host2.client.call("session.list"))["sessions"]}
    assert ids == {"s", "copied-in"}


def _quarantined(data: Path, sid: str) -> list[dict[str, object]]:
    path = data / "sessions" / f"{sid}.jsonl.quarantine"
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def test_corrupt_lines_among_new_ones_are_quarantined_and_reported(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    sent = await make_session(client, "s", 2)
    assert await host.stop() == 0
    bad = [b"this is not json", b'{"id":"x9","role":"robot"}', _line(msg("m0"))[:-1]]
    new = [msg("n0"), msg("n1"), msg("n2")]
    with open(transcript(data_dir, "s"), "ab") as f:
        f.write(_line(new[0]) + bad[0] + b"\n" + _line(new[1]) + bad[1] + b"\n")
        f.write(bad[2] + b"\n" + _line(new[2]))  # bad[2] repeats a stored id
    host2 = await start_host()
    client2 = host2.client
    assert client2 is not None
    await client2.handshake()
    assert await get_messages(client2, "s") == sent + new
    records = _quarantined(data_dir, "s")
    assert [base64.b64decode(str(r["rawBase64"])) for r in records] == bad
    await host2.wait_for_log("quarantine")  # reported in the log
    # The transcript now holds only good lines, and the index agrees with it.
    stored = transcript(data_dir, "s").read_bytes()
    assert stored == b"".join(_line(m) for m in sent + new)
    assert await host2.stop() == 0
    await _verify_clean(data_dir)


async def test_stats_report_each_quarantined_line_once(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    await make_session(client, "s", 1)
    assert await host.stop() == 0
    with open(transcript(data_dir, "s"), "ab") as f:
        f.write(b"garbage\n" + _line(msg("ok")))
    host2 = await start_host()
    assert host2.client is not None
    await host2.client.handshake()
    counters = (await host2.client.call("host.stats"))["counters"]
    assert counters["recovery.quarantined_lines"] == 1


async def test_a_line_corrupted_in_place_is_quarantined_not_served(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    sent = await make_session(client, "s", 3)
    assert await host.stop() == 0
    path = transcript(data_dir, "s")
    lines = path.read_bytes().split(b"\n")
    with open(path, "r+b") as f:  # bit rot in line 1: same inode, same size
        f.seek(len(lines[0]) + 1)
        f.write(b"\x00" * len(lines[1]))
    host2 = await start_host()
    client2 = host2.client
    assert client2 is not None
    await client2.handshake()
    assert await get_messages(client2, "s") == [sent[0], sent[2]]
    assert [base64.b64decode(str(r["rawBase64"])) for r in _quarantined(data_dir, "s")] == [
        b"\x00" * len(lines[1])
    ]


async def test_stale_temp_files_are_removed_at_start(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    sent = await make_session(client, "s", 2)
    assert await host.stop() == 0
    stale = [
        data_dir / "sessions" / "s.jsonl.0123456789ab.tmp",
        data_dir / "sessions" / "s.meta.json.ffffffffffff.tmp",
        data_dir / "revisions" / "s" / "root" / "payload.0a0b0c0d0e0f.tmp",
    ]
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half a rewrite")
    before = transcript(data_dir, "s").read_bytes()
    client2 = await restart(start_host, host)
    assert not list(data_dir.rglob("*.tmp"))
    assert transcript(data_dir, "s").read_bytes() == before
    assert await get_messages(client2, "s") == sent


async def test_append_rewrite_append_then_kill_9_keeps_both_appends(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"))
    await client.call("session.updateMessage", sessionId="s", message=msg("a", content="new"))
    res = await client.call("session.appendMessage", sessionId="s", message=msg("b"))
    assert res == {"line": 1, "appended": True}
    client2 = await restart(start_host, host, kill=True)
    assert await get_messages(client2, "s") == [msg("a", content="new"), msg("b")]
    await _verify_clean(data_dir)


async def test_every_acknowledged_write_survives_kill_9(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    futs = []
    lines = []
    for i in range(100):
        rid = client.next_id()
        futs.append(client.expect(rid))
        params = {"sessionId": "s", "message": msg(f"m{i}")}
        lines.append(dumps(client.envelope("session.appendMessage", params, rid)) + b"\n")
    await client.send_raw(b"".join(lines))
    acked = [(await client.wait(f))["result"]["line"] for f in futs]
    assert acked == list(range(100))
    await client.call("session.deleteMessages", sessionId="s", messageIds=["m0", "m50"])
    await client.call(
        "session.replaceMessages",
        sessionId="s",
        messages=[*(await get_messages(client, "s"))[:10], msg("last")],
    )
    await make_session(client, "created", 1, title="new")
    await make_session(client, "doomed", 2)
    await client.call("session.delete", sessionId="doomed")
    client2 = await restart(start_host, host, kill=True)
    ids = [m["id"] for m in await get_messages(client2, "s")]
    assert ids == [f"m{i}" for i in range(1, 11)] + ["last"]
    rows = {r["sessionId"]: r for r in (await client2.call("session.list"))["sessions"]}
    assert set(rows) == {"s", "created"}
    assert (rows["created"]["title"], rows["created"]["messageCount"]) == ("new", 1)
    await _verify_clean(data_dir)


async def test_a_file_changed_behind_a_running_hosts_back_is_reconciled_first(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    """A session not opened since start, edited while the host runs, then written to."""
    await make_session(client, "s", 2)
    host2 = await restart_host(start_host, host)
    assert host2.client is not None
    with open(transcript(data_dir, "s"), "ab") as f:
        f.write(b"not json\n" + _line(msg("ext")))
    res = await host2.client.call("session.appendMessage", sessionId="s", message=msg("after"))
    assert res == {"line": 3, "appended": True}
    expected = ["m0", "m1", "ext", "after"]
    assert [m["id"] for m in await get_messages(host2.client, "s")] == expected
    client3 = await restart(start_host, host2, kill=True)
    assert [m["id"] for m in await get_messages(client3, "s")] == expected
    await _verify_clean(data_dir)
