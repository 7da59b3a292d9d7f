"""stdin and stdout may be sockets, plain files or devices, not only pipes.

Node's ``child_process`` (an Electron app's main process) gives a child a socket pair for
each of stdin and stdout; inetd and systemd's ``Accept=yes`` give it one socket for both,
which the host took for a closed peer at its first request. A service manager starts the
host with ``/dev/null`` for stdin; a script feeds it a file of requests and keeps the
answers in another. uvloop aborted the process on both, and asyncio waited on
``/dev/null`` for ever.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import READ_LIMIT, REPO, WAIT, Client, msg, transcript

LOOPS = ["uvloop", "asyncio"]
REQUESTS = [
    {"jsonrpc": "2.0", "id": 1, "method": "handshake", "params": {"protocolVersion": 11}},
    {"jsonrpc": "2.0", "id": 2, "method": "session.create", "params": {"sessionId": "f"}},
    {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "session.appendMessage",
        "params": {"sessionId": "f", "message": {"id": "m1", "role": "user", "content": "hi"}},
    },
    {"jsonrpc": "2.0", "id": 4, "method": "session.get", "params": {"sessionId": "f"}},
]


async def spawn(
    data: Path, stdin: Any, stdout: Any, loop: str, stderr: Any = asyncio.subprocess.DEVNULL
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "host", "serve", "--loop", loop, "--data-dir", str(data)),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=REPO,
    )


async def exit_code(proc: asyncio.subprocess.Process) -> int:
    """Wait for the host to exit (killed if it does not)."""
    try:
        async with asyncio.timeout(WAIT):
            return await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def serve(data: Path, stdin: str, stdout: str, loop: str) -> int:
    with open(stdin, "rb") as fin, open(stdout, "wb") as fout:
        return await exit_code(await spawn(data, fin, fout, loop))


@pytest.mark.parametrize("loop", LOOPS)
async def test_requests_from_a_file_are_answered_into_a_file(tmp_path: Path, loop: str) -> None:
    requests = tmp_path / "in.ndjson"
    # the last request has no newline: end of input ends it
    requests.write_bytes(b"\n".join(json.dumps(r).encode() for r in REQUESTS))
    answers = tmp_path / "out.ndjson"
    assert await serve(tmp_path / "data", str(requests), str(answers), loop) == 0
    replies = [json.loads(line) for line in answers.read_bytes().splitlines()]
    assert [r["id"] for r in replies] == [1, 2, 3, 4]
    assert replies[2]["result"] == {"line": 0, "appended": True}
    assert [m["id"] for m in replies[3]["result"]["messages"]] == ["m1"]
    assert (tmp_path / "data" / "sessions" / "f.jsonl").read_bytes().count(b"\n") == 1


@pytest.mark.parametrize("loop", LOOPS)
async def test_dev_null_on_stdin_and_stdout_is_an_empty_connection(
    tmp_path: Path, loop: str
) -> None:
    assert await serve(tmp_path / "data", os.devnull, os.devnull, loop) == 0


@pytest.mark.parametrize("loop", LOOPS)
async def test_answers_into_a_full_device_end_the_client_not_the_calls(
    tmp_path: Path, loop: str
) -> None:
    """``/dev/full`` takes no byte (ENOSPC, as a file on a full disk): the answers are
    lost, as to a client gone, the calls still run, and the log says so in a line where it
    printed two "Task exception was never retrieved" tracebacks."""
    requests = tmp_path / "in.ndjson"
    requests.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in REQUESTS))
    log = tmp_path / "host.log"
    with open(requests, "rb") as fin, open("/dev/full", "wb") as fout, open(log, "wb") as err:
        code = await exit_code(await spawn(tmp_path / "data", fin, fout, loop, err))
    assert code == 0
    assert (tmp_path / "data" / "sessions" / "f.jsonl").read_bytes().count(b"\n") == 1
    text = log.read_text()
    assert "Traceback" not in text and "never retrieved" not in text, text
    assert "No space left on device" in text, text


async def converse(client: Client, proc: asyncio.subprocess.Process, data: Path) -> None:
    """A session, an append and a 1 MB checkpoint; end of input then ends the host."""
    try:
        await client.handshake()
        await client.call("session.create", sessionId="s")
        assert await client.call("session.appendMessage", sessionId="s", message=msg("m1"))
        await client.call("session.beginTurn", sessionId="s", turnId="t")
        big = msg("r1", "assistant", "x" * (1 << 20))
        saved = await client.call(
            "session.saveInflightMessage", sessionId="s", turnId="t", message=big
        )
        assert saved == {"saved": True}
        got = await client.call("session.get", sessionId="s")
        assert [m["id"] for m in got["messages"]] == ["m1"]
        await client.close_input()
        await client.wait_eof()
    finally:
        await client.close()
        code = await exit_code(proc)  # end of input, or a kill when it hangs
    assert code == 0
    assert transcript(data, "s").read_bytes().count(b"\n") == 1
    body = json.loads((data / "sessions" / "s.inflight.json").read_bytes())
    assert body["message"]["id"] == "r1"


@pytest.mark.parametrize("loop", LOOPS)
async def test_one_socket_on_stdin_and_stdout_is_one_connection(tmp_path: Path, loop: str) -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        proc = await spawn(tmp_path / "data", theirs, theirs, loop)
    reader, writer = await asyncio.open_unix_connection(sock=ours, limit=READ_LIMIT)
    await converse(Client(reader, writer), proc, tmp_path / "data")


@pytest.mark.parametrize("loop", LOOPS)
async def test_a_socket_pair_each_way_as_node_spawns_a_child(tmp_path: Path, loop: str) -> None:
    to_host, host_in = socket.socketpair()
    from_host, host_out = socket.socketpair()
    with host_in, host_out:
        proc = await spawn(tmp_path / "data", host_in, host_out, loop)
    _, writer = await asyncio.open_unix_connection(sock=to_host)
    reader, unused = await asyncio.open_unix_connection(sock=from_host, limit=READ_LIMIT)
    try:
        await converse(Client(reader, writer), proc, tmp_path / "data")
    finally:
        unused.close()


def _read_all(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 1 << 16):
        out += chunk
    return bytes(out)


def _line(rid: int, method: str, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()


# Found at 6286078: the host exited 0 with up to 64 KiB of answers still queued for a client
# that was busy for a moment, the last one cut mid-line (FlowControlMixin has no close waiter).
@pytest.mark.parametrize("ending", ["end-of-input", "shutdown"])
@pytest.mark.parametrize("loop", LOOPS)
async def test_every_answer_is_written_before_the_host_exits(
    tmp_path: Path, loop: str, ending: str
) -> None:
    answers, host_out = os.pipe()  # a plain pipe: nothing reads it until we do
    pipe = asyncio.subprocess.PIPE
    proc = await spawn(tmp_path / "data", pipe, host_out, loop, stderr=pipe)
    os.close(host_out)
    assert proc.stdin is not None and proc.stderr is not None
    big = msg("m1", content="x" * 10_000)
    lines = [
        _line(1, "handshake", protocolVersion=11),
        _line(2, "session.create", sessionId="s"),
        _line(3, "session.appendMessage", sessionId="s", message=big),
        # ~100 KB of answers: a 64 KiB pipe full, and the rest queued in the host (under
        # the 64 KiB at which its writes wait), so every call finishes and the host closes
        *(_line(10 + i, "session.get", sessionId="s") for i in range(10)),
    ]
    if ending == "shutdown":
        lines.append(_line(99, "host.shutdown"))
    proc.stdin.write(b"\n".join(lines) + b"\n")
    if ending == "end-of-input":
        proc.stdin.close()
    try:
        async with asyncio.timeout(WAIT):
            # The client is busy: it reads nothing until the host is closing (or gone).
            while log := await proc.stderr.readline():
                if b"waiting for the client to read" in log:
                    break
            out = await asyncio.to_thread(_read_all, answers)
            assert await proc.wait() == 0
    finally:
        os.close(answers)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    ids = [json.loads(line)["id"] for line in out.split(b"\n")[:-1]]
    assert sorted(ids) == [json.loads(line)["id"] for line in lines]
    assert out.endswith(b"\n")


def _read_until(fd: int, text: bytes) -> bytes:
    out = b""
    while text not in out:
        out += os.read(fd, 1 << 16)
    return out


async def _over_a_terminal(data: Path, loop: str, steps: list[tuple[bytes, bytes]]) -> bool:
    """Serve on one terminal as stdin and stdout: send each request, read until its
    answer's ``text``, then end input with ^D. Whether the terminal is blocking after."""
    master, terminal = pty.openpty()
    try:
        assert os.get_blocking(terminal)
        proc = await spawn(data, terminal, terminal, loop)
        try:
            async with asyncio.timeout(WAIT):
                for request, text in steps:
                    os.write(master, request + b"\n")
                    await asyncio.to_thread(_read_until, master, text)
                os.write(master, b"\x04")  # ^D on an empty line: end of input
            assert await exit_code(proc) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        return os.get_blocking(terminal)
    finally:
        os.close(master)
        os.close(terminal)


# Found at afd55dc: the host left its terminal non-blocking, so the next program run in
# that shell failed with EAGAIN.
@pytest.mark.parametrize("loop", LOOPS)
async def test_a_terminal_is_left_as_it_was_found(tmp_path: Path, loop: str) -> None:
    handshake = _line(1, "handshake", protocolVersion=11)
    assert await _over_a_terminal(tmp_path / "data", loop, [(handshake, b'"protocolVersion":11,')])


# Found at b5a8abe: an append done at once (no task, no drain) left its answer in the
# terminal writer's buffer, which only a drain wrote out: the client waited for ever.
@pytest.mark.parametrize("loop", LOOPS)
async def test_an_append_done_at_once_is_answered_on_a_terminal(tmp_path: Path, loop: str) -> None:
    def append(rid: int, mid: str) -> bytes:
        return _line(rid, "session.appendMessage", sessionId="s", message=msg(mid))

    steps = [
        (_line(1, "handshake", protocolVersion=11), b'"id":1,"result"'),
        (_line(2, "session.create", sessionId="s"), b'"id":2,"result"'),
        # the first append opens the session (the awaited way), the second is alone
        (append(3, "m0"), b'"id":3,"result":{"line":0,"appended":true}'),
        (append(4, "m1"), b'"id":4,"result":{"line":1,"appended":true}'),
    ]
    await _over_a_terminal(tmp_path / "data", loop, steps)
