"""Operator tools: ``python -m hostview inspect|export`` on a data dir (live or not), JSON logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    BRIEF_WAIT,
    REPO,
    Client,
    HostProcess,
    StartHost,
    disk_state,
    index_locked,
    msg,
    run_cli,
    run_view,
    transcript,
)


async def _conversation(c: Client) -> None:
    await c.call("session.create", sessionId="trip", title="Trip plan")
    await c.call("session.create", sessionId="empty")
    await c.call(
        "session.beginTurn", sessionId="trip", turnId="t1", prompt=msg("u1", "user", "Plan Lyon")
    )
    await c.call(
        "session.appendMessage",
        sessionId="trip",
        turnId="t1",
        message=msg(
            "a1", "assistant", [{"type": "text", "text": "Start at Fourvière.\nThen eat."}]
        ),
    )
    await c.call("session.endTurn", sessionId="trip", turnId="t1", status="completed")
    await c.call("session.truncateFrom", sessionId="trip", fromMessageId="a1")  # regenerate
    await c.call("session.beginTurn", sessionId="trip", turnId="t2")
    await c.call(
        "session.saveInflightMessage",
        sessionId="trip",
        turnId="t2",
        message=msg("a2", "assistant", "Begin at the old town"),
    )


async def test_inspect_lists_sessions_and_shows_one_beside_a_live_host(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    await _conversation(client)
    before = disk_state(data_dir)
    code, out, _ = await run_view("inspect", "--data-dir", str(data_dir))
    assert code == 0
    trip = next(line for line in out.splitlines() if line.startswith("trip"))
    assert "Trip plan" in trip and "t2" in trip and "yes" in trip  # running turn, checkpoint
    assert "2 session(s)" in out

    code, out, _ = await run_view("inspect", "--data-dir", str(data_dir), "trip", "--json")
    assert code == 0
    detail = json.loads(out)
    assert [(t["turnId"], t["status"]) for t in detail["turns"]] == [
        ("t1", "completed"),
        ("t2", "running"),
    ]
    assert [(m["id"], m["role"], m["turnId"]) for m in detail["messages"]] == [("u1", "user", "t1")]
    assert detail["roots"] == [{"rootId": "u1", "revisions": 1}]  # the cut reply is archived
    assert detail["checkpoint"]["messageId"] == "a2"

    code, out, _ = await run_view("inspect", "--data-dir", str(data_dir), "trip")
    assert code == 0
    assert "checkpoint: message a2 of turn t2" in out and "u1: 1 archived revision(s)" in out
    assert disk_state(data_dir) == before  # a look changes nothing, even with a host live
    assert await client.call("session.list")  # and the host is undisturbed


def _every_path(data: Path) -> dict[str, tuple[int, int, int, bytes | None]]:
    """Every file and folder under ``data``: its mode, size, mtime and (a file's) bytes."""
    out = {}
    for path in [data, *sorted(data.rglob("*"))]:
        st = path.lstat()
        body = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(path.relative_to(data))] = (st.st_mode, st.st_size, st.st_mtime_ns, body)
    return out


@contextlib.contextmanager
def _read_only(data: Path) -> Iterator[None]:
    """Make every file of ``data`` 0400 and every folder 0500, as a backup is kept."""
    paths = [data, *data.rglob("*")]
    modes = {p: p.lstat().st_mode for p in paths}
    for p in reversed(paths):  # a folder after what it holds
        p.chmod(0o500 if p.is_dir() else 0o400)
    try:
        yield
    finally:
        for p in paths:
            p.chmod(stat.S_IMODE(modes[p]))


async def test_the_read_tools_change_nothing_in_a_stopped_hosts_data_dir(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    """Found at 86ff206 (issue 33): ``inspect`` left ``index.sqlite3-wal`` and ``-shm``.

    A host that stops removes them; SQLite's ``mode=ro`` makes them again for a WAL
    database when they are not there. The tools run on a data dir of read-only files and
    folders; root may write to those all the same, so every path's bytes, mode and mtime
    (a folder's: nothing made and removed in it) must be as they were.
    """
    await _conversation(client)
    assert await host.stop() == 0
    with _read_only(data_dir):
        before = _every_path(data_dir)
        for args in (
            ["inspect"],
            ["inspect", "trip"],
            ["inspect", "trip", "--json"],
            ["export", "trip", "--with-revisions"],
            ["export", "trip", "--format", "markdown", "--with-revisions"],
        ):
            code, out, err = await run_view(args[0], "--data-dir", str(data_dir), *args[1:])
            assert code == 0 and out and "Traceback" not in err, (args, err)
        assert _every_path(data_dir) == before


async def test_the_old_command_lines_say_where_the_tools_went(data_dir: Path) -> None:
    for command in ("inspect", "export"):
        code, out, err = await run_cli(command, "--data-dir", str(data_dir), "s")
        assert (code, out) == (2, ""), err
        assert f"moved to `python -m hostview {command}`" in err, err
    assert not data_dir.exists()


def test_the_server_imports_no_read_tool() -> None:
    """``host`` is the server: the tools build on it, never the other way round."""
    modules = ["host", "host.__main__", "host._server", "host._service", "host._verify"]
    code = f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; " + (
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'hostview'))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert run.stdout == "[]\n"


async def test_inspect_pages_messages(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="long")
    for i in range(30):
        await client.call(
            "session.appendMessage", sessionId="long", message=msg(f"m{i}", "user", f"line {i}")
        )
    code, out, _ = await run_view(
        "inspect", "--data-dir", str(data_dir), "long", "--limit", "5", "--before", "10", "--json"
    )
    assert code == 0
    assert [m["id"] for m in json.loads(out)["messages"]] == [f"m{i}" for i in range(5, 10)]


async def test_export_jsonl_and_markdown_with_revisions(client: Client, data_dir: Path) -> None:
    await _conversation(client)
    code, out, _ = await run_view("export", "--data-dir", str(data_dir), "trip", "--with-revisions")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[0]["id"] == "u1"
    assert rows[1] == {"revisionOf": "u1", "revision": 0, "message": rows[1]["message"]}
    assert rows[1]["message"]["id"] == "a1" and rows[1]["message"]["turnId"] == "t1"
    code, out, _ = await run_view(
        "export", "--data-dir", str(data_dir), "trip", "--format", "markdown", "--with-revisions"
    )
    assert code == 0
    assert "# Session trip" in out and "Plan Lyon" in out
    assert "**revision 0** of the reply to `u1`" in out and "> Start at Fourvière." in out


async def test_export_is_the_transcript_verbatim_where_the_index_lags_it(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    """Found at 217ae0e: export read the lines the index knew, and re-encoded each one.

    The index may lag the transcript by a batch (a crash before its commit), so a reply
    the user was shown as saved was missing from the export; ``1E2`` came out as
    ``100.0`` and ``1e400`` as ``Infinity``, which is not JSON.
    """
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("m1", "user", "hi"))
    assert await host.stop() == 0
    late = b'{"id":"m2","role":"assistant","content":"after the last batch","n":1E2,"x":1e400}'
    path = transcript(data_dir, "s")
    with path.open("ab") as f:  # what a crash between the fsync and the batch commit leaves
        f.write(late + b"\n" + b"not a message\n" + b'{"id":"m3","ro')  # and a torn tail
    code, out, err = await run_view("export", "--data-dir", str(data_dir), "s")
    assert code == 0, err
    assert out.encode().splitlines() == path.read_bytes().splitlines()[:2]
    assert out.encode().splitlines()[1] == late
    assert "2 line(s) of s are no message" in err
    code, out, err = await run_view(
        "export", "--data-dir", str(data_dir), "s", "--format", "markdown"
    )
    assert code == 0 and "_2 message(s)" in out and "after the last batch" in out, err


async def test_unknown_session_and_bad_id_are_clear_errors(client: Client, data_dir: Path) -> None:
    code, _out, err = await run_view("inspect", "--data-dir", str(data_dir), "nope")
    assert code != 0 and "no session 'nope'" in err
    code, _out, err = await run_view("export", "--data-dir", str(data_dir), "nope")
    assert code != 0 and "no session 'nope'" in err and "Traceback" not in err
    code, _out, err = await run_view("export", "--data-dir", str(data_dir), "../etc")
    assert code != 0 and "sessionId" in err and "Traceback" not in err


# Found at f4fe54d, by a review of the read tools: each of the next tests failed there.


async def test_read_tools_take_a_data_dir_path_with_hash_and_question_mark(
    host: HostProcess, client: Client, data_dir: Path, tmp_path: Path
) -> None:
    """The index path went into an SQLite URI unquoted: ``a#b`` opened (created) ``a``."""
    await _conversation(client)
    assert await host.stop() == 0
    odd = tmp_path / "a#b?c"
    shutil.copytree(data_dir, odd)
    code, out, err = await run_view("inspect", "--data-dir", str(odd))
    assert code == 0 and "Trip plan" in out, err
    code, out, err = await run_view("export", "--data-dir", str(odd), "trip")
    assert code == 0 and json.loads(out.splitlines()[0])["id"] == "u1", err
    assert not (tmp_path / "a").exists()


async def test_read_tools_write_nothing_beside_a_damaged_archive(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    """inspect moved a damaged manifest aside; a stray file in revisions/ crashed it."""
    await _conversation(client)
    assert await host.stop() == 0
    await client.close()
    folder = data_dir / "revisions" / "trip"
    (folder / "u1" / "manifest.json").write_bytes(b"garbage{")
    (folder / ".DS_Store").write_bytes(b"\0")
    (folder / "bad name").mkdir()
    before = disk_state(data_dir)
    for args in (["inspect"], ["inspect", "trip"], ["export", "trip", "--with-revisions"]):
        code, out, err = await run_view(args[0], "--data-dir", str(data_dir), *args[1:])
        assert code == 0 and "Traceback" not in err, err
        assert "manifest.json is damaged" in err and "bad name is not a pager root" in err, err
    assert json.loads(out.splitlines()[0])["id"] == "u1"  # the transcript, all the same
    assert disk_state(data_dir) == before


async def test_export_needs_no_index_and_skips_a_revision_it_cannot_read(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    """Without the index export raised a traceback; a lost payload stopped all output."""
    await _conversation(client)
    assert await host.stop() == 0
    for path in data_dir.glob("index.sqlite3*"):
        path.unlink()
    for payload in (data_dir / "revisions" / "trip" / "u1").glob("000000-*.jsonl"):
        payload.unlink()
    code, out, err = await run_view(
        "export", "--data-dir", str(data_dir), "trip", "--with-revisions"
    )
    assert code == 0 and "Traceback" not in err, err
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["u1"]
    assert "revision 0 of root 'u1' of trip left out" in err
    code, _out, err = await run_view("inspect", "--data-dir", str(data_dir))
    assert code == 1 and "no index at" in err and "Traceback" not in err, err
    assert not (data_dir / "index.sqlite3").exists()  # read-only: not created


@pytest.mark.parametrize("how", ["garbage", "locked"])
async def test_inspect_says_what_is_wrong_with_the_index(
    host: HostProcess, client: Client, data_dir: Path, how: str
) -> None:
    await _conversation(client)
    assert await host.stop() == 0
    index = data_dir / "index.sqlite3"
    with contextlib.ExitStack() as stack:
        if how == "garbage":
            index.write_bytes(b"not a database" * 100)
            want = "damaged"
        else:
            stack.enter_context(index_locked(index))
            want = "locked by another program"
        code, _out, err = await run_view("inspect", "--data-dir", str(data_dir), *BRIEF_WAIT)
        assert code == 1 and want in err and "Traceback" not in err, err
        code, out, err = await run_view("export", "--data-dir", str(data_dir), "trip")
        assert code == 0 and json.loads(out.splitlines()[0])["id"] == "u1", err


async def test_export_into_a_closed_pipe_exits_quietly(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    for i in range(700):  # both outputs past a pipe's 64 KB buffer
        await client.call(
            "session.appendMessage", sessionId="s", message=msg(f"m{i}", "user", "x" * 1000)
        )
    for command in ("export", "inspect --limit 700 --json"):
        proc = await asyncio.create_subprocess_shell(
            f"{shlex.quote(sys.executable)} -m hostview {command} --data-dir"
            f" {shlex.quote(str(data_dir))} s | head -c 10",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=REPO,
        )
        out, err = await proc.communicate()
        assert len(out) == 10 and b"Traceback" not in err and b"BrokenPipe" not in err, err


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
async def test_read_tools_refuse_a_transcript_that_is_no_regular_file(
    client: Client, data_dir: Path, tmp_path: Path, kind: str
) -> None:
    """A symlink was followed out of the data dir; a FIFO hung export; a folder crashed it."""
    path = data_dir / "sessions" / "odd.jsonl"
    if kind == "symlink":
        outside = tmp_path / "outside.jsonl"
        outside.write_bytes(_line("secret"))
        path.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    code, out, err = await run_view("export", "--data-dir", str(data_dir), "odd")
    assert code == 1 and "not a regular file" in err and "Traceback" not in err, err
    assert "secret" not in out


def _line(text: str) -> bytes:
    return json.dumps(msg("x", "user", text)).encode() + b"\n"


@pytest.mark.parametrize("body", [b"[1]", b'{"message": "hi"}', b"\xff garbage"])
async def test_inspect_shows_an_unreadable_checkpoint_as_such(
    client: Client, data_dir: Path, body: bytes
) -> None:
    await _conversation(client)
    (data_dir / "sessions" / "trip.inflight.json").write_bytes(body)
    code, out, err = await run_view("inspect", "--data-dir", str(data_dir), "trip")
    assert code == 0 and "checkpoint: unreadable checkpoint file" in out, err
    assert "Traceback" not in err


async def test_inspect_refuses_a_negative_page(client: Client, data_dir: Path) -> None:
    await _conversation(client)
    for option in ("--limit", "--before"):
        args = ("inspect", "--data-dir", str(data_dir), "trip", option, "-3")
        code, out, err = await run_view(*args)
        assert code == 2 and "0 or more" in err and out == "", err


async def test_json_logs_name_session_and_message(start_host: StartHost, data_dir: Path) -> None:
    host = await start_host(args=["--log-format", "json"])
    c = host.client
    assert c is not None
    await c.handshake()
    await c.call("session.create", sessionId="s")
    await c.call("session.beginTurn", sessionId="s", turnId="t1")
    await c.call(
        "session.saveInflightMessage",
        sessionId="s",
        turnId="t1",
        message=msg("a1", "assistant", ""),
    )
    await c.call(
        "session.endTurn", sessionId="s", turnId="t1", status="aborted", recoverInflight=True
    )
    await host.stop()
    records = [json.loads(line) for line in host.log.splitlines() if line.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    dropped = [r for r in records if "dropped" in r["message"]]
    assert dropped and "session s" in dropped[0]["message"] and "a1" in dropped[0]["message"]
