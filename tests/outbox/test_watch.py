"""``HostClient.watch`` against the real host over its socket (issue 34): a snapshot, then
every change; a new snapshot after a rewrite; a resume after the host is killed and started
again; a client that reads too slowly; ``python -m host watch``; ``serve --also-socket``."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import outbox._client
from outbox import HostClient
from outbox._watch import Watch
from tests.conftest import REPO, WAIT, StartHost, msg


async def connect(path: Path) -> HostClient:
    client = await HostClient.connect(str(path))
    await client.handshake()
    return client


async def take(watch: Watch, n: int) -> list[dict[str, Any]]:
    out = []
    async with asyncio.timeout(WAIT):
        for _ in range(n):
            out.append(await anext(watch))
    return out


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["message"]["id"] for e in events if e["kind"] == "appended"]


async def test_a_watch_follows_rewrites_and_a_host_killed_and_started_again(
    start_host: StartHost, tmp_path: Path
) -> None:
    sock = tmp_path / "run" / "host.sock"
    host = await start_host(socket=sock)
    writer = await connect(sock)
    await writer.call("session.create", {"sessionId": "s"})
    for i in range(3):
        await writer.call("session.appendMessage", {"sessionId": "s", "message": msg(f"a{i}")})
    watcher = await connect(sock)
    watch = watcher.watch("s")
    (snapshot,) = await take(watch, 1)
    assert snapshot["kind"] == "snapshot"
    assert [m["id"] for m in snapshot["messages"]] == ["a0", "a1", "a2"]

    await writer.call("session.appendMessage", {"sessionId": "s", "message": msg("a3")})
    assert ids(await take(watch, 1)) == ["a3"]

    # a rewrite: the watch reads the lines again and says so with a new snapshot
    await writer.call("session.deleteMessages", {"sessionId": "s", "messageIds": ["a1"]})
    (again,) = await take(watch, 1)
    assert again["kind"] == "snapshot" and watch.resets == 1
    assert [m["id"] for m in again["messages"]] == ["a0", "a2", "a3"]

    # the host dies; changes land while nobody watches; the watch resumes by itself
    await host.kill()
    await writer.close()
    host = await start_host(socket=sock)
    writer = await connect(sock)
    for i in range(4, 7):
        await writer.call("session.appendMessage", {"sessionId": "s", "message": msg(f"a{i}")})
    assert ids(await take(watch, 3)) == ["a4", "a5", "a6"]
    assert watch.reconnects == 1 and watch.resets == 1

    # a cursor handed out is a place to come back to: nothing again, nothing missed
    cursor = watch.cursor
    await watch.aclose()
    await writer.call("session.appendMessage", {"sessionId": "s", "message": msg("a7")})
    later = writer.watch("s", after=cursor)
    assert ids(await take(later, 1)) == ["a7"]
    await later.aclose()
    await writer.call("session.delete", {"sessionId": "s"})
    await writer.close()
    await watcher.close()


async def test_a_slow_reader_of_the_watch_gets_each_line_once(
    start_host: StartHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its inbox's bound the client drops what it holds and resumes from the last
    event taken: the host replays the rest from its files."""
    monkeypatch.setattr(outbox._client, "INBOX_BYTES", 8_000)
    sock = tmp_path / "host.sock"
    await start_host(socket=sock)
    writer = await connect(sock)
    await writer.call("session.create", {"sessionId": "s"})
    watcher = await connect(sock)
    watch = watcher.watch("s")
    await take(watch, 1)  # the (empty) snapshot
    for i in range(60):  # ~30 KB of events the watch does not take meanwhile
        body = msg(f"a{i}", content="z" * 400)
        await writer.call("session.appendMessage", {"sessionId": "s", "message": body})
    assert ids(await take(watch, 60)) == [f"a{i}" for i in range(60)]
    assert watch.overflows >= 1 and watch.resets == 0
    await watch.aclose()
    await writer.close()
    await watcher.close()


async def test_python_m_host_watch_follows_a_session_like_tail_f(
    start_host: StartHost, tmp_path: Path
) -> None:
    sock = tmp_path / "host.sock"
    await start_host(socket=sock)
    writer = await connect(sock)
    await writer.call("session.create", {"sessionId": "s"})
    await writer.call("session.appendMessage", {"sessionId": "s", "message": msg("a0")})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "host",
        "watch",
        "--socket",
        str(sock),
        "s",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(WAIT):
            first = json.loads(await proc.stdout.readline())
            assert first["kind"] == "snapshot" and first["messages"][0]["id"] == "a0"
            await writer.call("session.appendMessage", {"sessionId": "s", "message": msg("a1")})
            event = json.loads(await proc.stdout.readline())
            assert (event["kind"], event["message"]["id"]) == ("appended", "a1")
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    await writer.close()


async def test_serve_also_socket_serves_watchers_beside_stdio(
    start_host: StartHost, tmp_path: Path
) -> None:
    """What ``make run`` does: the app talks to its host over stdio, watchers come on the
    socket; the end of stdin ends both."""
    sock = tmp_path / "host.sock"
    host = await start_host(args=("--also-socket", str(sock)))
    app = host.client
    assert app is not None
    await app.handshake()
    await app.call("session.create", sessionId="s")
    await host.wait_for_log("serving on")
    watcher = await connect(sock)
    watch = watcher.watch("s")
    await take(watch, 1)
    await app.call("session.appendMessage", sessionId="s", message=msg("a0"))
    assert ids(await take(watch, 1)) == ["a0"]
    assert await host.stop() == 0
    assert not sock.exists()
    await watcher.close()


async def test_a_watch_waits_through_a_host_that_dies_again_while_starting(
    start_host: StartHost, tmp_path: Path
) -> None:
    """The host is killed; what next takes its socket dies before answering the handshake
    (a start that crashes, a host killed again while it recovers); then one comes that
    stays. The watch (and ``python -m host watch``, which runs it) waits for it and
    resumes: it gave up with "the host went away before answering"."""
    sock = tmp_path / "run" / "host.sock"
    host = await start_host(socket=sock)
    writer = await connect(sock)
    await writer.call("session.create", {"sessionId": "s"})
    watcher = await connect(sock)
    watch = watcher.watch("s")
    assert (await take(watch, 1))[0]["kind"] == "snapshot"
    await host.kill()
    await writer.close()
    following = asyncio.create_task(take(watch, 1))  # the reader, reconnecting
    dropped = asyncio.Event()

    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()  # the handshake, never answered
        writer.close()
        dropped.set()

    sock.unlink()
    server = await asyncio.start_unix_server(dies, path=str(sock))
    async with asyncio.timeout(WAIT):
        await dropped.wait()
    server.close()
    await server.wait_closed()
    sock.unlink(missing_ok=True)
    host = await start_host(socket=sock)
    writer = await connect(sock)
    await writer.call("session.appendMessage", {"sessionId": "s", "message": msg("after")})
    assert ids(await following) == ["after"]
    await watch.aclose()
    await writer.close()
    await watcher.close()
