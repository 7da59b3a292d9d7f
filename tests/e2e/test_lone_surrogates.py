"""A lone UTF-16 surrogate, as JavaScript's JSON.stringify writes it, is stored as sent.

A streaming reply cut in the middle of an emoji holds half a surrogate pair, and
``JSON.stringify`` (well-formed since ES2019) writes it as an escape: ``"Bonjour \\ud83d"``.
That is JSON text (RFC 8259's grammar allows it; JSON.parse and Python's json read it),
and the host stores the caller's bytes; it used to answer PARSE_ERROR with ``id: null``
("Input data was truncated"), an error no client can match to its request. Found at
650cc00 (issue 26, case 13). The bytes here are exactly what ``node`` writes; the test
checks them against node itself when it is installed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    WAIT,
    Client,
    HostProcess,
    StartHost,
    dumps,
    get_messages,
    run_cli,
    run_view,
    transcript,
)

# node -e 'process.stdout.write(JSON.stringify({id:"a1",role:"assistant",
#     content:"Bonjour \ud83d"}))'
BONJOUR = b'{"id":"a1","role":"assistant","content":"Bonjour \\ud83d"}'
# Half a pair each way, backwards, at the start and the end, inside content blocks, beside
# an escaped backslash that is no escape, and in a nested object.
ODD = b'{"id":"a2","role":"assistant","content":[{"type":"text","text":"\\ude00x\\ud83d"},'
ODD += b'{"type":"text","text":"\\ude00\\ud83d\\\\ud83d"}],"usage":{"k":"\\udfff"}}'
NODE_EXPR = {
    BONJOUR: '{id:"a1",role:"assistant",content:"Bonjour \\ud83d"}',
    ODD: '{id:"a2",role:"assistant",content:[{type:"text",text:"\\ude00x\\ud83d"},'
    '{type:"text",text:"\\ude00\\ud83d\\\\ud83d"}],usage:{k:"\\udfff"}}',
}
# Other writers spell the hex upper-case (Java's, .NET's); a pair split by another escape.
UPPER = b'{"id":"a3","role":"user","content":"\\uD83D\\u0041\\uDE00 \\uDBFF"}'


def _node(expr: str) -> bytes:
    done = subprocess.run(
        ["node", "-e", f"process.stdout.write(JSON.stringify({expr}))"],
        capture_output=True,
        check=True,
        timeout=30,
    )
    return done.stdout


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("message", [BONJOUR, ODD], ids=["bonjour", "odd"])
def test_these_are_the_bytes_json_stringify_writes(message: bytes) -> None:
    assert _node(NODE_EXPR[message]) == message


async def _call_raw(c: Client, method: str, params: bytes) -> dict[str, Any]:
    """Send a request whose params are the bytes ``params``; return the response.

    Fails at once when the answer comes without the request's id (``id: null``).
    """
    rid = c.next_id()
    head = b'{"jsonrpc":"2.0","id":%d,"method":%s,"params":' % (rid, dumps(method))
    answer = c.expect(rid)
    await c.send_raw(head + params + b"}\n")
    stray = asyncio.ensure_future(c.next_unmatched())
    done, _ = await asyncio.wait({answer, stray}, timeout=WAIT, return_when="FIRST_COMPLETED")
    stray.cancel()
    if answer in done:
        return answer.result()
    raise AssertionError(f"answered without the request's id: {stray.result()}")


def _text(message: bytes) -> Any:
    return json.loads(message)  # as JSON.parse reads it: the lone surrogates kept


@pytest.mark.parametrize("message", [BONJOUR, ODD, UPPER], ids=["bonjour", "odd", "upper"])
async def test_a_lone_surrogate_is_stored_as_sent_and_read_back(
    host: HostProcess, client: Client, start_host: StartHost, data_dir: Path, message: bytes
) -> None:
    await client.call("session.create", sessionId="s")
    res = await _call_raw(
        client, "session.appendMessage", b'{"sessionId":"s","message":' + message + b"}"
    )
    assert res.get("result") == {"line": 0, "appended": True}, res
    assert transcript(data_dir, "s").read_bytes() == message + b"\n"
    assert await get_messages(client, "s") == [_text(message)]
    again = await _call_raw(  # a replay is deduplicated as any other
        client, "session.appendMessage", b'{"sessionId":"s","message":' + message + b"}"
    )
    assert again.get("result") == {"line": 0, "appended": False}, again
    capped = await client.call("session.get", sessionId="s", displayCap=40)
    assert capped["messages"][0]["capped"] is True  # a display copy: valid JSON, shortened
    # Rebuilt from the transcript at the next start: read as a message, not quarantined.
    assert await host.stop() == 0
    for index in data_dir.glob("index.sqlite3*"):
        index.unlink()
    client = await boot_client(start_host)
    assert await get_messages(client, "s") == [_text(message)]
    assert not (data_dir / "sessions" / "s.jsonl.quarantine").exists()
    code, out, err = await run_cli("verify", "--data-dir", str(data_dir))
    assert code == 0, out + err
    # The read-only tools show a half pair as U+FFFD (a terminal takes no lone surrogate).
    for args in (("inspect", "s"), ("export", "s", "--format", "markdown")):
        code, out, err = await run_view(args[0], "--data-dir", str(data_dir), *args[1:])
        assert code == 0 and "\ufffd" in out and "Traceback" not in err, out + err


async def boot_client(start_host: StartHost) -> Client:
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    return host.client


@pytest.mark.parametrize("size", [0, 100_000], ids=["small", "split"])
async def test_a_streaming_reply_cut_mid_emoji_is_checkpointed_and_promoted(
    client: Client, data_dir: Path, size: int
) -> None:
    """The likeliest way one arrives: a snapshot of a reply streaming an emoji."""
    await client.call("session.create", sessionId="s")
    await client.call(
        "session.beginTurn", sessionId="s", turnId="t1", prompt={"id": "u1", "role": "user"}
    )
    snapshot = b'{"id":"a1","role":"assistant","content":"%s\\ud83d"}' % (b"x" * size)
    saved = await _call_raw(
        client,
        "session.saveInflightMessage",
        b'{"sessionId":"s","turnId":"t1","message":' + snapshot + b"}",
    )
    assert saved.get("result") == {"saved": True}, saved
    ended = await client.call(
        "session.endTurn", sessionId="s", turnId="t1", status="aborted", recoverInflight=True
    )
    assert ended == {"status": "aborted", "recovered": True}
    (line,) = transcript(data_dir, "s").read_bytes().splitlines()[1:]
    assert line == snapshot[:-1] + b',"status":"aborted","turnId":"t1"}'
    assert (await get_messages(client, "s"))[1]["content"] == "x" * size + "\ud83d"


async def test_outside_a_message_a_lone_surrogate_is_refused_with_the_requests_id(
    client: Client, data_dir: Path
) -> None:
    """Only a message's values are kept as bytes; a string the host keeps as text (a
    title, a top-level key of a message, an id) cannot hold half a pair: it is refused
    with the request's own id, and nothing is written."""
    await client.call("session.create", sessionId="s")
    for method, params in (
        ("session.create", b'{"sessionId":"t","title":"Trip \\ud83d"}'),
        (
            "session.appendMessage",
            b'{"sessionId":"s","message":{"id":"a1","role":"user","\\ud83d":1}}',
        ),
        ("session.appendMessage", b'{"sessionId":"s","message":{"id":"a\\ud83d","role":"user"}}'),
    ):
        res = await _call_raw(client, method, params)
        assert res["error"]["data"]["code"] == "INVALID_PARAMS", res
    assert transcript(data_dir, "s").read_bytes() == b""
    assert [r["sessionId"] for r in (await client.call("session.list"))["sessions"]] == ["s"]
    # In the envelope: its method is INVALID_REQUEST; an id that cannot be echoed, id null.
    bad = await client.raw(b'{"jsonrpc":"2.0","id":7,"method":"session.li\\ud83dst"}', 7)
    assert bad["error"]["data"]["code"] == "INVALID_REQUEST"
    bad = await client.raw(b'{"jsonrpc":"2.0","id":"x\\ud83d","method":"session.list"}')
    assert (bad["id"], bad["error"]["data"]["code"]) == (None, "INVALID_REQUEST")


async def test_a_batch_holding_a_lone_surrogate_is_served_as_one(
    client: Client, data_dir: Path
) -> None:
    """Found by the producer side's review (issue 36): a batch line whose element held half
    a surrogate pair was refused whole as ``LIMIT_EXCEEDED`` (over 1,024 elements) with
    ``id: null``, though the same request alone was stored. The outbox drains in batches,
    so such a row blocked its session's drain for good."""
    await client.call("session.create", sessionId="s")
    rid = client.next_id()
    element = b'{"jsonrpc":"2.0","id":%d,"method":"session.appendMessage","params":' % rid
    element += b'{"sessionId":"s","message":' + ODD + b"}}"
    answer = client.expect_batch([rid])
    stray = asyncio.ensure_future(client.next_unmatched())
    await client.send_raw(b"[" + element + b"]\n")
    done, _ = await asyncio.wait({answer, stray}, timeout=WAIT, return_when="FIRST_COMPLETED")
    stray.cancel()
    assert answer in done, f"the batch was refused: {stray.result()}"
    assert answer.result() == [
        {"jsonrpc": "2.0", "id": rid, "result": {"line": 0, "appended": True}}
    ]
    assert transcript(data_dir, "s").read_bytes() == ODD + b"\n"
