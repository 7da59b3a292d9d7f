"""``python -m host verify``: 0 when transcripts and index agree, 1 otherwise; --repair."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

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
