"""Answers of the host the client must read, or fail at once (issue 36, case 5).

The host stores a message holding half a surrogate pair as its caller sent it (JavaScript
clients write ``\\ud83d``) and sends it back so in every read; the client reads it the way
the host does. An answer line it cannot read even so fails the calls it answers at once,
with a clear error, never after their whole deadline.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from outbox import ClientError, HostClient
from tests.outbox.kit import CAPTURES, drive_pi, finished, spawned, until
from tests.outbox.test_client import PipeWriter

JS_ROW = b'{"id":"js-1","role":"user","content":[{"type":"text","text":"Bonjour \\ud83d"}]}'
DEEP = b"[" * 5000 + b"]" * 5000  # past what any decoder here reads


async def test_drive_reads_a_history_holding_half_an_emoji_and_gives_it_to_pi(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    async with spawned(data / "host") as client:  # what a JavaScript client stored
        await client.call("session.create", {"sessionId": "s0"})
        await client.call(
            "session.appendMessage", {"sessionId": "s0", "message": msgspec.Raw(JS_ROW)}
        )
    told = tmp_path / "fake-pi.log"
    proc = await drive_pi(
        data,
        str(CAPTURES / "text"),
        *("--sessions", "1", "--turns", "1"),
        env={**os.environ, "FAKE_PI_LOG": str(told)},
    )
    code, facts, err = await finished(proc)  # not the client's 130 s deadline
    assert code == 0, err
    assert facts[-1]["outcomes"] == {"completed": 1}, err
    start = json.loads(told.read_text().splitlines()[0])
    assert start["history"][0]["content"] == [{"type": "text", "text": "Bonjour \ufffd"}]
    kept = (data / "host" / "sessions" / "s0.jsonl").read_bytes().splitlines()[0]
    assert b'"Bonjour \\ud83d"' in kept, "the host keeps its caller's bytes"


def answer(rid: int, result: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"result":%s}' % (rid, result)


LINES = {
    "nested past the decoder": answer(1, DEEP),
    "half a pair and deep": answer(1, b'["\\ud83d",' + DEEP + b"]"),
}


@pytest.mark.parametrize("case", sorted(LINES))
async def test_an_answer_that_cannot_be_read_fails_its_call_at_once(case: str) -> None:
    reader, writer = asyncio.StreamReader(), PipeWriter()
    client = HostClient(reader, writer, deadline=600.0)  # type: ignore[arg-type]
    other = asyncio.create_task(client.call("session.list"))
    call = asyncio.create_task(client.call("session.get", {"sessionId": "s"}))
    await until(lambda: len(writer.lines) == 2, "the requests to be sent")
    reader.feed_data(LINES[case].replace(b'"id":1', b'"id":%d' % writer.lines[1]["id"]) + b"\n")
    with pytest.raises(ClientError, match="cannot be read"):
        await asyncio.wait_for(call, 10.0)  # not the 600 s deadline
    assert not other.done(), "an answer naming its call fails that call only"
    reader.feed_data(answer(writer.lines[0]["id"], b'{"sessions":[]}') + b"\n")
    assert await asyncio.wait_for(other, 10.0) == {"sessions": []}
    reader.feed_eof()
    await client.close()


async def test_a_batch_answer_that_cannot_be_read_fails_every_call_of_the_batch() -> None:
    reader, writer = asyncio.StreamReader(), PipeWriter()
    client = HostClient(reader, writer, deadline=600.0)  # type: ignore[arg-type]
    calls = [("session.get", {"sessionId": "s"}), ("session.get", {"sessionId": "t"})]
    batch = asyncio.create_task(client.batch(calls))
    await until(lambda: len(writer.lines) == 1, "the batch to be sent")
    first, second = (item["id"] for item in writer.lines[0])
    line = b"[%s,%s]\n" % (answer(first, DEEP), answer(second, b"{}"))
    told: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: told.append(context))
    reader.feed_data(line)
    with pytest.raises(ClientError, match="cannot be read"):
        await asyncio.wait_for(batch, 10.0)
    del batch
    gc.collect()  # a failed call's future nobody read is reported when it is collected
    assert told == [], "every call of the batch failed, and each failure was read"
    reader.feed_eof()
    await client.close()


async def test_an_unreadable_line_that_names_no_call_fails_every_waiting_call() -> None:
    reader, writer = asyncio.StreamReader(), PipeWriter()
    client = HostClient(reader, writer, deadline=600.0)  # type: ignore[arg-type]
    calls: list[asyncio.Task[Any]] = [
        asyncio.create_task(client.call("session.get", {"sessionId": s})) for s in "st"
    ]
    await until(lambda: len(writer.lines) == 2, "the requests to be sent")
    reader.feed_data(b'{"result":' + DEEP + b',"jsonrpc":"2.0"}\n')  # whose is it? unknown
    for call in calls:
        with pytest.raises(ClientError, match="cannot be read"):
            await asyncio.wait_for(call, 10.0)
    reader.feed_eof()
    await client.close()
