"""stdin and stdout may be plain files or devices, not only pipes: a batch job's host.

A service manager starts the host with ``/dev/null`` for stdin; a script feeds it a file
of requests and keeps the answers in another. uvloop aborted the process on both, and
asyncio waited on ``/dev/null`` for ever.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, WAIT

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


async def serve(data: Path, stdin: str, stdout: str, loop: str) -> int:
    with open(stdin, "rb") as fin, open(stdout, "wb") as fout:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "host", "serve", "--loop", loop, "--data-dir", str(data)),
            stdin=fin,
            stdout=fout,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=REPO,
        )
        try:
            async with asyncio.timeout(WAIT):
                return await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


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
