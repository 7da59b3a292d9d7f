"""The 64 MiB limits: a request line over it is read through, a result over it is refused.

These are the expensive tests: big lines are streamed from one reused 1 MiB chunk, and
the big transcript is written straight into the data dir before the host starts (the
host indexes it at start), so no 34 MB message has to cross the protocol to be stored.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from tests.conftest import (
    MAX_LINE,
    Client,
    HostProcess,
    StartHost,
    dumps,
    everything,
    transcript,
)

MiB = 1 << 20
CHUNK = b"a" * MiB


def _padded_request(rid: int, size: int) -> list[bytes]:
    """Chunks of one ``session.get`` request line of exactly ``size`` bytes (no newline).

    The pad is an unknown param, so a line the host reads whole is INVALID_PARAMS.
    """
    head = (
        b'{"jsonrpc":"2.0","id":%d,"method":"session.get","params":{"sessionId":"s","pad":"' % rid
    )
    tail = b'"}}'
    pad = size - len(head) - len(tail)
    chunks = [head, *([CHUNK] * (pad // MiB)), CHUNK[: pad % MiB], tail]
    assert sum(map(len, chunks)) == size
    return chunks


def _memory_mb(pid: int) -> dict[str, float]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith("Vm"))
    return {k: int(v.split()[0]) / 1024 for k, v in fields.items() if k in ("VmHWM", "VmRSS")}


async def test_a_line_over_64_mib_is_read_through_with_bounded_memory(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message={"id": "a", "role": "user"})
    before = await everything(client, data_dir)
    base = _memory_mb(host.pid)["VmHWM"]
    size = 2 * MAX_LINE  # 128 MiB: holding it whole would show in the high-water mark
    await client.send_chunks([*_padded_request(1, size), b"\n"])
    reply = await client.next_unmatched()
    assert reply["id"] is None
    assert reply["error"]["code"] == -32003
    assert reply["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    # The reader lives on: the next line is served.
    assert (await client.call("session.get", sessionId="s"))["totalLines"] == 1
    peak = _memory_mb(host.pid)["VmHWM"]
    assert peak < 200, f"host peak RSS {peak:.0f} MB for a {size / MiB:.0f} MiB line"
    assert peak - base < 100, f"host grew {peak - base:.0f} MB reading a {size / MiB:.0f} MiB line"
    assert await everything(client, data_dir) == before


async def test_the_limit_is_exactly_64_mib(host: HostProcess, client: Client) -> None:
    await client.call("session.create", sessionId="s")
    # A line of exactly 67,108,864 bytes is read and parsed (its unknown param is INVALID_PARAMS)
    at_limit = client.expect(1)
    await client.send_chunks([*_padded_request(1, MAX_LINE), b"\n"])
    assert (await client.wait(at_limit))["error"]["data"]["code"] == "INVALID_PARAMS"
    # One byte more is over: LIMIT_EXCEEDED with id null (the id was never read), and the
    # request right behind it in the same write is served.
    nxt = client.expect(3)
    tail = b"\n" + dumps(client.envelope("session.list", {}, 3)) + b"\n"
    await client.send_chunks([*_padded_request(2, MAX_LINE + 1), tail])
    over = await client.next_unmatched()
    assert over["id"] is None and over["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    assert (await client.wait(nxt))["result"]["sessions"][0]["sessionId"] == "s"


async def test_an_unterminated_oversized_last_line_is_answered_too(host: HostProcess) -> None:
    c = host.client
    assert c is not None
    await c.handshake()
    await c.send_chunks(_padded_request(1, MAX_LINE + 10))
    await c.close_input()
    assert (await c.next_unmatched())["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    assert await host.wait() == 0


# -- results --------------------------------------------------------------------------

BIG = 34_000_000  # two of these are over 64 MiB, one is well under


def _write_big_session(data: Path) -> list[bytes]:
    """Write session "big" (two ~34 MB messages and a small one) straight to disk."""
    (data / "sessions").mkdir(parents=True, mode=0o700)
    lines = [
        b'{"id":"big1","role":"tool","content":"' + b"x" * BIG + b'"}',
        b'{"id":"big2","role":"tool","content":"' + b"y" * BIG + b'"}',
        b'{"id":"small","role":"user","content":"hi"}',
    ]
    with open(transcript(data, "big"), "wb") as f:
        for line in lines:
            f.write(line)
            f.write(b"\n")
    return lines


async def _big_host(start_host: StartHost, data_dir: Path) -> Client:
    _write_big_session(data_dir)
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    return host.client


async def test_a_result_over_64_mib_is_limit_exceeded_and_paging_works(
    start_host: StartHost, data_dir: Path
) -> None:
    client = await _big_host(start_host, data_dir)
    before = await everything(client, data_dir)
    resp = await client.request("session.get", {"sessionId": "big"})
    assert resp["error"]["code"] == -32003
    assert resp["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    resp = await client.request("session.get", {"sessionId": "big", "beforeLine": 2})
    assert resp["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    # Nothing was sent that was over the limit, and nothing changed.
    assert client.longest_line <= MAX_LINE
    assert await everything(client, data_dir) == before
    # Paging is the way through: one big message at a time.
    page = await client.call("session.get", sessionId="big", beforeLine=2, limit=1)
    assert (page["startLine"], page["endLine"], page["totalLines"]) == (1, 2, 3)
    (big2,) = page["messages"]
    assert big2["id"] == "big2" and len(big2["content"]) == BIG
    small = await client.call("session.get", sessionId="big", limit=1)
    assert [m["id"] for m in small["messages"]] == ["small"]
    assert client.longest_line <= MAX_LINE
    # In a batch, each answer fits on its own but together they do not: the batch reply
    # stays within 64 MiB, one of them giving way to LIMIT_EXCEEDED.
    c = client
    out = await c.batch(
        [
            c.envelope("session.get", {"sessionId": "big", "beforeLine": 1, "limit": 1}, 1),
            c.envelope("session.get", {"sessionId": "big", "beforeLine": 2, "limit": 1}, 2),
        ]
    )
    assert {r["id"] for r in out} == {1, 2}
    assert c.longest_line <= MAX_LINE
    errors = [r for r in out if "error" in r]
    assert [e["error"]["data"]["code"] for e in errors] == ["LIMIT_EXCEEDED"]
    (ok,) = [r for r in out if "result" in r]
    assert len(ok["result"]["messages"][0]["content"]) == BIG
    assert await everything(client, data_dir) == before


async def test_display_capped_page_of_big_messages_fits(
    start_host: StartHost, data_dir: Path
) -> None:
    client = await _big_host(start_host, data_dir)
    page = await client.call("session.get", sessionId="big", displayCap=1000)
    assert [m["id"] for m in page["messages"]] == ["big1", "big2", "small"]
    assert page["messages"][0]["capped"] is True
    compact = [json.dumps(m, separators=(",", ":"), ensure_ascii=False) for m in page["messages"]]
    assert all(len(line.encode()) <= 1000 for line in compact)


# -- a message near the limit ---------------------------------------------------------

MAX_MESSAGE = MAX_LINE - 4096  # docs/protocol.md: the room kept for the host's own fields
ROOT = "u" * 128  # the longest root id: the longest pager stamp


def _message_chunks(size: int, mid: str = ROOT) -> list[bytes]:
    """Chunks of one user message of exactly ``size`` bytes as sent."""
    head = b'{"id":"%s","role":"user","content":"' % mid.encode()
    tail = b'"}'
    pad = size - len(head) - len(tail)
    return [head, *([CHUNK] * (pad // MiB)), CHUNK[: pad % MiB], tail]


async def _append_big(c: Client, rid: int, message: list[bytes]) -> dict[str, Any]:
    """Send ``session.appendMessage`` of the message in ``message``; return the response."""
    head = b'{"jsonrpc":"2.0","id":%d,"method":"session.appendMessage",' % rid
    head += b'"params":{"sessionId":"s","message":'
    answer = c.expect(rid)
    await c.send_chunks([head, *message, b"}}\n"])
    return await c.wait(answer)


async def _stamped_and_read(c: Client) -> dict[str, Any]:
    """Regenerate the root's reply (the host stamps the root), then read the root alone."""
    await c.call("session.appendMessage", sessionId="s", message={"id": "a1", "role": "assistant"})
    cut = await c.call("session.truncateFrom", sessionId="s", fromMessageId="a1")
    assert cut["pager"] == {"rootId": ROOT, "revisionCount": 2, "activeRevision": 1}
    return await c.request("session.get", {"sessionId": "s", "limit": 1})


async def test_a_message_accepted_stays_readable_once_stamped(client: Client) -> None:
    """Found at 650cc00 (issue 26, case 14): a user message accepted at the 64 MiB request
    limit became unreadable once the host stamped its pager fields (about 180 bytes):
    ``session.get {limit: 1}`` of that one line answered LIMIT_EXCEEDED, which no paging
    can help. A message may now hold 64 MiB less 4 KiB, room for every field the host
    adds; a longer one is refused with its own id, before anything is stored."""
    await client.call("session.create", sessionId="s")
    line = len(b'{"jsonrpc":"2.0","id":1,"method":"session.appendMessage","params":{}}')
    at_line_limit = MAX_LINE - line - len(b'"sessionId":"s","message":')
    resp = await _append_big(client, 1, _message_chunks(at_line_limit))
    if "result" in resp:  # whatever is accepted must stay readable, stamped
        page = await _stamped_and_read(client)
        assert "result" in page, page["error"]
    assert resp["error"]["data"] == {"code": "LIMIT_EXCEEDED", "limit": MAX_MESSAGE}
    assert (await client.call("session.get", sessionId="s"))["totalLines"] == 0
    over = await _append_big(client, 2, _message_chunks(MAX_MESSAGE + 1))
    assert over["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    assert (await _append_big(client, 3, _message_chunks(MAX_MESSAGE)))["result"]["line"] == 0
    page = await _stamped_and_read(client)
    (root,) = page["result"]["messages"]
    assert root["id"] == ROOT and root["revisionCount"] == 2
    assert len(root["content"]) == MAX_MESSAGE - len(b'{"id":"","role":"user","content":""}') - 128
    assert client.longest_line <= MAX_LINE


# -- batches ------------------------------------------------------------------------------

MAX_BATCH = 1_024


async def test_a_batch_of_520_000_elements_is_refused_at_once_and_the_host_serves_on(
    start_host: StartHost, tmp_path: Path
) -> None:
    """A 1 MB line ``[1,1,...]`` used to spin the host for good: 520,000 errors of 143
    bytes, each "replaced" by a longer LIMIT_EXCEEDED (ADR-less bug, issue 26 case 1)."""
    host = await start_host(socket=tmp_path / "host.sock")
    hostile, other = await host.connect(), await host.connect()
    await hostile.handshake()
    await other.handshake()
    line = b"[" + b",".join([b"1"] * 520_000) + b"]"
    async with asyncio.timeout(10):  # one error, at once: not a spin, not a 74 MB answer
        reply = await hostile.raw(line)
    assert reply["id"] is None
    assert reply["error"]["code"] == -32003
    assert reply["error"]["data"] == {"code": "LIMIT_EXCEEDED", "limit": MAX_BATCH}
    # The host serves this connection and every other one, and stops on SIGTERM.
    assert (await hostile.call("session.list")) == {"sessions": []}
    assert (await other.call("session.create", sessionId="s"))["created"] is True
    host.proc.send_signal(signal.SIGTERM)
    assert await host.wait() == 0


async def test_a_batch_at_the_cap_is_served_and_one_more_element_is_refused(
    client: Client,
) -> None:
    await client.call("session.create", sessionId="s")
    at_cap = [client.envelope("session.list", {}, i) for i in range(MAX_BATCH)]
    out = await client.batch(at_cap)
    assert sorted(r["id"] for r in out) == list(range(MAX_BATCH))
    assert all(r["result"]["sessions"][0]["sessionId"] == "s" for r in out)
    over = [*at_cap, client.envelope("session.list", {}, MAX_BATCH)]
    reply = await client.raw(dumps(over))
    assert reply["id"] is None and reply["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    assert (await client.call("session.list"))["sessions"][0]["sessionId"] == "s"


async def test_a_batch_answer_that_errors_cannot_shrink_is_replaced_whole(client: Client) -> None:
    """1,000 calls whose ids fill the line: every answer carries its 67 KB id, so no error
    that replaces one is shorter than it. The answer must still fit (and come at all)."""
    n, k = 1_000, 67_040
    items = [client.envelope("no.such.method", None, f"{i:05d}" + "i" * (k - 5)) for i in range(n)]
    line = dumps(items)
    assert len(line) <= MAX_LINE  # the request fits; its answers together do not
    async with asyncio.timeout(20):
        reply = await client.raw(line)
    assert reply["id"] is None
    assert reply["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    assert "batch response over 64 MiB" in reply["error"]["message"]
    assert client.longest_line <= MAX_LINE
    assert (await client.call("session.list")) == {"sessions": []}
