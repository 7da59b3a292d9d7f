"""Helpers for the turn, revision, truncation and checkpoint tests (issues 3 and 4).

They look at the data dir the way a user would after a crash: the transcript's lines, the
checkpoint file, leftover temp files, and whether a file was rewritten (inode) or touched
at all (mtime, bytes). Everything protocol-level comes from :mod:`tests.conftest`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Client, HostProcess, RpcError, StartHost, msg, transcript


def reply(mid: str, text: str | None = None, **extra: Any) -> dict[str, Any]:
    """An assistant message as the agent runtime sends it."""
    return msg(mid, "assistant", f"reply {mid}" if text is None else text, **extra)


def lines_of(data: Path, sid: str) -> list[dict[str, Any]]:
    """The stored messages of a session, parsed from its transcript file."""
    raw = transcript(data, sid).read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), "a transcript ends with a whole line"
    return [json.loads(line) for line in raw.splitlines()]


def ids_of(data: Path, sid: str) -> list[str]:
    """The message ids of a session's transcript file, in order."""
    return [m["id"] for m in lines_of(data, sid)]


def file_state(path: Path) -> tuple[int, int, int, bytes]:
    """A file's inode, size, mtime and bytes: equal only if nothing touched it."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, path.read_bytes()


def inflight(data: Path, sid: str) -> Path:
    """The checkpoint file of a session."""
    return data / "sessions" / f"{sid}.inflight.json"


def temp_files(data: Path) -> list[Path]:
    """Every temp file anywhere under the data dir."""
    return sorted(p for p in data.rglob("*.tmp"))


async def fails(client: Client, method: str, **params: Any) -> RpcError:
    """Call ``method`` and return the error it must answer with."""
    with pytest.raises(RpcError) as err:
        await client.call(method, **params)
    return err.value


async def boot(start_host: StartHost, data: Path | None = None) -> HostProcess:
    """Start a stdio host (on the test's data dir unless told) and handshake it."""
    host = await start_host(data)
    assert host.client is not None
    await host.client.handshake()
    assert temp_files(host.data_dir) == [], "start leaves no temp file behind"
    return host


async def reboot(start_host: StartHost, old: HostProcess) -> HostProcess:
    """Kill -9 ``old``, start a host on its data dir and handshake it."""
    await old.kill()
    return await boot(start_host, old.data_dir)


def cli(host: HostProcess) -> Client:
    """The stdio client of ``host``."""
    assert host.client is not None
    return host.client


async def two_streaming_turns(start_host: StartHost) -> None:
    """Sessions ``s`` and ``other``, each with a running turn and a checkpoint; stopped."""
    host = await start_host()
    assert host.client is not None
    c = host.client
    await c.handshake()
    for sid in ("s", "other"):
        await c.call("session.create", sessionId=sid)
        await c.call("session.beginTurn", sessionId=sid, turnId="t1", prompt=msg(f"{sid}-q"))
        await c.call(
            "session.saveInflightMessage",
            sessionId=sid,
            turnId="t1",
            message=msg(f"{sid}-a", "assistant", content="a partial answer"),
        )
    assert await host.stop() == 0  # the turns stay running: the next start settles them
