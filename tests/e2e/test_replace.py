"""session.replaceMessages: a whole-transcript rewrite that keeps surviving turnIds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Client, RpcError, everything, msg, transcript


def _stored(data: Path) -> list[dict[str, object]]:
    raw = transcript(data, "s").read_bytes()
    return [json.loads(b) for b in raw.split(b"\n")[:-1]]


async def test_replace_writes_exactly_the_new_list(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"), turnId="t1")
    await client.call("session.appendMessage", sessionId="s", message=msg("b"), turnId="t1")
    await client.call("session.appendMessage", sessionId="s", message=msg("c"), turnId="t2")
    new = [
        msg("c", content="c edited"),  # survives, moved first
        msg("x", "assistant"),  # new, no turn
        msg("y", "assistant", turnId="t9"),  # new, its own turn
        msg("a", turnId="t-caller"),  # survives: the stored turn wins
    ]
    res = await client.call("session.replaceMessages", sessionId="s", messages=new)
    assert res == {"count": 4}
    expected = [
        msg("c", content="c edited", turnId="t2"),
        msg("x", "assistant"),
        msg("y", "assistant", turnId="t9"),
        msg("a", turnId="t1"),
    ]
    assert _stored(data_dir) == expected
    assert (await client.call("session.get", sessionId="s"))["messages"] == expected
    # The index follows: "b" is gone (appendable again), "x" is stored (deduplicated).
    res = await client.call("session.appendMessage", sessionId="s", message=msg("b"))
    assert res == {"line": 4, "appended": True}
    res = await client.call("session.appendMessage", sessionId="s", message=msg("x"))
    assert res == {"line": 1, "appended": False}


async def test_replace_with_nothing_empties_the_transcript(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"))
    assert (await client.call("session.replaceMessages", sessionId="s", messages=[])) == {
        "count": 0
    }
    assert transcript(data_dir, "s").read_bytes() == b""
    assert (await client.call("session.list"))["sessions"][0]["messageCount"] == 0


async def test_duplicate_ids_are_invalid_params_and_change_nothing(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"))
    before = await everything(client, data_dir)
    with pytest.raises(RpcError) as err:
        await client.call(
            "session.replaceMessages",
            sessionId="s",
            messages=[msg("a"), msg("b"), msg("a", content="again")],
        )
    assert (err.value.code, err.value.name) == (-32602, "INVALID_PARAMS")
    assert await everything(client, data_dir) == before


async def test_replace_keeps_the_callers_bytes(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    line = (
        b'{"jsonrpc":"2.0","id":1,"method":"session.replaceMessages","params":{"sessionId":"s",'
        b'"messages":[{"id":"a","role":"user","content":"\\u00e9","n":2.50,"o":{"z": 1}}]}}'
    )
    assert (await client.raw(line, 1))["result"] == {"count": 1}
    stored = transcript(data_dir, "s").read_bytes()
    assert stored == b'{"id":"a","role":"user","content":"\\u00e9","n":2.50,"o":{"z": 1}}\n'
