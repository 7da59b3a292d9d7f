"""Descriptors: the host serves any number of sessions in a few open files.

A desktop app's child gets macOS's ``ulimit -n 256``; every session touched used to keep
its transcript open for good, so after a few hundred chats, even only read, creates,
rewrites and checkpoints failed with EMFILE (issue 26). The host now keeps the least
recently used transcripts closed, and raises its soft limit to the hard one at start.
Here the limit is 128, soft and hard (nothing to raise), for 600 sessions.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

from tests.conftest import Client, StartHost, dumps, run_cli, transcript

SESSIONS = 600
NOFILE = 128


def _write_sessions(data: Path, n: int) -> None:
    """Transcripts written straight into the data dir: the host indexes them at start."""
    (data / "sessions").mkdir(parents=True, mode=0o700)
    for i in range(n):
        line = json.dumps({"id": "u0", "role": "user", "content": f"hello {i}"})
        transcript(data, f"s{i}").write_text(line + "\n")


async def _pipelined(client: Client, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Send ``calls`` in one write; return their responses in order."""
    futs, lines = [], []
    for method, params in calls:
        rid = client.next_id()
        futs.append(client.expect(rid))
        lines.append(dumps(client.envelope(method, params, rid)) + b"\n")
    await client.send_raw(b"".join(lines))
    return [await client.wait(f) for f in futs]


def _errors(replies: list[Any]) -> list[Any]:
    return [r["error"] for r in replies if "error" in r]


async def test_600_sessions_are_read_and_written_under_ulimit_128(
    start_host: StartHost, data_dir: Path
) -> None:
    _write_sessions(data_dir, SESSIONS)
    host = await start_host(nofile=NOFILE)
    client = host.client
    assert client is not None
    await client.handshake()
    for base in range(0, SESSIONS, 300):  # 300 sessions busy at once: over the limit
        batch = range(base, base + 300)
        replies = await _pipelined(
            client,
            [("session.get", {"sessionId": f"s{i}"}) for i in batch]
            + [
                (
                    "session.appendMessage",
                    {"sessionId": f"s{i}", "message": {"id": "a0", "role": "assistant"}},
                )
                for i in batch
            ],
        )
        assert _errors(replies) == []
        assert [r["result"]["messages"][0]["content"] for r in replies[:300]] == [
            f"hello {i}" for i in batch
        ]
        assert all(r["result"] == {"line": 1, "appended": True} for r in replies[300:])
    # What used to fail first once descriptors ran out: creates, rewrites, checkpoints.
    await client.call("session.create", sessionId="late")
    await client.call(
        "session.updateMessage",
        sessionId="s0",
        message={"id": "a0", "role": "assistant", "content": "edited"},
    )
    await client.call("session.beginTurn", sessionId="s1", turnId="t1")
    saved = await client.call(
        "session.saveInflightMessage",
        sessionId="s1",
        turnId="t1",
        message={"id": "a1", "role": "assistant", "content": "part"},
    )
    assert saved == {"saved": True}
    cut = await client.call("session.truncateFrom", sessionId="s2", fromMessageId="a0")
    assert cut["kept"] == 1
    stats = await client.call("host.stats")
    assert stats["counters"]["sessions.open"] < NOFILE // 2
    assert stats["counters"]["transcripts.closed"] >= SESSIONS - NOFILE
    # Every session was read and written, none spoiled; the index agrees with them all.
    again = await _pipelined(client, [("session.get", {"sessionId": f"s{i}"}) for i in (3, 599)])
    assert [len(r["result"]["messages"]) for r in again] == [2, 2]
    assert await host.stop() == 0
    code, out, err = await run_cli("verify", "--data-dir", str(data_dir))
    assert code == 0, out + err


async def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(
    start_host: StartHost,
) -> None:
    """macOS gives a desktop app's child a soft limit of 256 whatever the hard one is."""
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    host = await start_host(nofile=(256, hard))
    assert host.client is not None
    await host.client.handshake()
    limits = Path(f"/proc/{host.pid}/limits").read_text()
    (row,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
    assert row.split()[3:5] == [str(hard), str(hard)]
