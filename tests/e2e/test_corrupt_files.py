"""Corrupt files (issue 6): damage one file of a stopped host's data dir, start it again.

Each test builds a data dir through a real host (two sessions, so that one of them is a
bystander), stops it, damages one file the way a disk or a stray tool could (flipped bytes,
a cut, garbage), starts a new host on it and checks what a user would see: nothing damaged
comes back as a message, the damage is moved aside (``<id>.jsonl.quarantine``) and
reported in the log, every intact line is still served, the other session is untouched.
A test that found a bug says so in a comment (the commit it was found at, and what it was).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    BRIEF_WAIT,
    Client,
    HostProcess,
    StartHost,
    get_messages,
    index_locked,
    msg,
    run_cli,
    transcript,
)
from tests.e2e.turnkit import two_streaming_turns

DEEP = b"[" * 3000 + b"]" * 3000
"""JSON nested deeper than msgspec (or Python's json) decodes: only a hand edit writes it."""

MAIN = [msg(f"m{i}", "user" if i % 2 == 0 else "assistant") for i in range(6)]
OTHER = [msg(f"o{i}", "user" if i % 2 == 0 else "assistant") for i in range(4)]


async def _fill(client: Client) -> None:
    await client.call("session.create", sessionId="s", title="main")
    await client.call("session.create", sessionId="other", title="bystander")
    for sid, sent in (("s", MAIN), ("other", OTHER)):
        for m in sent:
            await client.call("session.appendMessage", sessionId=sid, message=m)


@pytest.fixture
async def built(start_host: StartHost, data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """A stopped host's data dir holding sessions ``s`` and ``other``; what each served."""
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    await _fill(host.client)
    served = {sid: await get_messages(host.client, sid) for sid in ("s", "other")}
    assert await host.stop() == 0
    return served


async def _start(start_host: StartHost, data: Path) -> tuple[HostProcess, Client]:
    host = await start_host(data)
    assert host.client is not None
    try:
        await host.client.handshake()
    except ConnectionError:
        code = await host.wait()
        raise AssertionError(f"the host did not start (exit {code}); log:\n{host.log}") from None
    return host, host.client


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def _replace_line(path: Path, n: int, new: bytes) -> bytes:
    """Replace line ``n`` (newline excluded) by ``new``; return the old bytes."""
    lines = _lines(path)
    old = lines[n]
    lines[n] = new
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return old


def _offset_of_line(path: Path, n: int) -> int:
    return sum(len(line) + 1 for line in _lines(path)[:n])


def _quarantined(data: Path, sid: str) -> list[dict[str, Any]]:
    """The quarantine records of a session, each with its bytes decoded into ``raw``."""
    path = data / "sessions" / f"{sid}.jsonl.quarantine"
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        rec = json.loads(line)
        rec["raw"] = base64.b64decode(rec["rawBase64"])
        out.append(rec)
    return out


def _problems(log: str) -> list[str]:
    """Log lines at WARNING level or above."""
    return [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]


async def _verify(data: Path, *args: str) -> tuple[int, str]:
    code, out, err = await run_cli("verify", "--data-dir", str(data), *args)
    return code, out + err


def _ids(messages: list[dict[str, Any]]) -> list[str]:
    return [m["id"] for m in messages]


async def _other_untouched(client: Client, served: dict[str, list[dict[str, Any]]]) -> None:
    assert await get_messages(client, "other") == served["other"]


# -- transcripts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        b"#garbage#",
        b'{"id":"m2","role":"user","content":"text of m2"',  # cut short: no closing brace
        b'{"no":"id","role":"user"}',  # JSON, but not a message
        b'{"id":"m1","role":"user","content":"a copy of another line"}',  # a repeated id
        b"\x00\x01\x02\xff\xfe garbage of another length \x80",
        # Found at f4fe54d: nested deeper than msgspec decodes (a hand edit), it raised
        # RecursionError out of recovery, and the host could not start at all.
        b'{"id":"m2","role":"user","content":' + DEEP + b"}",
    ],
    ids=["garbage", "cut-short", "not-a-message", "duplicate-id", "binary", "nested-too-deep"],
)
async def test_a_damaged_middle_line_is_quarantined_and_the_rest_served(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]], damage: bytes
) -> None:
    path = transcript(data_dir, "s")
    assert len(damage) != len(_lines(path)[2])  # a size change: the host must rescan
    _replace_line(path, 2, damage)
    host, client = await _start(start_host, data_dir)

    page = await get_messages(client, "s")
    assert page == [m for m in built["s"] if m["id"] != "m2"]
    records = _quarantined(data_dir, "s")
    assert [r["raw"] for r in records] == [damage], records
    assert records[0]["reason"]
    assert damage not in path.read_bytes()
    assert any("quarantined" in line and "session s" in line for line in _problems(host.log))
    await _other_untouched(client, built)
    # The session goes on: a new message lands after the survivors.
    await client.call("session.appendMessage", sessionId="s", message=msg("m6"))
    assert _ids(await get_messages(client, "s")) == ["m0", "m1", "m3", "m4", "m5", "m6"]
    assert await host.stop() == 0
    assert await _verify(data_dir) == (0, "checked 2 session(s), 10 line(s): 0 problem(s)\n")


async def test_a_transcript_cut_inside_a_line_keeps_every_whole_line(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]]
) -> None:
    path = transcript(data_dir, "s")
    cut = _offset_of_line(path, 3) + 10  # ten bytes into line 3
    torn = path.read_bytes()[_offset_of_line(path, 3) : cut]
    os.truncate(path, cut)
    host, client = await _start(start_host, data_dir)

    assert await get_messages(client, "s") == built["s"][:3]
    assert [r["raw"] for r in _quarantined(data_dir, "s")] == [torn]
    assert any("torn" in line and "session s" in line for line in _problems(host.log))
    await _other_untouched(client, built)
    assert await host.stop() == 0
    assert (await _verify(data_dir))[0] == 0


# Found at b28e0dc: the lost lines were not reported at all; the torn piece was even logged
# as "never acknowledged".
async def test_acknowledged_lines_lost_to_a_cut_are_reported(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]]
) -> None:
    path = transcript(data_dir, "s")
    os.truncate(path, _offset_of_line(path, 3) + 10)  # lines 3-5 were acknowledged
    host, _ = await _start(start_host, data_dir)
    assert await host.stop() == 0
    # Not a torn tail (a warning): acknowledged lines are gone, and the log says so.
    errors = [line for line in host.log.splitlines() if " ERROR " in line]
    assert any("session s" in line for line in errors), host.log


def _flip(path: Path, how: str) -> list[str]:
    """Overwrite one byte in place (same inode, same size); return the ids it spoils."""
    data = bytearray(path.read_bytes())
    if how == "flip-newline":  # lines 2 and 3 run together
        at, lost = _offset_of_line(path, 3) - 1, ["m2", "m3"]
    else:  # the "{" of line 2
        at, lost = _offset_of_line(path, 2), ["m2"]
    data[at] = ord("X")
    with open(path, "r+b") as f:
        f.write(data)
    return lost


@pytest.mark.parametrize("how", ["flip-brace", "flip-newline"])
async def test_damage_that_keeps_the_size_is_quarantined_too(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]], how: str
) -> None:
    path = transcript(data_dir, "s")
    lost = _flip(path, how)
    damaged = _lines(path)[2]  # the flipped line (two lines run together, for a newline)
    host, client = await _start(start_host, data_dir)

    assert await get_messages(client, "s") == [m for m in built["s"] if m["id"] not in lost]
    assert [r["raw"] for r in _quarantined(data_dir, "s")] == [damaged]
    assert any("quarantined" in line and "session s" in line for line in _problems(host.log))
    await _other_untouched(client, built)
    assert await host.stop() == 0
    assert (await _verify(data_dir))[0] == 0


# Found at b28e0dc: bytes that rot in place were sent verbatim as a message (a non-JSON reply):
# read_rows did not check them.
async def test_bytes_that_rot_in_place_are_never_sent_as_a_message(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]]
) -> None:
    path = transcript(data_dir, "s")
    before = path.stat()
    lost = _flip(path, "flip-brace")
    damaged = _lines(path)[2]
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # nobody wrote: the disk did
    host, client = await _start(start_host, data_dir)

    resp = await client.request("session.get", {"sessionId": "s"})
    if "error" in resp:  # found on the read: refused once (not INTERNAL), then served
        assert resp["error"]["data"]["code"] == "STORAGE_ERROR", resp
        resp = await client.request("session.get", {"sessionId": "s"})
    assert resp.get("result", {}).get("messages") == [
        m for m in built["s"] if m["id"] not in lost
    ], resp
    assert [r["raw"] for r in _quarantined(data_dir, "s")] == [damaged]
    assert any("session s" in line for line in _problems(host.log)), host.log
    await _other_untouched(client, built)


# Found at b28e0dc: parse_stored accepted invalid UTF-8 inside a string, so even a full rescan
# indexed it and session.get sent it.
async def test_a_line_with_invalid_utf8_is_quarantined(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]]
) -> None:
    path = transcript(data_dir, "s")
    line = _lines(path)[2]
    damaged = line.replace(b"text of", b"te\xffxt of")  # a byte more: a full rescan
    _replace_line(path, 2, damaged)
    host, client = await _start(start_host, data_dir)

    assert await get_messages(client, "s") == [m for m in built["s"] if m["id"] != "m2"]
    assert [r["raw"] for r in _quarantined(data_dir, "s")] == [damaged]
    await _other_untouched(client, built)
    assert await host.stop() == 0
    assert (await _verify(data_dir))[0] == 0


# -- the index --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["emptied", "deleted", "garbage-wal"])
async def test_an_index_that_is_gone_is_rebuilt_from_the_transcripts(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]], how: str
) -> None:
    index = data_dir / "index.sqlite3"
    if how == "emptied":
        os.truncate(index, 0)
    elif how == "deleted":
        index.unlink()
    else:
        assert not Path(f"{index}-wal").exists()  # a clean stop folds the WAL in
        Path(f"{index}-wal").write_bytes(os.urandom(64 * 1024))
    host, client = await _start(start_host, data_dir)

    for sid in ("s", "other"):
        assert await get_messages(client, sid) == built[sid]
    listed = {s["sessionId"]: s for s in (await client.call("session.list"))["sessions"]}
    assert {sid: s["title"] for sid, s in listed.items()} == {"s": "main", "other": "bystander"}
    assert {sid: s["messageCount"] for sid, s in listed.items()} == {"s": 6, "other": 4}
    assert await host.stop() == 0
    assert await _verify(data_dir) == (0, "checked 2 session(s), 10 line(s): 0 problem(s)\n")


def _damage_index(index: Path, how: str) -> None:
    size = index.stat().st_size
    if how == "garbage":
        index.write_bytes(os.urandom(size))
    elif how == "half":
        os.truncate(index, size // 2)
    else:  # the 100-byte SQLite header zeroed
        with open(index, "r+b") as f:
            f.write(b"\x00" * 100)


# Found at b28e0dc: an index.sqlite3 that is not a database crashed the start with a
# sqlite3.DatabaseError traceback.
@pytest.mark.parametrize("how", ["garbage", "half", "header-zeroed"])
async def test_an_unreadable_index_is_rebuilt_or_refused_clearly(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]], how: str
) -> None:
    before = {sid: transcript(data_dir, sid).read_bytes() for sid in ("s", "other")}
    _damage_index(data_dir / "index.sqlite3", how)
    host = await start_host(data_dir)
    assert host.client is not None
    try:
        await host.client.handshake()
    except ConnectionError:
        code = await host.wait()
        # Refused: that is allowed, if it says why in a line and loses nothing.
        assert code != 0
        assert "Traceback" not in host.log, host.log
        assert "index" in host.log
    else:
        for sid in ("s", "other"):
            assert await get_messages(host.client, sid) == built[sid]
        assert await host.stop() == 0
    assert {sid: transcript(data_dir, sid).read_bytes() for sid in ("s", "other")} == before


def _other_schema(index: Path, how: str) -> None:
    with contextlib.closing(sqlite3.connect(index)) as db, db:
        if how == "newer-hostcore":  # a later release's migration, then a downgrade
            db.execute("INSERT INTO migrations VALUES ('0002-future', datetime('now'))")
            db.execute("ALTER TABLE sessions RENAME COLUMN line_count TO lines")
        elif how == "another-program":  # another program's database at the path
            for table in ("migrations", "sessions", "messages", "turns"):
                db.execute(f"DROP TABLE {table}")
            db.execute("CREATE TABLE sessions (id TEXT, data BLOB)")
        elif how == "column-dropped":  # by a tool, under the same migrations
            db.execute("ALTER TABLE turns DROP COLUMN ended_at")
        else:  # a view where a table was
            db.execute("DROP TABLE sessions")
            db.execute("CREATE VIEW sessions AS SELECT 's' AS session_id")


# Found at 7adeacc: an index this hostcore did not write stopped every start with a
# traceback ("table sessions already exists"), or would be read with the wrong queries.
# Found at 721e111: one with this host's migrations but a table altered or replaced by a
# view was trusted by its migrations' names, and verify then crashed with a traceback.
@pytest.mark.parametrize(
    "how", ["newer-hostcore", "another-program", "column-dropped", "view-for-table"]
)
async def test_an_index_of_another_schema_is_set_aside_and_rebuilt(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]], how: str
) -> None:
    index = data_dir / "index.sqlite3"
    _other_schema(index, how)
    foreign = index.read_bytes()
    code, out = await _verify(data_dir)
    assert code == 1 and "of another schema" in out and "--repair" in out, out
    host, client = await _start(start_host, data_dir)
    for sid in ("s", "other"):
        assert await get_messages(client, sid) == built[sid]
    assert await host.stop() == 0
    assert "of another schema" in host.log and "Traceback" not in host.log, host.log
    assert [p.read_bytes() for p in data_dir.glob("index.sqlite3.damaged-??????")] == [foreign]
    assert await _verify(data_dir) == (0, "checked 2 session(s), 10 line(s): 0 problem(s)\n")


# Found at 721e111: a host killed between creating the migrations table and applying the
# first migration left an index that the next start called "of another schema".
async def test_an_index_killed_before_its_first_migration_is_migrated_not_set_aside(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]]
) -> None:
    index = data_dir / "index.sqlite3"
    for path in data_dir.glob("index.sqlite3*"):
        path.unlink()
    with contextlib.closing(sqlite3.connect(index)) as db, db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT)")
    host, client = await _start(start_host, data_dir)
    for sid in ("s", "other"):
        assert await get_messages(client, sid) == built[sid]
    assert await host.stop() == 0
    assert "moved to" not in host.log, host.log  # nothing set aside
    assert list(data_dir.glob("index.sqlite3.damaged-*")) == []
    assert await _verify(data_dir) == (0, "checked 2 session(s), 10 line(s): 0 problem(s)\n")


# Found at 721e111: an index another program held locked was called damaged after the
# busy timeout and moved aside, from under that program.
async def test_an_index_another_program_holds_locked_is_refused_and_left_in_place(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]]
) -> None:
    index = data_dir / "index.sqlite3"
    with index_locked(index):  # a lock nobody lets go: each waits out its busy timeout
        code, out = await _verify(data_dir, *BRIEF_WAIT)
        assert code == 2 and "locked by another program" in out, out
        host = await start_host(data_dir, args=BRIEF_WAIT)
        assert host.client is not None
        with pytest.raises(ConnectionError):
            await host.client.handshake()
        assert await host.wait() == 3
        assert "locked by another program" in host.log and "Traceback" not in host.log, host.log
        assert list(data_dir.glob("index.sqlite3.damaged-*")) == []
    host, client = await _start(start_host, data_dir)
    for sid in ("s", "other"):
        assert await get_messages(client, sid) == built[sid]
    assert await host.stop() == 0


# Found at 44236db: a sidecar nested deeper than the decoders go raised RecursionError out
# of the start (the intent files are read at every start, a meta file when the index lacks
# its session), and the host could not start at all.
@pytest.mark.parametrize("sidecar", ["s.intent.json", "s.meta.json"])
async def test_a_sidecar_nested_too_deep_does_not_stop_a_start(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]], sidecar: str
) -> None:
    (data_dir / "sessions" / sidecar).write_bytes(b'{"sessionId":"s","x":' + DEEP + b"}")
    for path in data_dir.glob("index.sqlite3*"):
        path.unlink()  # the meta file is read when the index does not know the session
    host, client = await _start(start_host, data_dir)
    for sid in ("s", "other"):
        assert await get_messages(client, sid) == built[sid]
    assert await host.stop() == 0
    assert "Traceback" not in host.log, host.log


# -- checkpoints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b"\xff\xfe garbage" + b[5:],
        lambda b: b[: len(b) // 2],
        lambda b: b"",
        lambda b: b'{"sessionId":"s","turnId":"t1"}',
        lambda b: b.replace(b'"turnId":"t1"', b'"turnId":17'),
        lambda b: b.replace(b'"a partial answer"', DEEP),
    ],
    ids=["garbage", "cut-in-half", "empty", "fields-missing", "wrong-type", "nested-too-deep"],
)
async def test_a_damaged_checkpoint_is_quarantined_never_promoted(
    start_host: StartHost, data_dir: Path, damage: Any
) -> None:
    await two_streaming_turns(start_host)
    path = data_dir / "sessions" / "s.inflight.json"
    bad = damage(path.read_bytes())
    path.write_bytes(bad)
    host, client = await _start(start_host, data_dir)
    # The connect sequence settles leftovers (if the start did not already).
    recovered = (await client.call("session.recoverInflightMessages"))["recovered"]

    assert [r["sessionId"] for r in recovered] in ([], ["other"])  # never the damaged one
    assert _ids(await get_messages(client, "s")) == ["s-q"]
    records = _quarantined(data_dir, "s")
    assert [r["raw"] for r in records] == [bad]
    assert "checkpoint" in records[0]["reason"]
    assert not path.exists()
    assert any("quarantined" in line and "session s" in line for line in _problems(host.log))
    # The other session's checkpoint is promoted as its own turn's aborted row.
    other = await get_messages(client, "other")
    assert _ids(other) == ["other-q", "other-a"]
    assert other[1]["status"] == "aborted" and other[1]["turnId"] == "t1"
    assert await host.stop() == 0
    assert (await _verify(data_dir))[0] == 0


# Found at b28e0dc: a checkpoint whose message was no longer valid was deleted, not quarantined
# (_turns.promote).
async def test_a_checkpoint_whose_message_is_damaged_is_quarantined(
    start_host: StartHost, data_dir: Path
) -> None:
    await two_streaming_turns(start_host)
    path = data_dir / "sessions" / "s.inflight.json"
    bad = path.read_bytes().replace(b'"assistant"', b'"assistbnt"')
    path.write_bytes(bad)
    _host, client = await _start(start_host, data_dir)
    await client.call("session.recoverInflightMessages")  # the connect sequence
    assert _ids(await get_messages(client, "s")) == ["s-q"]
    assert any(b'"assistbnt"' in r["raw"] for r in _quarantined(data_dir, "s"))


# -- revision archives ------------------------------------------------------------------


async def _archived(start_host: StartHost, data: Path) -> None:
    """Session ``s``: root u1 with an archived branch (a1) and a live one (a2); stopped."""
    host = await start_host(data)
    assert host.client is not None
    c = host.client
    await c.handshake()
    await c.call("session.create", sessionId="s")
    await c.call("session.appendMessage", sessionId="s", message=msg("u1"))
    await c.call("session.appendMessage", sessionId="s", message=msg("a1", "assistant"))
    await c.call("session.truncateFrom", sessionId="s", fromMessageId="a1")  # a1 archived
    await c.call("session.appendMessage", sessionId="s", message=msg("a2", "assistant"))
    await c.call("session.create", sessionId="other")
    await c.call("session.appendMessage", sessionId="other", message=msg("o1"))
    assert await host.stop() == 0


def _root_folder(data: Path) -> Path:
    return data / "revisions" / "s" / "u1"


def _payload(data: Path) -> Path:
    (name,) = [p for p in _root_folder(data).iterdir() if p.suffix == ".jsonl"]
    return name


def _valid_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("id"), str) and m.get("role") == "assistant"


# Found at b28e0dc: a damaged manifest stopped the host from starting (_sweep_archives ->
# Archive.load). Found at f9796c4: the start-up sweep then deleted the set-aside manifest and
# every payload it named (the only copy of those branches).
@pytest.mark.parametrize(
    "damage",
    [
        b"\x00garbage{",
        b'{"rootId":"u1","revisions":[{"revision":0,"fi',
        b'{"revisions":[{}]}',
        b'{"rootId":"u1","revisions":' + DEEP + b"}",
    ],
    ids=["garbage", "cut-short", "wrong-shape", "nested-too-deep"],
)
async def test_a_damaged_revision_manifest_is_reported_and_the_host_serves(
    start_host: StartHost, data_dir: Path, damage: bytes
) -> None:
    await _archived(start_host, data_dir)
    payload = _payload(data_dir)
    archived = payload.read_bytes()
    (_root_folder(data_dir) / "manifest.json").write_bytes(damage)
    host, client = await _start(start_host, data_dir)
    assert _ids(await get_messages(client, "s")) == ["u1", "a2"]
    assert _ids(await get_messages(client, "other")) == ["o1"]
    resp = await client.request(
        "session.listRevisions", {"sessionId": "s", "rootId": "u1", "includeMessages": True}
    )
    assert resp.get("error", {}).get("code") != -32603, resp
    for rev in resp.get("result", {}).get("revisions", []):
        assert all(_valid_message(m) for m in rev.get("messages", [])), rev
    assert any("u1" in line for line in _problems(host.log)), host.log
    assert await host.stop() == 0
    await _start(start_host, data_dir)  # a second start sweeps again
    assert payload.read_bytes() == archived
    aside = [p for p in _root_folder(data_dir).iterdir() if ".damaged-" in p.name]
    assert [p.read_bytes() for p in aside] == [damage]


PAYLOAD_DAMAGE = {
    "garbage-line": lambda b: b"garbage, not json\n",
    "invalid-utf8": lambda b: b.replace(b"text of", b"te\xffxt of"),
    "cut-short": lambda b: b[: len(b) // 2],
}


# Found at b28e0dc: listRevisions sent payload lines unchecked (a non-JSON reply), a cut payload
# lost a message silently.
@pytest.mark.parametrize("how", sorted(PAYLOAD_DAMAGE))
async def test_a_damaged_revision_payload_is_never_listed_as_messages(
    start_host: StartHost, data_dir: Path, how: str
) -> None:
    await _archived(start_host, data_dir)
    payload = _payload(data_dir)
    payload.write_bytes(PAYLOAD_DAMAGE[how](payload.read_bytes()))
    host, client = await _start(start_host, data_dir)
    resp = await client.request(
        "session.listRevisions", {"sessionId": "s", "rootId": "u1", "includeMessages": True}
    )
    assert resp.get("error", {}).get("code") != -32603, resp
    reported = any("u1" in line or payload.name in line for line in _problems(host.log))
    for rev in resp.get("result", {}).get("revisions", []):
        messages = rev.get("messages", [])
        assert all(_valid_message(m) for m in messages), rev
        assert len(messages) == rev["messageCount"] or reported, rev
    assert reported, host.log
    assert _ids(await get_messages(client, "s")) == ["u1", "a2"]  # the host serves on


# Found at b28e0dc: activateRevision wrote a non-UTF-8 payload line into the transcript, failed
# INTERNAL on garbage, activated an empty branch for a cut payload.
@pytest.mark.parametrize("how", sorted(PAYLOAD_DAMAGE))
async def test_activating_a_damaged_revision_changes_nothing(
    start_host: StartHost, data_dir: Path, how: str
) -> None:
    await _archived(start_host, data_dir)
    payload = _payload(data_dir)
    payload.write_bytes(PAYLOAD_DAMAGE[how](payload.read_bytes()))
    before = transcript(data_dir, "s").read_bytes()
    _host, client = await _start(start_host, data_dir)
    resp = await client.request(
        "session.activateRevision", {"sessionId": "s", "rootId": "u1", "revision": 0}
    )
    assert "error" in resp and resp["error"]["code"] != -32603, resp
    assert transcript(data_dir, "s").read_bytes() == before
    assert _ids(await get_messages(client, "s")) == ["u1", "a2"]


@pytest.mark.parametrize(
    "kind",
    ["directory", "dangling symlink", "stray file in revisions", "illegal id", "illegal root"],
)
async def test_an_odd_entry_in_the_data_dir_does_not_stop_a_start(
    start_host: StartHost, data_dir: Path, built: dict[str, list[dict[str, Any]]], kind: str
) -> None:
    """Found at 77bc23c: each of these made the start fail with a traceback.

    A transcript named with an illegal id (a copy named by hand) was skipped in silence.
    Found at c190e43: a folder under ``revisions/<id>/`` with a name no root id can have
    stopped the start with an InvalidParams traceback.
    """
    odd = data_dir / "sessions" / "x.jsonl"
    stray = b'{"id":"m1","role":"user","content":"hi"}\n'
    if kind == "illegal id":
        odd = data_dir / "sessions" / "x (copy).jsonl"
        odd.write_bytes(stray)
    elif kind == "directory":
        odd.mkdir()
    elif kind == "dangling symlink":
        odd.symlink_to(data_dir / "nowhere")
    elif kind == "illegal root":
        (data_dir / "revisions" / "s" / "bad name").mkdir(parents=True)
    else:
        (data_dir / "revisions" / "s").mkdir(parents=True, exist_ok=True)
        (data_dir / "revisions" / "s" / "m0").write_bytes(b"not a folder")
    host, client = await _start(start_host, data_dir)
    assert _ids(await get_messages(client, "s")) == _ids(built["s"])
    await _other_untouched(client, built)
    assert "left alone" in host.log
    assert await host.stop() == 0
    code, out = await _verify(data_dir)
    assert (code, "Traceback" in out) == (0, False), out
    if kind == "illegal id":
        assert f"{odd}: not a legal session id" in host.log
        assert odd.read_bytes() == stray


@pytest.mark.parametrize("stray", ["0 copy.inflight.json", "0 copy.intent.json"])
async def test_a_stray_sidecar_name_is_left_alone_and_breaks_no_session(
    start_host: StartHost, data_dir: Path, stray: str
) -> None:
    """Found at 650cc00 (issue 26, case 11): a copy named by hand broke every session.

    ``sessions/0 copy.inflight.json`` (a file manager's copy of a checkpoint) made every
    ``recoverInflightMessages`` answer INVALID_PARAMS, so the real checkpoints that sort
    after it were never settled. A copied intent was worse: read by its content, it was
    replayed over the session it names at every start, its old manifest over the archive.
    A stray name is logged once and left alone, as an odd ``.jsonl`` is.
    """
    await two_streaming_turns(start_host)  # s and other: a running turn and a checkpoint
    host, client = await _start(start_host, data_dir)
    archived = [msg("old-a", "assistant")]  # an earlier answer to s-q, archived
    await client.call("session.saveRevision", sessionId="s", rootId="s-q", messages=archived)
    await host.kill()  # the turns stay running, their checkpoints unsettled
    sessions = data_dir / "sessions"
    body = (sessions / "s.inflight.json").read_bytes()
    if stray.endswith(".intent.json"):  # a copy of an old intent: s-q's archive empty
        body = b'{"sessionId":"s","archive":{"rootId":"s-q","revisions":[]}}'
    (sessions / stray).write_bytes(body)
    host, client = await _start(start_host, data_dir)
    res = await client.call("session.recoverInflightMessages")
    assert sorted((r["sessionId"], r["messageId"]) for r in res["recovered"]) == [
        ("other", "other-a"),
        ("s", "s-a"),
    ]
    for sid in ("s", "other"):
        assert _ids(await get_messages(client, sid)) == [f"{sid}-q", f"{sid}-a"]
    assert await client.call("session.recoverInflightMessages") == {"recovered": []}
    await host.stop()
    again, client = await _start(start_host, data_dir)  # the stray is not replayed either
    assert _ids(await get_messages(client, "s")) == ["s-q", "s-a"]
    revs = await client.call(
        "session.listRevisions", sessionId="s", rootId="s-q", includeMessages=True
    )
    assert [[m["id"] for m in r["messages"]] for r in revs["revisions"]] == [["old-a"]]
    await again.stop()
    assert (sessions / stray).read_bytes() == body
    for log in (host.log, again.log):
        named = [line for line in log.splitlines() if stray in line]
        assert len(named) == 1 and "left alone" in named[0], log
        assert "Traceback" not in log
