"""Symlinks planted in a data dir (a stray tool, a sync client): never followed out of it.

Found at 2f1f72b by a review: through a link the host cut, overwrote or appended to files
outside the data dir (``host.lock``, a transcript, a quarantine file, the checkpoint's
spare), and its start-up sweeps deleted files in folders a linked ``sessions/``,
``revisions/`` or ``revisions/<id>`` pointed to. Each test plants one link, and checks that
what it points to is byte for byte as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    Client,
    HostProcess,
    RpcError,
    StartHost,
    get_messages,
    msg,
    transcript,
)
from tests.e2e.turnkit import two_streaming_turns

OUTSIDE = b"a file of the user's, outside the data dir\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "thesis.doc").write_bytes(OUTSIDE)
    (folder / "other.tmp").write_bytes(OUTSIDE)
    return folder


def _state(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


async def _built(start_host: StartHost) -> None:
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    await host.client.call("session.create", sessionId="s")
    for i in range(3):
        await host.client.call("session.appendMessage", sessionId="s", message=msg(f"m{i}"))
    assert await host.stop() == 0


async def _refused(start_host: StartHost, data: Path) -> tuple[int, str]:
    host = await start_host(data)
    assert host.client is not None
    with pytest.raises(ConnectionError):
        await host.client.handshake()
    return await host.wait(), host.log


async def _serving(start_host: StartHost, data: Path) -> tuple[HostProcess, Client]:
    host = await start_host(data)
    assert host.client is not None
    await host.client.handshake()
    return host, host.client


async def test_a_linked_lock_file_is_refused_and_its_target_left_alone(
    start_host: StartHost, data_dir: Path, outside: Path
) -> None:
    await _built(start_host)
    before = _state(outside)
    (data_dir / "host.lock").unlink()
    (data_dir / "host.lock").symlink_to(outside / "thesis.doc")
    code, log = await _refused(start_host, data_dir)
    assert code == 3 and "not a regular file" in log and "Traceback" not in log, log
    assert _state(outside) == before


@pytest.mark.parametrize("folder", ["sessions", "revisions"])
async def test_a_linked_folder_of_the_data_dir_is_refused(
    start_host: StartHost, data_dir: Path, outside: Path, folder: str
) -> None:
    await _built(start_host)
    for entry in (data_dir / folder).iterdir():
        entry.rename(outside / entry.name)
    (data_dir / folder).rmdir()
    (data_dir / folder).symlink_to(outside)
    (outside / "someone").mkdir()
    (outside / "someone" / "notes.txt").write_bytes(OUTSIDE)
    before, mode = _state(outside), outside.stat().st_mode
    code, log = await _refused(start_host, data_dir)
    assert code == 2 and "is a symlink" in log and "Traceback" not in log, log
    assert (_state(outside), outside.stat().st_mode) == (before, mode)


async def test_a_linked_archive_folder_is_left_alone_at_start(
    start_host: StartHost, data_dir: Path, outside: Path
) -> None:
    await _built(start_host)
    (data_dir / "revisions" / "s").symlink_to(outside)
    (outside / "m0").mkdir()
    (outside / "m0" / "draft.txt").write_bytes(OUTSIDE)
    before = _state(outside)
    host, client = await _serving(start_host, data_dir)
    assert [m["id"] for m in await get_messages(client, "s")] == ["m0", "m1", "m2"]
    assert await host.stop() == 0
    assert _state(outside) == before


async def test_a_linked_transcript_is_never_read_written_or_cut(
    start_host: StartHost, data_dir: Path, outside: Path
) -> None:
    await _built(start_host)
    target = outside / "t.jsonl"
    target.write_bytes(b'{"id":"x1","role":"user","content":"theirs"}\n{"id":"x2","ro')
    transcript(data_dir, "t").symlink_to(target)
    before = _state(outside)
    host, client = await _serving(start_host, data_dir)
    answers: list[Any] = []
    for method, params in (
        ("session.create", {"sessionId": "t"}),
        ("session.get", {"sessionId": "t"}),
        ("session.appendMessage", {"sessionId": "t", "message": msg("m9")}),
        ("session.truncateFrom", {"sessionId": "t", "fromMessageId": "x1"}),
    ):
        answers.append(await client.request(method, params))
    assert await host.stop() == 0
    assert _state(outside) == before, answers
    assert not any("theirs" in str(a.get("result")) for a in answers), answers
    assert all(a.get("error", {}).get("code") != -32603 for a in answers), answers


async def test_a_linked_quarantine_file_is_not_appended_to(
    start_host: StartHost, data_dir: Path, outside: Path
) -> None:
    await _built(start_host)
    _damage_line(data_dir)
    (data_dir / "sessions" / "s.jsonl.quarantine").symlink_to(outside / "thesis.doc")
    before = _state(outside)
    host, client = await _serving(start_host, data_dir)
    assert [m["id"] for m in await get_messages(client, "s")] == ["m0", "m1", "m2"]
    assert await host.stop() == 0
    assert _state(outside) == before
    quarantine = data_dir / "sessions" / "s.jsonl.quarantine"
    assert not quarantine.is_symlink() and b"I2dhcmJhZ2Uj" in quarantine.read_bytes()  # base64


def _damage_line(data: Path) -> None:
    """Put a line that is no message after the first: the start quarantines it."""
    path = transcript(data, "s")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"#garbage#\n" + b"".join(lines[1:]))


def _plant(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


# Found at 0eaa939 by the same review: a FIFO where the start reads a sidecar hung the
# start for good (SIGTERM too); a folder there crashed it with a traceback.
@pytest.mark.parametrize("kind", ["fifo", "folder"])
@pytest.mark.parametrize(
    "entry",
    [
        "sessions/s.intent.json",
        "revisions/s/m0/manifest.json",
        "sessions/s.meta.json",
        "index.sqlite3",  # a folder reads as SQLite's "disk I/O error": damage, not the disk
    ],
)
async def test_a_fifo_or_folder_where_start_reads_a_file_does_not_stop_it(
    start_host: StartHost, data_dir: Path, kind: str, entry: str
) -> None:
    await _built(start_host)
    for path in data_dir.glob("index.sqlite3*"):
        path.unlink()  # so that the start reads the meta file too
    (data_dir / "sessions" / "s.meta.json").unlink()
    _plant(data_dir / entry, kind)
    host, client = await _serving(start_host, data_dir)
    assert [m["id"] for m in await get_messages(client, "s")] == ["m0", "m1", "m2"]
    assert await host.stop() == 0
    assert "Traceback" not in host.log, host.log


@pytest.mark.parametrize("kind", ["fifo", "folder"])
async def test_a_fifo_or_folder_at_the_quarantine_file_is_set_aside(
    start_host: StartHost, data_dir: Path, kind: str
) -> None:
    await _built(start_host)
    _damage_line(data_dir)
    quarantine = data_dir / "sessions" / "s.jsonl.quarantine"
    _plant(quarantine, kind)
    host, client = await _serving(start_host, data_dir)
    assert [m["id"] for m in await get_messages(client, "s")] == ["m0", "m1", "m2"]
    assert await host.stop() == 0
    assert quarantine.is_file() and b"I2dhcmJhZ2Uj" in quarantine.read_bytes()


# Found at 0eaa939 by the same review: a FIFO at a checkpoint blocked the event loop in
# recoverInflightMessages (every call of every session with it); a folder there failed
# that call for every session, so no other session's leftover was ever settled.
@pytest.mark.parametrize("kind", ["fifo", "folder"])
async def test_a_fifo_or_folder_at_a_checkpoint_is_set_aside_and_the_others_settled(
    start_host: StartHost, data_dir: Path, kind: str
) -> None:
    await two_streaming_turns(start_host)
    checkpoint = data_dir / "sessions" / "s.inflight.json"
    checkpoint.unlink()
    _plant(checkpoint, kind)
    host, client = await _serving(start_host, data_dir)
    recovered = (await client.call("session.recoverInflightMessages"))["recovered"]
    assert [r["sessionId"] for r in recovered] == ["other"]
    await client.call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("s-q2"))
    saved = await client.call(
        "session.saveInflightMessage",
        sessionId="s",
        turnId="t2",
        message=msg("s-a2", "assistant", "streams again"),
    )
    assert saved == {"saved": True}
    assert await host.stop() == 0
    assert "Traceback" not in host.log, host.log
    assert [p.name.split(".odd-")[0] for p in checkpoint.parent.glob("*.odd-*")] == [
        "s.inflight.json"
    ]


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder``: a file's bytes, ``None`` for a folder."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in folder.rglob("*")
    }


def _link_at_run_time(data: Path, where: str, outside: Path) -> Path:
    """Make ``data/where`` a link to ``outside`` (moving a real folder there aside)."""
    path = data / where
    if path.exists():
        path.rename(path.with_name(path.name + ".moved"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside)
    return path


ARCHIVE_CALLS: dict[str, dict[str, Any]] = {
    "regenerate": {"method": "session.truncateFrom", "fromMessageId": "a1"},
    "saveRevision": {"method": "session.saveRevision", "rootId": "u1", "messages": [msg("x1")]},
    "saveActiveRevision": {"method": "session.saveActiveRevision"},
}


@pytest.mark.parametrize("call", sorted(ARCHIVE_CALLS))
@pytest.mark.parametrize("where", ["revisions/s/u1", "revisions/s", "revisions"])
async def test_a_link_planted_in_the_archive_at_run_time_is_never_followed(
    start_host: StartHost, data_dir: Path, outside: Path, where: str, call: str
) -> None:
    """Found at 650cc00 (issue 26, case 7): the archive followed links while serving.

    With ``revisions/<sid>/<rootId>`` (or ``revisions/<sid>``) a link to a user's folder,
    an ordinary regenerate, ``saveRevision`` or ``saveActiveRevision`` wrote a manifest
    and a payload there and deleted every other file in it. The start's check of the
    folders does not cover what is planted while the host runs.
    """
    host, client = await _serving(start_host, data_dir)
    await client.call("session.create", sessionId="s")
    for m in (msg("u1", "user"), msg("a1", "assistant")):
        await client.call("session.appendMessage", sessionId="s", message=m)
    link = _link_at_run_time(data_dir, where, outside)
    before = _tree(outside)
    params = {k: v for k, v in ARCHIVE_CALLS[call].items() if k != "method"}
    with pytest.raises(RpcError) as err:
        await client.call(ARCHIVE_CALLS[call]["method"], sessionId="s", **params)
    assert err.value.name == "STORAGE_ERROR" and str(link) in err.value.error["message"]
    assert _tree(outside) == before
    assert [m["id"] for m in await get_messages(client, "s")] == ["u1", "a1"]
    await client.call("session.delete", sessionId="s")  # its archive goes, not the link's
    assert await host.stop() == 0
    assert _tree(outside) == before
    assert "Traceback" not in host.log, host.log


@pytest.mark.parametrize("call", ["create", "checkpoint", "delete"])
async def test_a_sessions_folder_linked_at_run_time_is_never_followed(
    start_host: StartHost, data_dir: Path, outside: Path, call: str
) -> None:
    """The same class of bug in ``sessions/``: the start refuses a linked ``sessions/``,
    but one swapped in while the host runs had new files written through it, and the
    session files of a delete removed through it."""
    host, client = await _serving(start_host, data_dir)
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    (outside / "s.meta.json").write_bytes(OUTSIDE)  # a user's file of a session's name
    link = _link_at_run_time(data_dir, "sessions", outside)
    before = _tree(outside)
    method, params = {
        "create": ("session.create", {"sessionId": "n"}),
        "checkpoint": (
            "session.saveInflightMessage",
            {"sessionId": "s", "turnId": "t1", "message": msg("a1", "assistant")},
        ),
        "delete": ("session.delete", {"sessionId": "s"}),
    }[call]
    with pytest.raises(RpcError) as err:
        await client.call(method, **params)
    assert err.value.name == "STORAGE_ERROR" and str(link) in err.value.error["message"]
    assert _tree(outside) == before
    assert await host.stop() == 0
    assert _tree(outside) == before
    assert "Traceback" not in host.log, host.log
