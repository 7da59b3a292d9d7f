"""session.appendMessage: durable lines, the caller's bytes, at-least-once delivery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Client, RpcError, everything, msg, transcript


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return data.split(b"\n")[:-1]


async def test_appends_are_numbered_lines_on_disk_before_the_answer(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    for i in range(3):
        res = await client.call("session.appendMessage", sessionId="s", message=msg(f"m{i}"))
        assert res == {"line": i, "appended": True}
        # The answer came, so the line is in the file.
        assert [json.loads(b)["id"] for b in _lines(transcript(data_dir, "s"))] == [
            f"m{j}" for j in range(i + 1)
        ]
    (row,) = (await client.call("session.list"))["sessions"]
    assert row["messageCount"] == 3


async def test_the_callers_bytes_are_stored_and_returned(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    message = (
        b'{"id":"m1","role":"assistant","content":"caf\\u00e9 \\ud83d\\ude00 \xe2\x82\xac",'
        b'"n":1.50,"big":12345678901234567890123,"e":1E+3,'
        b'"nested":{"b": 1, "a": [ true , null ]},"createdAt":"2024-01-01T00:00:00.000Z"}'
    )
    line = (
        b'{"jsonrpc":"2.0","id":1,"method":"session.appendMessage",'
        b'"params":{"sessionId":"s","message":' + message + b"}}"
    )
    resp = await client.raw(line, 1)
    assert resp["result"] == {"line": 0, "appended": True}
    (stored,) = _lines(transcript(data_dir, "s"))
    for value in (
        b'"content":"caf\\u00e9 \\ud83d\\ude00 \xe2\x82\xac"',
        b'"n":1.50',
        b'"big":12345678901234567890123',
        b'"e":1E+3',
        b'"nested":{"b": 1, "a": [ true , null ]}',
        b'"createdAt":"2024-01-01T00:00:00.000Z"',
    ):
        assert value in stored
    assert json.loads(stored) == json.loads(message)
    (got,) = (await client.call("session.get", sessionId="s"))["messages"]
    assert got == json.loads(message)


async def test_an_id_already_stored_is_not_appended_again(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"))
    await client.call("session.appendMessage", sessionId="s", message=msg("b"))
    before = await everything(client, data_dir)
    for again in (msg("a"), msg("a", "assistant", "a different body")):
        res = await client.call("session.appendMessage", sessionId="s", message=again)
        assert res == {"line": 0, "appended": False}
    assert await everything(client, data_dir) == before
    res = await client.call("session.appendMessage", sessionId="s", message=msg("c"))
    assert res == {"line": 2, "appended": True}


async def test_turn_id_comes_from_the_call_else_from_the_message(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"), turnId="t-call")
    await client.call("session.appendMessage", sessionId="s", message=msg("b", turnId="t-msg"))
    await client.call(
        "session.appendMessage", sessionId="s", message=msg("c", turnId="t-msg"), turnId="t-call"
    )
    await client.call("session.appendMessage", sessionId="s", message=msg("d"))
    stored = [json.loads(b) for b in _lines(transcript(data_dir, "s"))]
    assert [m.get("turnId") for m in stored] == ["t-call", "t-msg", "t-call", None]
    got = (await client.call("session.get", sessionId="s"))["messages"]
    assert [m.get("turnId") for m in got] == ["t-call", "t-msg", "t-call", None]


async def test_pager_fields_sent_by_a_caller_are_ignored(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    sneaky = msg("u", revisionRootId="u", revisionCount=7, activeRevision=3)
    await client.call("session.appendMessage", sessionId="s", message=sneaky)
    (stored,) = [json.loads(b) for b in _lines(transcript(data_dir, "s"))]
    assert stored == msg("u")


async def test_status_is_kept(client: Client) -> None:
    await client.call("session.create", sessionId="s")
    sent = [msg(status, "assistant", status=status) for status in ("complete", "aborted", "error")]
    for m in sent:
        await client.call("session.appendMessage", sessionId="s", message=m)
    assert (await client.call("session.get", sessionId="s"))["messages"] == sent


async def test_every_role_can_be_appended(client: Client) -> None:
    await client.call("session.create", sessionId="s")
    for role in ("system", "user", "assistant", "tool"):
        await client.call("session.appendMessage", sessionId="s", message=msg(role, role))
    got = (await client.call("session.get", sessionId="s"))["messages"]
    assert [m["role"] for m in got] == ["system", "user", "assistant", "tool"]


async def test_an_explicit_capped_false_is_an_ordinary_message(client: Client) -> None:
    await client.call("session.create", sessionId="s")
    m = msg("a", capped=False)
    assert (await client.call("session.appendMessage", sessionId="s", message=m))["appended"]
    assert (await client.call("session.get", sessionId="s"))["messages"] == [m]


async def test_a_capped_message_is_conflict(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"))
    before = await everything(client, data_dir)
    with pytest.raises(RpcError) as err:
        await client.call("session.appendMessage", sessionId="s", message=msg("b", capped=True))
    assert (err.value.code, err.value.name) == (-32006, "CONFLICT")
    assert await everything(client, data_dir) == before


async def test_a_message_with_newlines_in_its_text_stays_one_line(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    m = msg("a", content="line one\nline two\r\n\u2028end")
    await client.call("session.appendMessage", sessionId="s", message=m)
    await client.call("session.appendMessage", sessionId="s", message=msg("b"))
    assert len(_lines(transcript(data_dir, "s"))) == 2
    assert (await client.call("session.get", sessionId="s"))["messages"][0] == m
