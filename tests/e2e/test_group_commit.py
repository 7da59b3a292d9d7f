"""Group commit: appends queued on a session share one fsync, in arrival order."""

from __future__ import annotations

from tests.conftest import Client, dumps, get_messages, msg, transcript


async def _pipeline(client: Client, calls: list[tuple[str, dict[str, object]]]) -> list[dict]:
    """Send every call in one write, without waiting; return the responses in call order."""
    ids = [client.next_id() for _ in calls]
    futs = [client.expect(rid) for rid in ids]
    body = b"".join(
        dumps(client.envelope(m, p, rid)) + b"\n" for rid, (m, p) in zip(ids, calls, strict=True)
    )
    await client.send_raw(body)
    return [await client.wait(f) for f in futs]


async def test_pipelined_appends_share_fsyncs_and_keep_order(client: Client, data_dir) -> None:
    await client.call("session.create", sessionId="g")
    before = (await client.call("host.stats"))["counters"].get("fsyncs", 0)
    n = 300
    calls = [
        ("session.appendMessage", {"sessionId": "g", "message": msg(f"m{i}", "assistant", "x")})
        for i in range(n)
    ]
    replies = await _pipeline(client, calls)
    assert [r["result"] for r in replies] == [{"line": i, "appended": True} for i in range(n)]
    stats = (await client.call("host.stats"))["counters"]
    assert stats["fsyncs"] - before < n / 4  # far fewer fsyncs than rows, each still fsynced
    assert stats["appends.grouped"] > 0
    lines = transcript(data_dir, "g").read_bytes().splitlines()
    assert [dumps(msg(f"m{i}", "assistant", "x")) for i in range(n)] == lines


async def test_a_call_between_appends_is_never_jumped(client: Client) -> None:
    await client.call("session.create", sessionId="o")
    calls: list[tuple[str, dict[str, object]]] = [
        ("session.appendMessage", {"sessionId": "o", "message": msg("a1", "assistant", "v1")}),
        ("session.appendMessage", {"sessionId": "o", "message": msg("a2", "assistant", "v1")}),
        ("session.updateMessage", {"sessionId": "o", "message": msg("a1", "assistant", "v2")}),
        ("session.appendMessage", {"sessionId": "o", "message": msg("a3", "assistant", "v1")}),
        ("session.deleteMessages", {"sessionId": "o", "messageIds": ["a2"]}),
        ("session.appendMessage", {"sessionId": "o", "message": msg("a4", "assistant", "v1")}),
        ("session.appendMessage", {"sessionId": "o", "message": msg("a1", "assistant", "v3")}),
    ]
    replies = await _pipeline(client, calls)
    assert all("result" in r for r in replies), replies
    assert replies[-1]["result"]["appended"] is False  # a replay of a stored id
    got = await get_messages(client, "o")
    assert [(m["id"], m["content"]) for m in got] == [("a1", "v2"), ("a3", "v1"), ("a4", "v1")]


async def test_a_repeated_id_within_one_group_is_stored_once(client: Client) -> None:
    await client.call("session.create", sessionId="d")
    calls: list[tuple[str, dict[str, object]]] = [
        ("session.appendMessage", {"sessionId": "d", "message": msg(f"m{i % 3}", "assistant")})
        for i in range(9)
    ]
    replies = await _pipeline(client, calls)
    assert [r["result"]["appended"] for r in replies] == [True] * 3 + [False] * 6
    assert [r["result"]["line"] for r in replies] == [0, 1, 2] * 3
    assert [m["id"] for m in await get_messages(client, "d")] == ["m0", "m1", "m2"]
