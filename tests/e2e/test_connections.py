"""Socket connections: a cap with a clear refusal, a handshake deadline, small buffers.

1,100 idle connections under ``ulimit -n 1024`` made appends, updates, revisions and
checkpoints fail with EMFILE, and each held ~1 MiB (issue 26). Here the limit is 128
descriptors (soft and hard) and 150 connections, to stay fast.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from scripts.pressure import connect_raw, vm_mb
from tests.conftest import Client, StartHost, msg

NOFILE = 128


async def _raw_connect(path: Path) -> socket.socket:
    """Connect, trying again while the host's listen backlog is full (EAGAIN)."""
    s = await connect_raw(path, bound=10.0)
    assert s is not None, "the host never accepted"
    return s


def _said(s: socket.socket) -> tuple[list[Any], bool]:
    """Every line the host sent on a raw socket, and whether it then closed it."""
    s.settimeout(20)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return [json.loads(x) for x in data.splitlines()], True


async def _writes(c: Client, sid: str) -> None:
    """What failed with EMFILE: a create, appends, an update, a turn's checkpoint."""
    await c.call("session.create", sessionId=sid)
    await c.call("session.appendMessage", sessionId=sid, message=msg("u1"))
    await c.call("session.appendMessage", sessionId=sid, message=msg("a1", "assistant"))
    await c.call("session.updateMessage", sessionId=sid, message=msg("a1", "assistant", "new"))
    await c.call("session.beginTurn", sessionId=sid, turnId="t2")
    saved = await c.call(
        "session.saveInflightMessage", sessionId=sid, turnId="t2", message=msg("a2", "assistant")
    )
    assert saved == {"saved": True}


async def test_connections_past_the_cap_are_refused_and_writes_go_on(
    start_host: StartHost, tmp_path: Path
) -> None:
    host = await start_host(socket=tmp_path / "host.sock", nofile=NOFILE)
    worker = await host.connect()
    await worker.handshake()
    await _writes(worker, "before")
    idle = [await _raw_connect(tmp_path / "host.sock") for _ in range(150)]
    try:
        for s in idle[:5]:  # served connections handshake; the others stay silent
            s.sendall(
                b'{"jsonrpc":"2.0","id":1,"method":"handshake","params":{"protocolVersion":11}}\n'
            )
        await _writes(worker, "after")  # no EMFILE: the host kept its descriptors
        stats = await worker.call("host.stats")
        refused = stats["counters"]["connections.refused"]
        assert refused > 0
        # Each refused connection got one clear line, then its end.
        told = await asyncio.gather(*(asyncio.to_thread(_said, s) for s in idle[-refused:]))
        for lines, closed in told:
            assert closed
            (err,) = lines
            assert err["id"] is None
            assert err["error"]["data"]["code"] == "LIMIT_EXCEEDED"
            assert "too many connections" in err["error"]["message"]
    finally:
        for s in idle:
            s.close()


async def test_a_connection_without_a_handshake_is_closed_at_the_deadline(
    start_host: StartHost, tmp_path: Path
) -> None:
    host = await start_host(socket=tmp_path / "host.sock", args=["--handshake-timeout", "0.5"])
    good = await host.connect()
    await good.handshake()
    silent = await _raw_connect(tmp_path / "host.sock")
    t0 = time.monotonic()
    try:
        lines, closed = await asyncio.to_thread(_said, silent)
    finally:
        silent.close()
    assert closed and time.monotonic() - t0 < 10
    (err,) = lines
    assert err["id"] is None and err["error"]["data"]["code"] == "NOT_HANDSHAKEN"
    assert "no handshake within 0.5 s" in err["error"]["message"]
    # A handshaken connection is not subject to it: it is still served.
    assert (await good.call("session.list")) == {"sessions": []}


@pytest.mark.parametrize("n", [40])
async def test_an_idle_connection_holds_a_small_buffer(
    start_host: StartHost, tmp_path: Path, n: int
) -> None:
    """Each idle connection held a 1 MiB read buffer: 40 of them, 40 MB."""
    host = await start_host(socket=tmp_path / "host.sock")
    first = await host.connect()
    await first.handshake()
    before = vm_mb(host.pid, "VmRSS")
    clients = [await host.connect() for _ in range(n)]
    for c in clients:
        await c.handshake()
    grown = vm_mb(host.pid, "VmRSS") - before
    assert grown < 16, f"{n} idle connections took {grown:.1f} MB"
