"""session.updateMessage: exactly one line rewritten, every other line copied byte for byte."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import Client, RpcError, everything, make_session, msg, transcript


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data.split(b"\n")[:-1]


async def _session_with_odd_bytes(client: Client) -> None:
    """A session whose stored lines hold bytes a re-encoder would change."""
    await client.call("session.create", sessionId="s")
    for i in range(5):
        line = (
            b'{"jsonrpc":"2.0","id":%d,"method":"session.appendMessage","params":{"sessionId":"s",'
            b'"message":{"id":"m%d","role":"user","content":"caf\\u00e9 %d","n":1.50,'
            b'"x":{"k": [1 , 2]}}}}' % (100 + i, i, i)
        )
        assert (await client.raw(line, 100 + i))["result"]["line"] == i


@pytest.mark.parametrize("new_content", ["short", "a much longer replacement text " * 40])
async def test_update_rewrites_only_that_line(
    client: Client, data_dir: Path, new_content: str
) -> None:
    await _session_with_odd_bytes(client)
    path = transcript(data_dir, "s")
    before = _lines(path)
    res = await client.call(
        "session.updateMessage", sessionId="s", message=msg("m2", content=new_content)
    )
    assert res == {"line": 2}
    after = _lines(path)
    assert len(after) == 5
    assert after[:2] + after[3:] == before[:2] + before[3:]  # byte for byte
    assert json.loads(after[2]) == msg("m2", content=new_content)
    # Reads by page still find every line where it now is.
    got = (await client.call("session.get", sessionId="s", beforeLine=4, limit=2))["messages"]
    assert [m["id"] for m in got] == ["m2", "m3"]
    assert got[0]["content"] == new_content
    assert got[1] == json.loads(before[3])


async def test_update_keeps_the_stored_turn_id(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"), turnId="t1")
    await client.call("session.updateMessage", sessionId="s", message=msg("a", content="v2"))
    await client.call(
        "session.updateMessage", sessionId="s", message=msg("a", content="v3", turnId="t-other")
    )
    (stored,) = [json.loads(b) for b in _lines(transcript(data_dir, "s"))]
    assert stored == msg("a", content="v3", turnId="t1")


async def test_update_ignores_pager_fields_sent_by_the_caller(
    client: Client, data_dir: Path
) -> None:
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a"))
    sneaky = msg("a", content="v2", revisionRootId="a", revisionCount=4, activeRevision=1)
    await client.call("session.updateMessage", sessionId="s", message=sneaky)
    (stored,) = [json.loads(b) for b in _lines(transcript(data_dir, "s"))]
    assert stored == msg("a", content="v2")


async def test_update_of_an_unknown_message_is_not_found(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 3)
    before = await everything(client, data_dir)
    with pytest.raises(RpcError) as err:
        await client.call("session.updateMessage", sessionId="s", message=msg("nope"))
    assert (err.value.code, err.value.name) == (-32004, "NOT_FOUND")
    assert err.value.data["kind"] == "message"
    assert await everything(client, data_dir) == before


async def test_appends_after_an_update_go_to_the_new_file(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 3)
    path = transcript(data_dir, "s")
    ino = os.stat(path).st_ino
    await client.call("session.updateMessage", sessionId="s", message=msg("m0", content="new"))
    assert os.stat(path).st_ino != ino  # the rewrite replaced the file ...
    res = await client.call("session.appendMessage", sessionId="s", message=msg("m3"))
    assert res == {"line": 3, "appended": True}
    # ... and the append went into the file now at that path, not the old one.
    assert [json.loads(b)["id"] for b in _lines(path)] == ["m0", "m1", "m2", "m3"]
    assert json.loads(_lines(path)[0])["content"] == "new"
    assert not list((data_dir / "sessions").glob("*.tmp"))


async def test_an_update_that_changes_nothing_leaves_the_file_alone(
    client: Client, data_dir: Path
) -> None:
    sent = await make_session(client, "s", 2)
    path = transcript(data_dir, "s")
    st = os.stat(path)
    assert (await client.call("session.updateMessage", sessionId="s", message=sent[1])) == {
        "line": 1
    }
    assert (os.stat(path).st_ino, os.stat(path).st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


async def test_a_rewrite_copies_the_unchanged_lines_in_the_kernel(client: Client) -> None:
    """copy_file_range refuses an O_APPEND destination (EBADF): none may fall back."""
    await _session_with_odd_bytes(client)
    await client.call("session.updateMessage", sessionId="s", message=msg("m2", content="new"))
    await client.call("session.deleteMessages", sessionId="s", messageIds=["m0"])
    counters = (await client.call("host.stats"))["counters"]
    assert counters["rewrites"] == 2
    assert counters["rewrites.copyFallbacks"] == 0
