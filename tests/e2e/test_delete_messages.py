"""session.deleteMessages: host-side removal, the kept lines copied byte for byte."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Client, everything, make_session, msg, transcript


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return data.split(b"\n")[:-1]


async def test_delete_removes_those_lines_and_keeps_the_rest_verbatim(
    client: Client, data_dir: Path
) -> None:
    await make_session(client, "s", 6)
    path = transcript(data_dir, "s")
    before = _lines(path)
    res = await client.call("session.deleteMessages", sessionId="s", messageIds=["m1", "m4", "m5"])
    assert res == {"deleted": 3}
    assert _lines(path) == [before[0], before[2], before[3]]
    got = await client.call("session.get", sessionId="s")
    assert [m["id"] for m in got["messages"]] == ["m0", "m2", "m3"]
    assert got["totalLines"] == 3
    page = await client.call("session.get", sessionId="s", beforeLine=3, limit=1)
    assert [m["id"] for m in page["messages"]] == ["m3"]
    # Later appends number on from the new end; a deleted id may come back.
    res = await client.call("session.appendMessage", sessionId="s", message=msg("m1"))
    assert res == {"line": 3, "appended": True}
    (row,) = (await client.call("session.list"))["sessions"]
    assert row["messageCount"] == 4


async def test_delete_of_unknown_ids_changes_nothing(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 3)
    before = await everything(client, data_dir)
    for ids in (["zz"], [], ["zz", "yy"]):
        res = await client.call("session.deleteMessages", sessionId="s", messageIds=ids)
        assert res == {"deleted": 0}
    assert await everything(client, data_dir) == before


async def test_delete_counts_only_the_ids_it_found(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 3)
    res = await client.call(
        "session.deleteMessages", sessionId="s", messageIds=["zz", "m0", "m0", "m2"]
    )
    assert res == {"deleted": 2}
    assert [m["id"] for m in (await client.call("session.get", sessionId="s"))["messages"]] == [
        "m1"
    ]


async def test_delete_of_every_message_leaves_an_empty_session(
    client: Client, data_dir: Path
) -> None:
    await make_session(client, "s", 3)
    res = await client.call("session.deleteMessages", sessionId="s", messageIds=["m0", "m1", "m2"])
    assert res == {"deleted": 3}
    assert transcript(data_dir, "s").read_bytes() == b""
    got = await client.call("session.get", sessionId="s")
    assert got == {"messages": [], "startLine": 0, "endLine": 0, "totalLines": 0}
