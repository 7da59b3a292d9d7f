"""One host per data dir: a second one is refused at once and names the holder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import (
    Client,
    HostProcess,
    StartHost,
    get_messages,
    make_session,
    msg,
    run_cli,
)


async def test_a_second_host_on_the_same_dir_exits_nonzero_naming_the_holder(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path
) -> None:
    sent = await make_session(client, "s", 2)
    before = (data_dir / "sessions" / "s.jsonl").read_bytes()
    second = await start_host()
    code = await second.wait()  # bounded: it must give up by itself, not wait for the lock
    assert code != 0
    assert f"pid {host.pid}" in second.log
    assert second.client is not None and second.client.lines == 0  # nothing on stdout
    # The first host is unharmed and still serving.
    assert await get_messages(client, "s") == sent
    assert (data_dir / "sessions" / "s.jsonl").read_bytes() == before


async def test_a_second_socket_host_is_refused_too(
    start_host: StartHost, tmp_path: Path, data_dir: Path
) -> None:
    first = await start_host(socket=tmp_path / "a.sock")
    second = await start_host(socket=tmp_path / "b.sock", ready=False)
    assert await second.wait() != 0
    assert f"pid {first.pid}" in second.log
    assert not (tmp_path / "b.sock").exists()
    c = await first.connect()
    await c.handshake()
    assert (await c.call("session.list")) == {"sessions": []}


async def test_the_dir_is_free_again_once_the_holder_is_gone(
    host: HostProcess, client: Client, start_host: StartHost
) -> None:
    await make_session(client, "s", 1)
    await host.kill()  # kill -9: the lock goes with the process
    again = await start_host()
    assert again.client is not None
    await again.client.handshake()
    assert len(await get_messages(again.client, "s")) == 1


async def test_repair_is_refused_while_a_host_holds_the_dir(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    await make_session(client, "s", 2)
    before = (data_dir / "sessions" / "s.jsonl").read_bytes()
    code, out, err = await run_cli("verify", "--data-dir", str(data_dir), "--repair")
    assert code != 0
    assert f"pid {host.pid}" in out + err
    assert (data_dir / "sessions" / "s.jsonl").read_bytes() == before
    assert len(await get_messages(client, "s")) == 2


@pytest.mark.parametrize("how", ["unlinked", "replaced"])
async def test_a_lock_file_removed_under_a_live_host_lets_no_second_host_in(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path, how: str
) -> None:
    """Found at 650cc00 (issue 26, case 8): the lock was only the file's.

    With ``host.lock`` deleted (a cleanup script, a sync client), a second host took a
    new file's lock and served the same data dir: with two writers, 39 acknowledged
    appends became unreadable and ``verify`` failed, even after a restart.
    """
    sent = await make_session(client, "s", 2)
    lock = data_dir / "host.lock"
    lock.unlink()
    if how == "replaced":
        lock.write_bytes(b"12345\n")
    second = await start_host()
    assert await second.log_or_exit("recovered") is None, f"a second host started:\n{second.log}"
    code = await second.wait()
    assert code == 3, second.log
    assert "in use by another host" in second.log and "Traceback" not in second.log
    assert second.client is not None and second.client.lines == 0
    # The first host still owns the dir: what it acknowledges stays readable.
    more = [msg(f"n{i}", "assistant") for i in range(20)]
    for m in more:
        await client.call("session.appendMessage", sessionId="s", message=m)
    assert await get_messages(client, "s") == sent + more
    assert await host.stop() == 0
    code, out, err = await run_cli("verify", "--data-dir", str(data_dir))
    assert code == 0, out + err
