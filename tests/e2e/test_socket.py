"""The host as a local service on a Unix socket: many clients, each with its own handshake."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Client, RpcError, StartHost, dumps, get_messages, msg


async def test_two_clients_at_once_each_handshake_for_itself(
    start_host: StartHost, tmp_path: Path
) -> None:
    host = await start_host(socket=tmp_path / "run" / "host.sock")
    a = await host.connect()
    b = await host.connect()
    await a.handshake()
    # b has not handshaken: a's handshake does not count for it.
    with pytest.raises(RpcError) as err:
        await b.call("session.list")
    assert err.value.name == "NOT_HANDSHAKEN"
    await b.handshake()
    await a.call("session.create", sessionId="s")

    async def writer(name: str, c: Client) -> list[int]:
        futs = []
        lines = []
        for i in range(25):
            rid = c.next_id()
            futs.append(c.expect(rid))
            params = {"sessionId": "s", "message": msg(f"{name}{i}")}
            lines.append(dumps(c.envelope("session.appendMessage", params, rid)) + b"\n")
        await c.send_raw(b"".join(lines))
        return [(await c.wait(f))["result"]["line"] for f in futs]

    lines_a, lines_b = await asyncio.gather(writer("a", a), writer("b", b))
    assert sorted(lines_a + lines_b) == list(range(50))
    ids = [m["id"] for m in await get_messages(b, "s")]
    assert sorted(ids) == sorted([f"a{i}" for i in range(25)] + [f"b{i}" for i in range(25)])
    # Each client's own appends kept their order.
    assert [i for i in ids if i.startswith("a")] == [f"a{i}" for i in range(25)]
    assert [i for i in ids if i.startswith("b")] == [f"b{i}" for i in range(25)]


async def test_a_client_leaving_does_not_stop_the_service(
    start_host: StartHost, tmp_path: Path
) -> None:
    host = await start_host(socket=tmp_path / "host.sock")
    a = await host.connect()
    await a.handshake()
    await a.call("session.create", sessionId="s")
    await a.call("session.appendMessage", sessionId="s", message=msg("m0"))
    await a.close_input()
    await a.wait_eof()
    b = await host.connect()
    await b.handshake()
    assert [m["id"] for m in await get_messages(b, "s")] == ["m0"]
    assert host.proc.returncode is None


async def test_the_socket_is_private_and_removed_at_stop(
    start_host: StartHost, tmp_path: Path
) -> None:
    sock = tmp_path / "run" / "host.sock"
    host = await start_host(socket=sock, umask=0o000)
    st = os.stat(sock)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o700
    assert await host.stop() == 0  # SIGTERM
    assert not sock.exists()


async def test_shutdown_over_the_socket_stops_the_service(
    start_host: StartHost, tmp_path: Path
) -> None:
    host = await start_host(socket=tmp_path / "host.sock")
    a = await host.connect()
    other = await host.connect()
    await a.handshake()
    await other.handshake()
    assert (await a.call("host.shutdown")) == {"shuttingDown": True}
    assert await host.wait() == 0
    await other.wait_eof()  # every connection was closed


async def test_a_stale_socket_file_is_replaced(start_host: StartHost, tmp_path: Path) -> None:
    sock = tmp_path / "host.sock"
    first = await start_host(socket=sock)
    await first.kill()  # kill -9 leaves the socket file behind
    assert sock.exists()
    second = await start_host(socket=sock)
    c = await second.connect()
    await c.handshake()
    assert (await c.call("session.list")) == {"sessions": []}


async def test_a_client_that_vanishes_mid_pipeline_loses_none_of_its_writes(
    start_host: StartHost, tmp_path: Path
) -> None:
    host = await start_host(socket=tmp_path / "host.sock")
    a = await host.connect()
    await a.handshake()
    await a.call("session.create", sessionId="s")
    lines = [
        dumps(a.envelope("session.appendMessage", {"sessionId": "s", "message": msg(f"m{i}")}, i))
        + b"\n"
        for i in range(50)
    ]
    await a.send_raw(b"".join(lines))
    await a.close()  # gone without reading a single reply
    b = await host.connect()
    await b.handshake()
    # Another connection's lines are read whenever the host gets to them, so b asks until
    # all 50 are there (bounded polling of the outcome, no sleep).
    for _ in range(2000):
        got = await get_messages(b, "s")
        if len(got) == 50:
            break
    assert [m["id"] for m in got] == [f"m{i}" for i in range(50)]
    assert host.proc.returncode is None


async def test_a_socket_path_that_is_a_regular_file_is_left_alone(
    start_host: StartHost, tmp_path: Path
) -> None:
    """A mistyped --socket naming a user's file must not delete that file."""
    precious = tmp_path / "notes.txt"
    precious.write_bytes(b"my notes")
    host = await start_host(socket=precious, ready=False)
    served = await host.log_or_exit("serving on")
    assert precious.is_file(), "the file at the socket path was replaced"
    assert precious.read_bytes() == b"my notes"
    assert served is None
    assert await host.wait() != 0


async def test_a_socket_path_too_long_is_a_usage_error(
    start_host: StartHost, tmp_path: Path
) -> None:
    host = await start_host(socket=tmp_path / ("x" * 120 + ".sock"), ready=False)
    assert await host.wait() == 2
    assert "cannot listen on" in host.log
    assert "Traceback" not in host.log


async def test_a_signal_during_recovery_ends_the_host_cleanly(
    start_host: StartHost, tmp_path: Path, data_dir: Path
) -> None:
    sessions = data_dir / "sessions"
    sessions.mkdir(parents=True)
    for i in range(1000):  # transcripts without an index: start indexes every one
        (sessions / f"s{i}.jsonl").write_bytes(dumps(msg(f"m{i}")) + b"\n")
    sock = tmp_path / "host.sock"
    host = await start_host(socket=sock, ready=False)
    await host.wait_for_log("reconciled")  # recovery has begun
    host.proc.send_signal(signal.SIGTERM)
    assert await host.wait() == 0
    assert "Traceback" not in host.log
    assert not sock.exists()


async def test_a_stopping_host_leaves_a_newer_hosts_socket_alone(
    start_host: StartHost, tmp_path: Path
) -> None:
    """A host that waits for a slow client at stop has stopped listening: another host may
    take the path meanwhile, and the first must not unlink that host's socket on exit."""
    sock = tmp_path / "host.sock"
    first = await start_host(tmp_path / "a", socket=sock)
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a client that reads nothing
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    slow.connect(str(sock))

    def line(rid: int, method: str, params: dict[str, Any]) -> bytes:
        return dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + b"\n"

    big = msg("m", content="x" * 500_000)
    gets = b"".join(line(4 + i, "session.get", {"sessionId": "s"}) for i in range(40))
    slow.sendall(
        line(1, "handshake", {"protocolVersion": 11})
        + line(2, "session.create", {"sessionId": "s"})
        + line(3, "session.appendMessage", {"sessionId": "s", "message": big})
        + gets
    )  # 20 MB of answers: they back up, and the host stops making more (issue 26)

    def read_all() -> int:
        with slow, slow.makefile("rb") as f:
            return sum(1 for _ in f)

    watcher = await first.connect()
    await watcher.handshake()
    for _ in range(2000):  # bounded polling of the outcome: the gets wait for the client
        stats = await watcher.call("host.stats")
        if stats["counters"]["calls.waiting"]:
            break
    else:
        raise AssertionError(f"the answers never backed up: {stats}")
    first.proc.send_signal(signal.SIGTERM)
    await first.wait_for_log("closing: waiting for the client")
    second = await start_host(tmp_path / "b", socket=sock)  # the path answers nobody now
    assert await asyncio.to_thread(read_all) == 43  # every answer, then the host's close
    assert await first.wait() == 0
    c = await second.connect()
    await c.handshake()  # still reachable at the path
    assert (await c.call("session.list")) == {"sessions": []}
