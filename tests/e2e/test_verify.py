"""``python -m host verify``: 0 when transcripts and index agree, 1 otherwise; --repair."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from host._intents import Change, Cut
from tests.conftest import (
    Client,
    HostProcess,
    StartHost,
    disk_state,
    get_messages,
    make_session,
    msg,
    run_cli,
    transcript,
)


async def _verify(data: Path, *extra: str) -> tuple[int, str]:
    code, out, _err = await run_cli("verify", "--data-dir", str(data), *extra)
    return code, out


def _named(out: str) -> set[str]:
    """The sessions verify printed a disagreement for (lines ``<sessionId>: ...``)."""
    heads = {line.split(": ", 1)[0] for line in out.splitlines() if ": " in line}
    return {h for h in heads if re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", h)}


async def _two_sessions(host: HostProcess, client: Client) -> None:
    await make_session(client, "a", 4)
    await make_session(client, "b", 2)
    assert await host.stop() == 0


async def test_a_clean_dir_verifies_and_verify_changes_nothing(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    await make_session(client, "a", 3)
    code, out = await _verify(data_dir)  # beside the live host
    assert code == 0, out
    assert await host.stop() == 0
    before = disk_state(data_dir)
    code, out = await _verify(data_dir)
    assert code == 0, out
    assert disk_state(data_dir) == before


async def test_an_edited_line_is_found_and_repaired(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    await _two_sessions(host, client)
    path = transcript(data_dir, "a")
    lines = path.read_bytes().split(b"\n")
    lines[1] = json.dumps(msg("m1", "assistant", "a longer, edited text")).encode()
    path.write_bytes(b"\n".join(lines))
    code, out = await _verify(data_dir)
    assert code == 1
    assert _named(out) == {"a"}
    code, out = await _verify(data_dir, "--repair")
    assert code == 0, out
    assert (await _verify(data_dir))[0] == 0
    host2 = await start_host()
    assert host2.client is not None
    await host2.client.handshake()
    got = await get_messages(host2.client, "a")
    assert [m["id"] for m in got] == ["m0", "m1", "m2", "m3"]
    assert got[1]["content"] == "a longer, edited text"


async def test_index_rows_deleted_behind_its_back_are_found_and_repaired(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    await _two_sessions(host, client)
    conn = sqlite3.connect(data_dir / "index.sqlite3")
    try:
        with conn:
            conn.execute("DELETE FROM messages WHERE session_id = 'a' AND line >= 2")
    finally:
        conn.close()
    code, out = await _verify(data_dir)
    assert code == 1
    assert _named(out) == {"a"}
    before = transcript(data_dir, "a").read_bytes()
    code, out = await _verify(data_dir, "--repair")
    assert code == 0, out
    assert transcript(data_dir, "a").read_bytes() == before  # the truth was not touched
    assert (await _verify(data_dir))[0] == 0
    host2 = await start_host()
    assert host2.client is not None
    await host2.client.handshake()
    assert [m["id"] for m in await get_messages(host2.client, "a")] == ["m0", "m1", "m2", "m3"]


async def test_a_torn_tail_and_a_corrupt_line_are_found_and_repaired(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    await _two_sessions(host, client)
    with open(transcript(data_dir, "a"), "ab") as f:
        f.write(b"not json\n" + json.dumps(msg("m4")).encode() + b"\n")
    with open(transcript(data_dir, "b"), "ab") as f:
        f.write(b'{"id": "m2", "ro')
    code, out = await _verify(data_dir)
    assert code == 1
    assert _named(out) == {"a", "b"}
    code, out = await _verify(data_dir, "--repair")
    assert code == 0, out
    assert (await _verify(data_dir))[0] == 0
    assert (data_dir / "sessions" / "a.jsonl.quarantine").exists()
    assert transcript(data_dir, "b").read_bytes().endswith(b"}\n")


async def test_verify_of_a_missing_dir_fails(tmp_path: Path) -> None:
    code, out = await _verify(tmp_path / "nowhere")
    assert code == 1, out
    assert not (tmp_path / "nowhere").exists()


async def _left_by_a_dead_host(start_host: StartHost, data: Path) -> None:
    """A data dir as a host that died leaves it, with work that only a start finishes.

    - ``s``: a turn running, its reply in a checkpoint (a start ends the turn ``aborted``);
    - ``c``: a regenerate recorded (its intent and archived payload on disk) but not yet
      applied: the transcript still holds the reply it cuts (a start cuts it, restamps
      the root and installs the manifest);
    - ``gone``: the sidecar and the archive of a session whose transcript is gone.
    """
    host = await start_host(data)
    c = host.client
    assert c is not None
    await c.handshake()
    await c.call("session.create", sessionId="s")
    await c.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("q"))
    await c.call(
        "session.saveInflightMessage",
        sessionId="s",
        turnId="t1",
        message=msg("a", "assistant", "a partial answer"),
    )
    await make_session(c, "c", 2)
    before = transcript(data, "c").read_bytes()
    await c.call("session.truncateFrom", sessionId="c", fromMessageId="m1")  # regenerate
    assert await host.stop() == 0
    # Back to the instant after the regenerate's record: payload written, manifest prepared
    # (a temp file the intent names), intent recorded, transcript untouched.
    restamped = transcript(data, "c").read_bytes().removesuffix(b"\n")
    manifest = data / "revisions" / "c" / "m0" / "manifest.json"
    prepared = manifest.with_name("manifest.json.0123456789ab.tmp")
    manifest.rename(prepared)
    transcript(data, "c").write_bytes(before)
    change = Change("c", root_id="m0", manifest=prepared.name, cut=Cut(0, restamped.decode()))
    (data / "sessions" / "c.intent.json").write_bytes(msgspec.json.encode(change))
    (data / "sessions" / "gone.meta.json").write_bytes(b'{"title": "deleted"}')
    (data / "revisions" / "gone" / "m0").mkdir(parents=True)
    (data / "revisions" / "gone" / "m0" / "manifest.json").write_bytes(b'{"revisions": []}')


def _state(data: Path) -> dict[str, Any]:
    """The files under sessions/ and revisions/ and the index's rows, times left out."""
    files: dict[str, Any] = {}
    for path in sorted(p for d in ("sessions", "revisions") for p in (data / d).rglob("*")):
        body: Any = path.read_bytes() if path.is_file() else None
        if path.name.endswith(".turns.log"):
            body = [{k: v for k, v in json.loads(r).items() if k != "at"} for r in body.split()]
        files[str(path.relative_to(data))] = body
    uri = f"file:{data / 'index.sqlite3'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        return {
            "files": files,
            "sessions": db.execute(
                "SELECT session_id, title, line_count, byte_size, dirty FROM sessions ORDER BY 1"
            ).fetchall(),
            "messages": db.execute("SELECT * FROM messages ORDER BY 1, 2").fetchall(),
            "turns": db.execute(
                "SELECT session_id, turn_id, status FROM turns ORDER BY 1, 2"
            ).fetchall(),
        }


async def test_repair_runs_the_recovery_of_a_start(
    start_host: StartHost, data_dir: Path, tmp_path: Path
) -> None:
    """Found at 86ff206 (issue 33): ``verify --repair`` ran a recovery of its own.

    It rebuilt the index from the transcripts but finished no intent, ended no running
    turn and removed no leftover, then said the data dir was clean: the next start cut
    a reply out of a transcript that verify had just called sound. Repair and start now
    run one recovery: a repaired data dir is the one a start makes of the same files.
    """
    await _left_by_a_dead_host(start_host, data_dir)
    twin = tmp_path / "twin"
    shutil.copytree(data_dir, twin)
    code, out = await _verify(data_dir, "--repair")
    assert code == 0, out
    started = await start_host(twin)  # start, recover, stop
    assert started.client is not None
    await started.client.handshake()
    assert await started.stop() == 0
    repaired = _state(data_dir)
    assert repaired == _state(twin)
    assert "sessions/c.intent.json" not in repaired["files"]
    assert "sessions/gone.meta.json" not in repaired["files"]
    assert [m[2] for m in repaired["messages"] if m[0] == "c"] == ["m0"]  # the reply cut
    assert repaired["turns"] == [("s", "t1", "aborted")]
    assert (await _verify(data_dir))[0] == 0
    again = await start_host(data_dir)  # and the next start finds nothing to do
    assert again.client is not None
    await again.client.handshake()
    assert await again.stop() == 0
    assert "recovered 2 session(s): 0 reconciled" in again.log, again.log
    assert "at start" not in again.log, again.log
    assert _state(data_dir) == repaired
