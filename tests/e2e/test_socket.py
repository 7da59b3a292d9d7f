"""The host as a local service on a Unix socket: many clients, each with its own handshake."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

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
