"""The host client: handshake, deadlines with ``$/cancelRequest``, HostGone, big backlogs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from outbox import CallTimeout, ClientError, HostClient, HostGone, Outbox, RemoteError
from tests.outbox.kit import spawned, stored_ids, until


class PipeWriter:
    """The client's sending side at the transport edge: keeps every line it was given."""

    def __init__(self) -> None:
        self.lines: list[Any] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.lines.extend(json.loads(line) for line in data.splitlines())  # a batch: a list

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


def answer(rid: int, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode() + b"\n"


async def test_handshake_speaks_protocol_11(tmp_path: Path) -> None:
    async with spawned(tmp_path / "host") as client:
        result = await client.handshake()
        assert result["protocolVersion"] == 11
        assert "session.appendMessage" in result["methods"]


async def test_a_call_past_its_deadline_is_cancelled_and_raises_call_timeout() -> None:
    reader, writer = asyncio.StreamReader(), PipeWriter()
    client = HostClient(reader, writer, deadline=0.05)  # type: ignore[arg-type]
    with pytest.raises(CallTimeout, match="no answer within its deadline"):
        await client.call("session.get", {"sessionId": "s"})
    request, cancel = writer.lines
    assert request["method"] == "session.get"
    assert cancel == {
        "jsonrpc": "2.0",
        "method": "$/cancelRequest",
        "params": {"id": request["id"]},
    }

    # The late answer is ignored; the next call still gets its own answer.
    reader.feed_data(answer(request["id"], {"messages": ["late"]}))
    later = asyncio.create_task(client.call("session.list", timeout=10.0))
    await until(lambda: len(writer.lines) == 3, "the next request to be sent")
    reader.feed_data(answer(writer.lines[2]["id"], {"sessions": []}))
    assert await later == {"sessions": []}
    reader.feed_eof()
    await client.close()


async def test_a_timed_out_call_leaves_the_real_host_connection_usable(tmp_path: Path) -> None:
    async with spawned(tmp_path / "host") as client:
        assert client.proc is not None
        await client.call("session.create", {"sessionId": "s"})
        os.kill(client.proc.pid, signal.SIGSTOP)  # the host cannot answer before the deadline
        try:
            with pytest.raises(CallTimeout):
                await client.call("session.get", {"sessionId": "s"}, timeout=0.1)
        finally:
            os.kill(client.proc.pid, signal.SIGCONT)
        page = await client.call("session.get", {"sessionId": "s"}, timeout=10.0)
        assert page["messages"] == []
        with pytest.raises(RemoteError) as err:
            await client.call("session.get", {"sessionId": "nope"})
        assert err.value.name == "NOT_FOUND"


async def test_pending_calls_fail_with_host_gone_when_the_host_is_killed(tmp_path: Path) -> None:
    async with spawned(tmp_path / "host") as client:
        assert client.proc is not None
        await client.call("session.create", {"sessionId": "s"})
        os.kill(client.proc.pid, signal.SIGSTOP)  # nothing is answered from now on
        pending = [
            asyncio.create_task(client.call("session.get", {"sessionId": "s"})),
            asyncio.create_task(client.batch([("session.list", {}), ("session.list", {})])),
        ]
        client.kill()
        for task in pending:
            with pytest.raises(HostGone):
                await task
        assert client.gone.is_set()
        with pytest.raises(HostGone):
            await client.call("session.list")


async def test_rows_enqueued_while_the_host_is_dead_reach_the_next_host(tmp_path: Path) -> None:
    async with Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box:
        async with spawned(tmp_path / "host") as first:
            await first.call("session.create", {"sessionId": "s"})
            box.attach(first)
            await box.enqueue("s", {"id": "m0", "role": "user", "content": "before"}, None)
            await box.drain(10.0)
            first.kill()
            await until(first.gone.is_set, "the client to see the host die")
            await box.enqueue("s", {"id": "m1", "role": "assistant", "content": "while dead"})
        assert box.depth == 1
        async with spawned(tmp_path / "host") as second:
            box.attach(second)
            await box.drain(10.0)
            assert await stored_ids(second, "s") == ["m0", "m1"]


async def test_a_backlog_of_big_rows_over_the_line_limit_still_drains(tmp_path: Path) -> None:
    big = "x" * 1_000_000
    async with Outbox.open(str(tmp_path / "app" / "outbox.jsonl")) as box:
        for i in range(70):  # 70 MB of tool output: more than one 64 MiB request line
            await box.enqueue("s", {"id": f"c{i}", "role": "tool", "content": big}, None)
        # A deadline, so that a batch the host could never answer fails in seconds, not 130 s.
        async with spawned(tmp_path / "host", deadline=5.0) as client:
            await client.call("session.create", {"sessionId": "s"})
            box.attach(client)
            await box.drain(20.0)
            page = await client.call("session.get", {"sessionId": "s", "limit": 0})
            assert page["totalLines"] == 70  # (all 70 MB at once would be over the limit)


async def test_a_batch_past_its_deadline_cancels_every_call_in_it() -> None:
    reader, writer = asyncio.StreamReader(), PipeWriter()
    client = HostClient(reader, writer, deadline=0.05)  # type: ignore[arg-type]
    calls = [
        ("session.appendMessage", {"sessionId": "s", "message": {"id": f"m{i}"}}) for i in range(3)
    ]
    try:
        with pytest.raises(CallTimeout):
            await client.batch(calls)
        batch, *rest = writer.lines
        cancelled = [line["params"]["id"] for line in rest if line["method"] == "$/cancelRequest"]
        assert sorted(cancelled) == sorted(item["id"] for item in batch)
    finally:
        reader.feed_eof()
        await client.close()


async def test_an_answer_this_client_cannot_read_fails_its_call_at_once() -> None:
    reader, writer = asyncio.StreamReader(), PipeWriter()
    client = HostClient(reader, writer, deadline=600.0)  # type: ignore[arg-type]
    call = asyncio.create_task(client.call("session.get", {"sessionId": "s"}))
    await until(lambda: len(writer.lines) == 1, "the request to be sent")
    rid = writer.lines[0]["id"]
    reader.feed_data(b'{"jsonrpc":"2.0","id":%d,"result":{"v":1e999}}\n' % rid)
    with pytest.raises(ClientError, match="cannot be read"):
        await asyncio.wait_for(call, 10.0)  # not the 600 s deadline
    reader.feed_eof()
    await client.close()


async def test_find_and_organise_through_the_client(tmp_path: Path) -> None:
    """issue 35: HostClient's search, paged list, update and fork against the real host."""
    async with spawned(tmp_path / "host") as client:
        for i in range(3):
            await client.call("session.create", {"sessionId": f"s{i}"})
            row = {"id": f"m{i}", "role": "user", "content": f"notes on lighthouses {i}"}
            await client.call("session.appendMessage", {"sessionId": f"s{i}", "message": row})
        found = await client.search("lighthouse", limit=2)
        assert len(found["hits"]) == 2 and "cursor" in found
        rest = await client.search("lighthouse", cursor=found["cursor"])
        assert len(rest["hits"]) == 1
        got = await client.update_session("s1", title="Lights", meta={"pinned": True})
        assert got["meta"] == {"pinned": True}
        rows = [r async for r in client.list_sessions(limit=1, pinnedFirst=True)]
        listed = [r["sessionId"] for r in rows]
        assert listed[0] == "s1" and sorted(listed) == ["s0", "s1", "s2"]
        assert [r["meta"] for r in rows] == [{"pinned": True}, None, None]
        assert all(r["createdAt"][:2] == "20" and r["createdAt"][10] == "T" for r in rows)
        forked = await client.fork_session("s2", "m2", "copy")
        assert forked == {"sessionId": "copy", "created": True, "messageCount": 1}
