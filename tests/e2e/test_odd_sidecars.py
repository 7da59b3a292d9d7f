"""A link, FIFO or folder planted at a sidecar the host writes (issue 36, cases 1 and 2).

Found at 86ff206 by an outside adversarial pass. While serving, a FIFO at
``sessions/<id>.turns.log`` or ``<id>.inflight.spare`` hung the whole host at the next
``beginTurn``/``endTurn`` or ``saveInflightMessage`` (a blocking ``open`` on the event loop:
no client served, SIGTERM ignored); a folder or a link there failed that session's calls
for good. At start, one such ``turns.log`` stopped every start (``serve`` and
``verify --repair`` exited 1 with a traceback), and so did a folder left where a deleted
session's turn log was.

The host sets such an entry aside (``<name>.odd-<hex>``, reported on stderr and in
``host.stats``), carries on with a fresh file, and serves every other session meanwhile.
What a link points to is never touched. Every wait is bounded: a hung host fails the test
instead of holding it.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    Client,
    HostProcess,
    StartHost,
    get_messages,
    msg,
    run_cli,
    run_view,
)
from tests.e2e.turnkit import reply

KINDS = ["fifo", "folder", "link"]
OUTSIDE = b"a file of the user's, outside the data dir\n"
BOUND = 10.0  # seconds: a host that answers nothing by then is hung


def _plant(path: Path, kind: str, outside: Path) -> None:
    """Put a FIFO, a folder or a link (to a user's file) where ``path`` was."""
    if path.is_file():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "folder":
        path.mkdir(0o700)
    else:
        path.symlink_to(outside)


def _set_aside(path: Path, kind: str) -> None:
    """``path`` is a regular file again, and what was planted there sits beside it, renamed."""
    (aside,) = path.parent.glob(path.name + ".odd-*")
    mode = aside.lstat().st_mode
    want = {"fifo": stat.S_ISFIFO, "folder": stat.S_ISDIR, "link": stat.S_ISLNK}[kind]
    assert want(mode), (aside, oct(mode))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside.txt"
    target.write_bytes(OUTSIDE)
    return target


async def _serving(start_host: StartHost, data: Path | None = None) -> tuple[HostProcess, Client]:
    host = await start_host(data)
    assert host.client is not None
    await host.client.handshake()
    return host, host.client


async def _both(client: Client, call: tuple[str, dict[str, Any]]) -> Any:
    """Send ``call`` and, behind it, an append to another session; both must be answered.

    A host blocked in an ``open`` answers neither: the bound turns that into a failure.
    """
    method, params = call
    async with asyncio.timeout(BOUND):
        result, _ = await asyncio.gather(
            client.call(method, **params),
            client.call("session.appendMessage", sessionId="other", message=msg("o-late")),
        )
    return result


async def _stopped(host: HostProcess) -> str:
    async with asyncio.timeout(BOUND):
        assert await host.stop() == 0, host.log
    assert "Traceback" not in host.log, host.log
    return host.log


async def _turns(data: Path, sid: str) -> list[tuple[str, str]]:
    code, out, err = await run_view("inspect", "--data-dir", str(data), sid, "--json")
    assert code == 0, err
    return [(t["turnId"], t["status"]) for t in json.loads(out)["turns"]]


def _log_lines(data: Path, sid: str) -> list[tuple[str, str]]:
    raw = (data / "sessions" / f"{sid}.turns.log").read_bytes()
    return [(r["turnId"], r["status"]) for r in map(json.loads, raw.splitlines())]


# -- while serving (case 1) ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_an_odd_turn_log_while_serving_is_set_aside_and_the_turns_go_on(
    start_host: StartHost, data_dir: Path, outside: Path, kind: str
) -> None:
    host, client = await _serving(start_host)
    for sid in ("s", "other"):
        await client.call("session.create", sessionId=sid)
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    log = data_dir / "sessions" / "s.turns.log"
    _plant(log, kind, outside)
    end = ("session.endTurn", {"sessionId": "s", "turnId": "t1", "status": "completed"})
    assert await _both(client, end) is not None
    await client.call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("u2"))
    await client.call("session.endTurn", sessionId="s", turnId="t2", status="completed")
    stats = await client.call("host.stats")
    assert stats["counters"]["sidecars.setAside"] == 1
    text = await _stopped(host)
    assert "s.turns.log" in text and "set aside" in text, text
    _set_aside(log, kind)
    assert _log_lines(data_dir, "s") == [
        ("t1", "completed"),
        ("t2", "running"),
        ("t2", "completed"),
    ]
    assert outside.read_bytes() == OUTSIDE
    assert await _turns(data_dir, "s") == [("t1", "completed"), ("t2", "completed")]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_odd_turn_log_planted_before_its_session_is_created_is_set_aside(
    start_host: StartHost, data_dir: Path, outside: Path, kind: str
) -> None:
    host, client = await _serving(start_host)
    await client.call("session.create", sessionId="other")
    log = data_dir / "sessions" / "s.turns.log"
    _plant(log, kind, outside)
    assert await _both(client, ("session.create", {"sessionId": "s"})) is not None
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    assert "set aside" in await _stopped(host)
    _set_aside(log, kind)
    assert _log_lines(data_dir, "s") == [("t1", "running")]
    assert outside.read_bytes() == OUTSIDE


@pytest.mark.parametrize("kind", KINDS)
async def test_an_odd_checkpoint_spare_while_serving_is_set_aside_and_the_save_goes_on(
    start_host: StartHost, data_dir: Path, outside: Path, kind: str
) -> None:
    host, client = await _serving(start_host)
    for sid in ("s", "other"):
        await client.call("session.create", sessionId=sid)
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    for text in ("a", "ab"):  # the second save keeps the first's file as the spare
        params = {"sessionId": "s", "turnId": "t1", "message": reply("a1", text)}
        assert await client.call("session.saveInflightMessage", **params) == {"saved": True}
    spare = data_dir / "sessions" / "s.inflight.spare"
    _plant(spare, kind, outside)
    save = {"sessionId": "s", "turnId": "t1", "message": reply("a1", "abc")}
    assert await _both(client, ("session.saveInflightMessage", save)) == {"saved": True}
    assert await client.call("session.saveInflightMessage", **save) == {"saved": True}
    checkpoint = json.loads((data_dir / "sessions" / "s.inflight.json").read_bytes())
    assert checkpoint["message"]["content"] == "abc"
    await client.call("session.appendMessage", sessionId="s", message=reply("a1", "abcd"))
    await client.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    text = await _stopped(host)
    assert "s.inflight.spare" in text and "set aside" in text, text
    _set_aside(spare, kind)
    assert outside.read_bytes() == OUTSIDE


# -- at start (case 2) ---------------------------------------------------------------------


async def _build(start_host: StartHost) -> None:
    """Sessions ``s`` (a completed turn and a running one) and ``other``."""
    host, client = await _serving(start_host)
    for sid in ("s", "other"):
        await client.call("session.create", sessionId=sid)
        await client.call("session.beginTurn", sessionId=sid, turnId="t1", prompt=msg(f"{sid}1"))
        await client.call("session.endTurn", sessionId=sid, turnId="t1", status="completed")
    await client.call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("s2"))
    assert await host.stop() == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_an_odd_turn_log_at_start_is_set_aside_and_every_session_served(
    start_host: StartHost, data_dir: Path, outside: Path, kind: str
) -> None:
    await _build(start_host)
    log = data_dir / "sessions" / "s.turns.log"
    _plant(log, kind, outside)
    host, client = await _serving(start_host)
    assert [m["id"] for m in await get_messages(client, "s")] == ["s1", "s2"]
    assert [m["id"] for m in await get_messages(client, "other")] == ["other1"]
    # The start aborts the running t2 (as ever) into a fresh log; turns go on.
    await client.call("session.beginTurn", sessionId="s", turnId="t3", prompt=msg("s3"))
    await client.call("session.endTurn", sessionId="s", turnId="t3", status="completed")
    await client.call("session.beginTurn", sessionId="other", turnId="t2")
    text = await _stopped(host)
    assert "s.turns.log" in text and "set aside" in text, text
    _set_aside(log, kind)
    assert _log_lines(data_dir, "s") == [("t2", "aborted"), ("t3", "running"), ("t3", "completed")]
    # The turn table the index held is kept: t1 is in no log the host reads any more.
    assert await _turns(data_dir, "s") == [
        ("t1", "completed"),
        ("t2", "aborted"),
        ("t3", "completed"),
    ]
    assert outside.read_bytes() == OUTSIDE
    host, client = await _serving(start_host)  # and the next start finds nothing to do
    assert [m["id"] for m in await get_messages(client, "s")] == ["s1", "s2", "s3"]
    assert "set aside" not in await _stopped(host)


@pytest.mark.parametrize("kind", KINDS)
async def test_an_odd_turn_log_does_not_stop_a_repair(
    start_host: StartHost, data_dir: Path, outside: Path, kind: str
) -> None:
    await _build(start_host)
    log = data_dir / "sessions" / "s.turns.log"
    _plant(log, kind, outside)
    code, out, err = await run_cli("verify", "--data-dir", str(data_dir), "--repair")
    assert code == 0 and "Traceback" not in err, (out, err)
    assert "s.turns.log" in err and "set aside" in err, err
    _set_aside(log, kind)
    assert outside.read_bytes() == OUTSIDE
    assert await _turns(data_dir, "other") == [("t1", "completed")]


async def test_a_folder_left_at_a_deleted_sessions_turn_log_does_not_stop_the_start(
    start_host: StartHost, data_dir: Path
) -> None:
    """The start removes what a cut-short delete left; a folder there was an ``EISDIR``."""
    await _build(start_host)
    (data_dir / "sessions" / "gone.turns.log").mkdir(0o700)
    (data_dir / "sessions" / "gone.turns.log" / "notes.txt").write_bytes(OUTSIDE)
    host, client = await _serving(start_host)
    assert [m["id"] for m in await get_messages(client, "other")] == ["other1"]
    await client.call("session.create", sessionId="gone")
    await client.call("session.beginTurn", sessionId="gone", turnId="t1")
    text = await _stopped(host)
    assert "gone.turns.log" in text and "set aside" in text, text
    (aside,) = (data_dir / "sessions").glob("gone.turns.log.odd-*")
    assert (aside / "notes.txt").read_bytes() == OUTSIDE
    assert _log_lines(data_dir, "gone") == [("t1", "running")]


@pytest.mark.parametrize("kind", ["fifo", "link"])
async def test_an_odd_revision_payload_is_an_error_never_a_hang_or_a_read_outside(
    start_host: StartHost, data_dir: Path, tmp_path: Path, kind: str
) -> None:
    """A payload file the manifest names is read with a plain ``open``: a FIFO there held
    ``listRevisions`` (and the host's stop after it) for good; a link was read through.
    It is the archive's data, so it is not set aside: the call answers ``STORAGE_ERROR``."""
    secret = tmp_path / "secret.jsonl"
    secret.write_bytes(b'{"id":"x1","role":"assistant","content":"the user\'s own"}\n')
    host, client = await _serving(start_host)
    for sid in ("s", "other"):
        await client.call("session.create", sessionId=sid)
    await client.call("session.appendMessage", sessionId="s", message=msg("u1"))
    await client.call("session.saveRevision", sessionId="s", rootId="u1", messages=[reply("x1")])
    (payload,) = (data_dir / "revisions" / "s" / "u1").glob("*.jsonl")
    _plant(payload, kind, secret)
    listing = {"sessionId": "s", "rootId": "u1", "includeMessages": True}
    async with asyncio.timeout(BOUND):
        answer, _ = await asyncio.gather(
            client.request("session.listRevisions", listing),
            client.call("session.appendMessage", sessionId="other", message=msg("o1")),
        )
    assert answer["error"]["data"]["code"] == "STORAGE_ERROR", answer
    assert "the user's own" not in json.dumps(answer)
    await _stopped(host)
