"""A real full disk: a small tmpfs holds the data dir; the host fills it, then recovers.

Appends answer STORAGE_ERROR once the disk is full and the host stays up. An append is
answered once its line is fsynced and its index row is committed after the answer, so
while the disk is full a read of the session may answer STORAGE_ERROR too (its index
cannot take the rows); once space is freed every acknowledged row is read back, the next
append succeeds, and after a restart everything acknowledged is there and verify agrees.
Needs root (mount); skipped elsewhere, where the fault-injection seam covers ENOSPC
(tests/host/test_faults.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import RpcError, StartHost, get_messages, msg, restart_host, run_cli


async def test_a_full_disk_answers_storage_error_and_loses_nothing(
    start_host: StartHost, small_disk: Path
) -> None:
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * 512 * 1024)  # freed later to make room again
    host = await start_host(small_disk / "data")
    c = host.client
    assert c is not None
    await c.handshake()
    await c.call("session.create", sessionId="s")
    acked: list[str] = []
    body = "x" * 32 * 1024
    error = None
    for i in range(200):
        try:
            res = await c.call(
                "session.appendMessage", sessionId="s", message=msg(f"m{i}", "assistant", body)
            )
        except RpcError as exc:
            error = exc
            break
        assert res["appended"] is True
        acked.append(f"m{i}")
    assert error is not None, "the disk never filled"
    assert (error.code, error.name) == (-32007, "STORAGE_ERROR")
    assert acked, "nothing fitted at all"
    # The host lives on; a read serves every acknowledged row and only those, or fails.
    try:
        assert [m["id"] for m in await get_messages(c, "s")] == acked
    except RpcError as exc:
        assert exc.name == "STORAGE_ERROR"
    try:  # still full: fails cleanly (or fits in what a failed write gave back)
        await c.call("session.appendMessage", sessionId="s", message=msg("again", "user", body))
        acked.append("again")
    except RpcError as exc:
        assert exc.name == "STORAGE_ERROR"
    os.unlink(ballast)
    assert [m["id"] for m in await get_messages(c, "s")] == acked
    res = await c.call("session.appendMessage", sessionId="s", message=msg("after", "user", "ok"))
    assert res["appended"] is True
    acked.append("after")
    assert [m["id"] for m in await get_messages(c, "s")][-1] == "after"
    host = await restart_host(start_host, host)
    assert host.client is not None
    got = [m["id"] for m in await get_messages(host.client, "s")]
    assert got == acked
    await host.stop()
    code, out, _err = await run_cli("verify", "--data-dir", str(small_disk / "data"))
    assert code == 0, out
