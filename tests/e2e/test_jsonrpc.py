"""Full JSON-RPC 2.0 over NDJSON: batches, notifications, and every framing error.

Each bad line gets the error PROTOCOL.md names and leaves the data dir as it was.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.conftest import WAIT, Client, HostProcess, dumps, everything, make_session, msg


async def test_requests_pipelined_in_one_write_apply_in_arrival_order(client: Client) -> None:
    await client.call("session.create", sessionId="s")
    futs = []
    lines = []
    for i in range(50):
        rid = client.next_id()
        futs.append(client.expect(rid))
        params = {"sessionId": "s", "message": msg(f"m{i}")}
        lines.append(dumps(client.envelope("session.appendMessage", params, rid)) + b"\n")
    await client.send_raw(b"".join(lines))
    results = [(await client.wait(f))["result"] for f in futs]
    assert [r["line"] for r in results] == list(range(50))
    got = await client.call("session.get", sessionId="s")
    assert [m["id"] for m in got["messages"]] == [f"m{i}" for i in range(50)]


async def test_string_ids_are_echoed(client: Client) -> None:
    resp = await client.request("session.list", {}, rid="req-1")
    assert resp == {"jsonrpc": "2.0", "id": "req-1", "result": {"sessions": []}}


async def test_batch_answers_every_request_and_no_notification(client: Client) -> None:
    c = client
    out = await c.batch(
        [
            c.envelope("session.create", {"sessionId": "a"}, 1),
            c.envelope("session.create", {"sessionId": "b"}),  # notification
            c.envelope("session.appendMessage", {"sessionId": "a", "message": msg("x")}, "two"),
            c.envelope("no.such.method", {}, 3),
            c.envelope("session.get", {"sessionId": "a", "bogus": 1}, 4),
        ]
    )
    by_id = {r["id"]: r for r in out}
    assert len(out) == 4 and set(by_id) == {1, "two", 3, 4}
    assert by_id[1]["result"] == {"sessionId": "a", "created": True}
    assert by_id["two"]["result"] == {"line": 0, "appended": True}
    assert by_id[3]["error"]["code"] == -32601
    assert by_id[4]["error"]["code"] == -32602
    # The notification ran too (a get on "b" queues behind it on the session's lock).
    assert (await c.call("session.get", sessionId="b"))["totalLines"] == 0


async def test_a_batch_of_only_notifications_gets_no_reply(host: HostProcess) -> None:
    c = host.client
    assert c is not None
    await c.handshake()
    items = [c.envelope("session.create", {"sessionId": f"n{i}"}) for i in range(3)]
    await c.send_raw(dumps(items) + b"\n")
    for i in range(3):  # each get queues behind its create on the session's lock
        assert (await c.call("session.get", sessionId=f"n{i}"))["totalLines"] == 0
    await _assert_nothing_else_came(host)


async def test_notifications_get_no_reply_even_when_they_fail(host: HostProcess) -> None:
    c = host.client
    assert c is not None
    await c.notify("handshake", protocolVersion=11)
    await c.notify("session.create", sessionId="quiet")
    await c.notify("session.appendMessage", sessionId="quiet", message=msg("q"))
    await c.notify("no.such.method")
    await c.notify("session.get", sessionId="../escape")
    await c.notify("session.get", sessionId="missing")
    got = await c.call("session.get", sessionId="quiet")  # the notified handshake counted
    assert [m["id"] for m in got["messages"]] == ["q"]
    await _assert_nothing_else_came(host)


async def _assert_nothing_else_came(host: HostProcess) -> None:
    """End the input, read every line the host still sends, and expect none unasked."""
    assert host.client is not None
    assert await host.stop() == 0
    assert host.client.unmatched == []
    assert host.client.garbage == []


PARSE_ERRORS = [
    b"{not json",
    b'{"jsonrpc": "2.0", "id": 1, "method": "session.list"',
    b'{"jsonrpc": "2.0", "id": 1, "method": "session.list", "params": {}}}',
    b"nul",
    # Invalid UTF-8, inside a string and as a bare byte:
    b'{"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": {"title": "caf\xc3\x28"}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "session.list", "params": {}}\xff',
    b"\xef\xbb\xbf\xff\xfe",
    b'[{"jsonrpc": "2.0", "id": 1, "method": "session.list"}, {bad]',
]


async def test_invalid_json_and_invalid_utf8_are_parse_errors(
    client: Client, data_dir: Path
) -> None:
    await make_session(client, "s", 2)
    before = await everything(client, data_dir)
    for line in PARSE_ERRORS:
        reply = await client.raw(line)
        assert reply["id"] is None, line
        assert reply["error"]["code"] == -32700, line
        assert reply["error"]["data"]["code"] == "PARSE_ERROR"
    assert await everything(client, data_dir) == before
    assert (await client.call("session.list"))["sessions"][0]["messageCount"] == 2


NOT_REQUESTS: list[tuple[Any, Any]] = [
    ({"id": 5, "method": "session.list", "params": {}}, 5),  # no "jsonrpc"
    ({"jsonrpc": "1.0", "id": 6, "method": "session.list", "params": {}}, 6),
    ({"jsonrpc": 2.0, "id": 7, "method": "session.list", "params": {}}, 7),
    ({"jsonrpc": "2.0", "id": 8}, 8),  # no method
    ({"jsonrpc": "2.0", "id": 9, "method": 42}, 9),
    ({"jsonrpc": "2.0", "id": [1], "method": "session.list"}, None),
    ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "session.list"}, None),
    (42, None),
    ("session.list", None),
    (None, None),
]


async def test_not_a_request_object_is_invalid_request(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 1)
    before = await everything(client, data_dir)
    for request_, rid in NOT_REQUESTS:
        reply = await client.raw(dumps(request_), rid)
        assert reply["id"] == rid, request_
        assert reply["error"]["code"] == -32600, request_
        assert reply["error"]["data"]["code"] == "INVALID_REQUEST"
    assert await everything(client, data_dir) == before


async def test_empty_batch_is_invalid_request(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 1)
    before = await everything(client, data_dir)
    reply = await client.raw(b"[]")
    assert reply["id"] is None and reply["error"]["code"] == -32600
    assert await everything(client, data_dir) == before


async def test_bad_items_of_a_batch_get_their_own_errors(client: Client) -> None:
    c = client
    fut = c.expect_batch([1, 2])
    await c.send_raw(
        dumps([1, {"id": 2, "method": "session.list"}, c.envelope("session.list", {}, 1)]) + b"\n"
    )
    out = await c.wait(fut)
    assert len(out) == 3
    errors = [r for r in out if "error" in r]
    assert [e["error"]["code"] for e in errors] == [-32600, -32600]
    assert {e["id"] for e in errors} == {None, 2}
    assert [r["result"] for r in out if r.get("id") == 1] == [{"sessions": []}]


async def test_unknown_method_is_method_not_found(client: Client) -> None:
    resp = await client.request("session.frobnicate", {"sessionId": "s"})
    assert resp["error"]["code"] == -32601
    assert resp["error"]["data"]["code"] == "METHOD_NOT_FOUND"


BAD_PARAMS: list[tuple[str, dict[str, Any]]] = [
    ("session.create", {"sessionId": 5}),
    ("session.create", {"title": 5}),
    ("session.get", {"sessionId": "s", "limit": "3"}),
    ("session.get", {"sessionId": "s", "limit": -1}),
    ("session.get", {"sessionId": "s", "beforeLine": 1.5}),
    ("session.get", {"sessionId": "s", "displayCap": 0}),
    ("session.get", {}),  # missing sessionId
    ("session.get", {"sessionId": "s", "bogus": True}),  # unknown param
    ("session.list", {"extra": 1}),
    ("host.stats", {"verbose": True}),
    ("session.appendMessage", {"sessionId": "s"}),
    ("session.appendMessage", {"sessionId": "s", "message": "hello"}),
    ("session.appendMessage", {"sessionId": "s", "message": {"id": "m9"}}),  # no role
    ("session.appendMessage", {"sessionId": "s", "message": {"id": "m9", "role": "bot"}}),
    ("session.appendMessage", {"sessionId": "s", "message": {"role": "user"}}),  # no id
    (
        "session.appendMessage",
        {"sessionId": "s", "message": {"id": "m9", "role": "user", "status": "done"}},
    ),
    (
        "session.appendMessage",
        {"sessionId": "s", "message": {"id": "m9", "role": "user", "turnId": "a/b"}},
    ),
    ("session.appendMessage", {"sessionId": "s", "message": msg("m9"), "turnId": 3}),
    ("session.deleteMessages", {"sessionId": "s", "messageIds": "m0"}),
    ("session.replaceMessages", {"sessionId": "s", "messages": {"id": "m0"}}),
    ("session.replaceMessages", {"sessionId": "s", "messages": [msg("m0"), {"id": "x"}]}),
    ("handshake", {"protocolVersion": 11, "clientName": "x"}),
]


async def test_wrong_or_unknown_params_are_invalid_params(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 2)
    before = await everything(client, data_dir)
    for method, params in BAD_PARAMS:
        resp = await client.request(method, params)
        assert resp["error"]["code"] == -32602, (method, params, resp)
        assert resp["error"]["data"]["code"] == "INVALID_PARAMS"
    assert await everything(client, data_dir) == before


async def test_params_that_are_not_an_object_are_invalid_params(client: Client) -> None:
    for params in ["[1, 2]", "[]", '"s"', "null", "7", "true"]:
        line = f'{{"jsonrpc": "2.0", "id": 1, "method": "session.list", "params": {params}}}'
        resp = await client.raw(line.encode(), 1)
        assert resp["error"]["code"] == -32602, params


async def test_the_connection_lives_on_after_every_kind_of_error(client: Client) -> None:
    for line in (b"{", b"[]", b"42", b'{"id": 1}', b"\xff\xfe"):
        await client.raw(line, 1 if b'"id"' in line else None)
    resp = await client.request("no.such", {})
    assert resp["error"]["code"] == -32601
    assert (await client.call("session.list")) == {"sessions": []}


async def test_blank_lines_between_messages_are_ignored(host: HostProcess) -> None:
    c = host.client
    assert c is not None
    await c.handshake()
    fut = c.expect(1)
    await c.send_raw(b"\n\n   \n" + dumps(c.envelope("session.list", {}, 1)) + b"\n\n")
    assert (await c.wait(fut))["result"] == {"sessions": []}
    await _assert_nothing_else_came(host)


async def test_cancel_request_as_a_request_is_answered_null(client: Client) -> None:
    resp = await client.request("$/cancelRequest", {"id": 12345})
    assert resp["result"] is None


# Found at 09c70a8: bad params were answered null, as if the cancel had been taken.
async def test_cancel_request_with_bad_params_is_invalid_params(client: Client) -> None:
    for params in ({}, {"id": 17.5}, {"id": 1, "extra": 2}):
        resp = await client.request("$/cancelRequest", params)
        assert resp["error"]["code"] == -32602, resp
    await client.notify("$/cancelRequest", id=17.5)  # a notification: still no reply
    assert (await client.request("$/cancelRequest", {"id": 1}))["result"] is None
    assert client.unmatched == []


async def test_a_batch_element_nested_past_the_decoder_is_answered_with_its_id(
    client: Client,
) -> None:
    """An element its decoder cannot read (nested past CPython's frames, though the batch
    around it decoded) was answered ``PARSE_ERROR`` with ``id: null``: a client could not
    tell which call failed, and the outbox's batch waited out its deadline. Its id comes
    first: it is answered with it. The depth where that happens depends on the host's
    stack, so it is found: deeper and deeper until an element is refused."""
    await client.call("session.create", sessionId="s")
    for depth in range(960, 1000):
        rid = client.next_id()
        deep = b"[" * depth + b"]" * depth
        element = (
            b'{"jsonrpc":"2.0","id":%d,"method":"session.appendMessage","params":'
            b'{"sessionId":"s","message":{"id":"m%d","role":"tool","n":%s}}}' % (rid, rid, deep)
        )
        answer = client.expect_batch([rid])
        stray = asyncio.ensure_future(client.next_unmatched())
        await client.send_raw(b"[" + element + b"]\n")
        done, _ = await asyncio.wait({answer, stray}, timeout=WAIT, return_when="FIRST_COMPLETED")
        stray.cancel()
        assert answer in done, f"depth {depth}: answered without its id: {stray.result()}"
        (got,) = answer.result()
        if "error" in got:
            assert got["error"]["data"]["code"] == "PARSE_ERROR", got
            return
    raise AssertionError("no element was refused up to 1,000 levels")
