"""Platform scope: the host runs on Linux and macOS, says so elsewhere, and keeps case apart.

On Windows Python has no ``fcntl``; here that is simulated the way a missing module fails,
with an ``ImportError`` on its import (``sys.modules["fcntl"] = None``), before the host's
own ``python -m host`` entry runs.

macOS's default file system folds case: ``Chat.jsonl`` and ``chat.jsonl`` are one file
there. So ``session.create`` refuses, on every file system, an id that differs only in
case from a session's (``CONFLICT``, ``data.sessionId`` the one that exists): a data dir
then means the same on a Mac as on the Linux box it was copied from. This machine's file
systems are all case-sensitive, so these tests check the rule, and that a refusal
changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    READ_LIMIT,
    REPO,
    Client,
    HostProcess,
    RpcError,
    StartHost,
    dumps,
    everything,
    get_messages,
    make_session,
    msg,
    restart,
    run_cli,
    transcript,
)

NO_FCNTL = "import sys; sys.modules['fcntl'] = None  # as on Windows: import fcntl fails\n"


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_FCNTL + code, *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("command", [["host", "serve"], ["hostview", "inspect"]])
def test_without_fcntl_the_host_says_so_in_one_line_and_exits_4(
    tmp_path: Path, command: list[str]
) -> None:
    data = tmp_path / "data"
    module, name = command
    run = python(
        "import runpy\n"
        f"sys.argv = ['python -m {module}', '{name}', '--data-dir', sys.argv[1]]\n"
        f"runpy.run_module('{module}', run_name='__main__', alter_sys=True)\n",
        str(data),
    )
    assert (run.returncode, run.stdout) == (4, ""), run.stderr
    (line,) = run.stderr.splitlines()
    assert "runs on Linux and macOS only" in line and "fcntl" in line, line
    assert not data.exists()  # refused before anything was made


def test_without_fcntl_the_package_imports_and_its_names_say_why() -> None:
    run = python(
        "import host\n"
        "print(host.__version__)\n"
        "try:\n"
        "    from host import Host\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    assert run.returncode == 0, run.stderr
    version, refusal = run.stdout.splitlines()
    assert version == "0.1.0"
    assert refusal.startswith("UnsupportedPlatform host.Host: ") and "Linux and macOS" in refusal


@pytest.mark.parametrize("other", ["chat", "CHAT", "cHaT"])
async def test_an_id_that_differs_only_in_case_is_refused_and_changes_nothing(
    client: Client, data_dir: Path, other: str
) -> None:
    sent = await make_session(client, "Chat", 3, title="Trip")
    before = await everything(client, data_dir)
    with pytest.raises(RpcError) as err:
        await client.call("session.create", sessionId=other, title="another")
    assert (err.value.code, err.value.name) == (-32006, "CONFLICT")
    assert err.value.data["sessionId"] == "Chat"
    assert await everything(client, data_dir) == before
    with pytest.raises(RpcError) as gone:
        await client.call("session.get", sessionId=other)
    assert (gone.value.name, gone.value.data["kind"]) == ("NOT_FOUND", "session")
    assert await get_messages(client, "Chat") == sent
    res = await client.call("session.create", sessionId="Chat")
    assert res == {"sessionId": "Chat", "created": False}
    await client.call("session.delete", sessionId="Chat")
    res = await client.call("session.create", sessionId=other)
    assert res == {"sessionId": other, "created": True}


async def test_a_create_behind_a_delete_of_its_case_twin_waits_for_it(
    client: Client, data_dir: Path
) -> None:
    """Calls start in arrival order, so the create finds the delete done, files and all.

    On a case-insensitive file system the delete's removals would otherwise hit the new
    session's files, which have the same names there.
    """
    await make_session(client, "Chat", 2)
    create = {"sessionId": "chat", "title": "new"}
    replies = await client.batch(
        [
            client.envelope("session.delete", {"sessionId": "Chat"}, 1),
            client.envelope("session.create", create, 2),
            client.envelope("session.appendMessage", {"sessionId": "chat", "message": msg("u")}, 3),
        ]
    )
    assert [r.get("result") for r in replies] == [
        {"deleted": True},
        {"sessionId": "chat", "created": True},
        {"line": 0, "appended": True},
    ], replies
    assert [m["id"] for m in await get_messages(client, "chat")] == ["u"]
    names = sorted(p.name for p in (data_dir / "sessions").iterdir())
    assert names == ["chat.jsonl", "chat.meta.json", "chat.turns.log"]


async def test_two_creates_of_case_twins_at_once_make_one_session(client: Client) -> None:
    replies = await client.batch(
        [
            client.envelope("session.create", {"sessionId": "Chat"}, 1),
            client.envelope("session.create", {"sessionId": "chat"}, 2),
        ]
    )
    assert replies[0]["result"] == {"sessionId": "Chat", "created": True}
    assert replies[1]["error"]["data"] == {"code": "CONFLICT", "sessionId": "Chat"}
    listed = await client.call("session.list")
    assert [s["sessionId"] for s in listed["sessions"]] == ["Chat"]


async def test_twins_made_before_the_rule_are_both_served_and_a_third_is_refused(
    start_host: StartHost, data_dir: Path
) -> None:
    """A data dir written by an older host on a case-sensitive file system keeps working."""
    (data_dir / "sessions").mkdir(parents=True, mode=0o700)
    for sid in ("Chat", "chat"):
        line = dumps({"id": f"{sid}-1", "role": "user", "content": sid})
        transcript(data_dir, sid).write_bytes(line + b"\n")
    host = await start_host()
    assert host.client is not None
    c = host.client
    await c.handshake()
    for sid in ("Chat", "chat"):
        assert [m["content"] for m in await get_messages(c, sid)] == [sid]
    with pytest.raises(RpcError) as err:
        await c.call("session.create", sessionId="CHAT")
    assert err.value.name == "CONFLICT" and err.value.data["sessionId"] in ("Chat", "chat")


async def test_a_root_whose_folder_is_its_case_twins_is_refused_and_changes_nothing(
    start_host: StartHost, host: HostProcess, client: Client, data_dir: Path
) -> None:
    """Message ids are the caller's, and a regenerate root's archive is a folder named by
    its id: on a case-insensitive file system roots ``q1`` and ``Q1`` share one. What such
    a file system shows under ``Q1`` is planted here (``q1``'s folder, copied): every
    revision call on ``Q1`` is ``CONFLICT`` and leaves ``q1``'s archive alone."""
    await client.call("session.create", sessionId="s")
    for m in (msg("q1"), msg("a1", "assistant"), msg("Q1"), msg("a2", "assistant")):
        await client.call("session.appendMessage", sessionId="s", message=m)
    await client.call("session.saveRevision", sessionId="s", rootId="q1", messages=[msg("old")])
    archive = data_dir / "revisions" / "s"
    shutil.copytree(archive / "q1", archive / "Q1")  # what macOS shows as Q1's folder
    before = await everything(client, data_dir)
    calls = [
        ("session.listRevisions", {"rootId": "Q1"}),
        ("session.saveRevision", {"rootId": "Q1", "messages": [msg("new")]}),
        ("session.saveActiveRevision", {"rootId": "Q1"}),
        ("session.activateRevision", {"rootId": "Q1", "revision": 0}),
        ("session.truncateFrom", {"fromMessageId": "a2"}),  # archives a2's branch of Q1
    ]
    for method, params in calls:
        with pytest.raises(RpcError) as err:
            await client.call(method, sessionId="s", **params)
        assert (err.value.name, err.value.data["messageId"]) == ("CONFLICT", "Q1"), method
        assert await everything(client, data_dir) == before, method
    listed = await client.call("session.listRevisions", sessionId="s", rootId="q1")
    assert [r["messageCount"] for r in listed["revisions"]] == [1]
    again = await restart(start_host, host)  # start-up's sweep takes nothing of either
    assert await everything(again, data_dir) == before


AS_ON_MACOS = (
    "import os, runpy, sys\n"
    "del os.copy_file_range, os.RWF_DSYNC  # Linux's, which macOS's Python lacks\n"
    "sys.argv = ['python -m host', 'serve', '--data-dir', sys.argv[1]]\n"
    "runpy.run_module('host', run_name='__main__', alter_sys=True)\n"
)


async def test_without_linux_only_calls_rewrites_and_checkpoints_keep_every_byte(
    tmp_path: Path, data_dir: Path
) -> None:
    """Rewrites copy unchanged lines with ``copy_file_range`` and checkpoints write with
    ``RWF_DSYNC`` on Linux; macOS has neither, and the host must do the same without."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AS_ON_MACOS,
        str(data_dir),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
        limit=READ_LIMIT,
    )
    host = HostProcess(proc, data_dir, tmp_path / "host.stderr.log", None)
    try:
        c = host.client
        assert c is not None
        await c.handshake()
        await c.call("session.create", sessionId="s")
        sent = [msg(f"m{i}", "user", str(i) * 700_000) for i in range(4)]  # 2.8 MB
        for m in sent:
            await c.call("session.appendMessage", sessionId="s", message=m)
        path = transcript(data_dir, "s")
        lines = path.read_bytes().splitlines(keepends=True)
        await c.call("session.updateMessage", sessionId="s", message=msg("m0", "user", "short"))
        await c.call("session.deleteMessages", sessionId="s", messageIds=["m2"])
        assert path.read_bytes()[-len(lines[1]) - len(lines[3]) :] == lines[1] + lines[3]
        assert await get_messages(c, "s") == [msg("m0", "user", "short"), sent[1], sent[3]]
        await c.call("session.beginTurn", sessionId="s", turnId="t")
        for text in ("a" * 100_000, "b" * 200_000, "c" * 50_000):  # grows, then shrinks
            reply = msg("r", "assistant", text)
            saved = await c.call(
                "session.saveInflightMessage", sessionId="s", turnId="t", message=reply
            )
            assert saved == {"saved": True}
        checkpoint = json.loads((data_dir / "sessions" / "s.inflight.json").read_bytes())
        assert checkpoint["message"] == msg("r", "assistant", "c" * 50_000)
        assert await host.stop() == 0, host.log
    finally:
        await host.cleanup()
    code, out, _ = await run_cli("verify", "--data-dir", str(data_dir))
    assert code == 0, out
