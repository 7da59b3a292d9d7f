"""session.create, session.list, session.delete, and ids that must never reach the disk."""

from __future__ import annotations

import datetime as dt
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    Client,
    RpcError,
    dumps,
    everything,
    get_messages,
    make_session,
    msg,
    transcript,
)


def _iso(text: str) -> dt.datetime:
    assert text.endswith("Z"), text
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_create_makes_an_empty_session(client: Client, data_dir: Path) -> None:
    res = await client.call("session.create", sessionId="chat-1", title="First chat")
    assert res == {"sessionId": "chat-1", "created": True}
    assert transcript(data_dir, "chat-1").read_bytes() == b""
    got = await client.call("session.get", sessionId="chat-1")
    assert got == {"messages": [], "startLine": 0, "endLine": 0, "totalLines": 0}
    (row,) = (await client.call("session.list"))["sessions"]
    assert row["sessionId"] == "chat-1"
    assert row["title"] == "First chat"
    assert row["messageCount"] == 0
    assert _iso(row["updatedAt"]).tzinfo is not None


async def test_create_without_id_picks_a_fresh_one(client: Client) -> None:
    a = await client.call("session.create")
    b = await client.call("session.create", title=None)
    assert a["created"] and b["created"]
    assert a["sessionId"] != b["sessionId"]
    ids = {s["sessionId"] for s in (await client.call("session.list"))["sessions"]}
    assert ids == {a["sessionId"], b["sessionId"]}


async def test_create_of_an_existing_id_changes_nothing(client: Client, data_dir: Path) -> None:
    await make_session(client, "s", 2, title="kept")
    before = await everything(client, data_dir)
    res = await client.call("session.create", sessionId="s", title="ignored")
    assert res == {"sessionId": "s", "created": False}
    assert await everything(client, data_dir) == before
    (row,) = (await client.call("session.list"))["sessions"]
    assert (row["title"], row["messageCount"]) == ("kept", 2)


async def test_create_of_a_transcript_copied_in_indexes_it_and_keeps_it(
    client: Client, data_dir: Path
) -> None:
    """A transcript the index has not seen (restored while the host runs) is the truth."""
    path = transcript(data_dir, "restored")
    kept = b'{"id":"u0","role":"user","content":"precious"}\n'
    path.write_bytes(kept)
    res = await client.call("session.create", sessionId="restored", title="new")
    assert res == {"sessionId": "restored", "created": False}
    assert path.read_bytes() == kept
    assert [m["content"] for m in await get_messages(client, "restored")] == ["precious"]


async def test_list_counts_messages_and_orders_newest_first(client: Client) -> None:
    await make_session(client, "old", 3, title="Old")
    await make_session(client, "new", 1)
    rows = (await client.call("session.list"))["sessions"]
    assert [(r["sessionId"], r["title"], r["messageCount"]) for r in rows] == [
        ("new", None, 1),
        ("old", "Old", 3),
    ]
    assert _iso(rows[0]["updatedAt"]) >= _iso(rows[1]["updatedAt"])


async def test_delete_removes_every_file_and_the_listing(client: Client, data_dir: Path) -> None:
    await make_session(client, "gone", 3, title="t")
    await make_session(client, "stays", 1)
    stays = {k: v for k, v in (await everything(client, data_dir))[0].items() if "stays" in k}
    assert (await client.call("session.delete", sessionId="gone")) == {"deleted": True}
    assert not [n for n in os.listdir(data_dir / "sessions") if n.startswith("gone")]
    assert not (data_dir / "revisions" / "gone").exists()
    assert [r["sessionId"] for r in (await client.call("session.list"))["sessions"]] == ["stays"]
    files = (await everything(client, data_dir))[0]
    assert {k: v for k, v in files.items() if "stays" in k} == stays
    with pytest.raises(RpcError) as err:
        await client.call("session.get", sessionId="gone")
    assert err.value.name == "NOT_FOUND" and err.value.data["kind"] == "session"
    # The id can be used again, from scratch.
    assert (await client.call("session.create", sessionId="gone"))["created"] is True
    assert (await client.call("session.get", sessionId="gone"))["messages"] == []


async def test_absent_session_is_not_found(client: Client, data_dir: Path) -> None:
    await make_session(client, "other", 1)
    before = await everything(client, data_dir)
    for method, params in [
        ("session.delete", {}),
        ("session.get", {}),
        ("session.get", {"limit": 2}),
        ("session.appendMessage", {"message": msg("m1")}),
        ("session.updateMessage", {"message": msg("m1")}),
        ("session.deleteMessages", {"messageIds": ["m1"]}),
        ("session.replaceMessages", {"messages": [msg("m1")]}),
    ]:
        with pytest.raises(RpcError) as err:
            await client.call(method, sessionId="absent", **params)
        assert err.value.code == -32004, method
        assert err.value.name == "NOT_FOUND"
        assert err.value.data["kind"] == "session"
    assert await everything(client, data_dir) == before
    assert not transcript(data_dir, "absent").exists()


BAD_IDS = [
    "../x",
    "a/b",
    "",
    "x" * 129,
    ".",
    "..",
    "/etc/passwd",
    "a b",
    "é",
    "a\\b",
    "a\x00b",
    "ab\n",
    "\nab",
    "a\tb",
]


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (the whole tmp dir): a sneaky id must create nothing."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if not p.name.endswith(".stderr.log") and not p.name.startswith("index.sqlite3")
    }


async def test_bad_session_ids_are_invalid_params_and_touch_nothing(
    client: Client, tmp_path: Path
) -> None:
    await make_session(client, "s", 1)
    before = _tree(tmp_path)
    for bad, (method, extra) in itertools.product(
        BAD_IDS,
        [
            ("session.create", {}),
            ("session.get", {}),
            ("session.delete", {}),
            ("session.appendMessage", {"message": msg("m9")}),
            ("session.updateMessage", {"message": msg("m0")}),
            ("session.deleteMessages", {"messageIds": ["m0"]}),
            ("session.replaceMessages", {"messages": []}),
        ],
    ):
        with pytest.raises(RpcError) as err:
            await client.call(method, sessionId=bad, **extra)
        assert err.value.code == -32602, (bad, method, err.value)
        assert err.value.name == "INVALID_PARAMS"
    assert _tree(tmp_path) == before
    assert [r["sessionId"] for r in (await client.call("session.list"))["sessions"]] == ["s"]


async def test_bad_message_ids_are_invalid_params_and_change_nothing(
    client: Client, data_dir: Path
) -> None:
    await make_session(client, "s", 2)
    before = await everything(client, data_dir)
    for bad in BAD_IDS:
        calls: list[tuple[str, dict[str, Any]]] = [
            ("session.appendMessage", {"message": msg(bad)}),
            ("session.appendMessage", {"message": msg("ok"), "turnId": bad}),
            ("session.updateMessage", {"message": msg(bad)}),
            ("session.deleteMessages", {"messageIds": ["m0", bad]}),
            ("session.replaceMessages", {"messages": [msg("m0"), msg(bad)]}),
        ]
        for method, extra in calls:
            with pytest.raises(RpcError) as err:
                await client.call(method, sessionId="s", **extra)
            assert err.value.name == "INVALID_PARAMS", (bad, method, err.value)
    assert await everything(client, data_dir) == before


async def test_every_legal_id_works(client: Client, data_dir: Path) -> None:
    for good in ["x" * 128, "a", "A.b_c:d-9", "...", ".hidden", "9"]:
        assert (await client.call("session.create", sessionId=good))["created"] is True
        await client.call("session.appendMessage", sessionId=good, message=msg(good))
        assert transcript(data_dir, good).exists()
        got = await client.call("session.get", sessionId=good)
        assert [m["id"] for m in got["messages"]] == [good]
        assert (await client.call("session.delete", sessionId=good))["deleted"] is True


async def test_calls_queued_behind_a_delete_find_no_session(client: Client, data_dir: Path) -> None:
    c = client
    await make_session(c, "s", 1)
    futs = {rid: c.expect(rid) for rid in (1, 2, 3, 4)}
    await c.send_raw(
        b"".join(
            dumps(item) + b"\n"
            for item in [
                c.envelope("session.delete", {"sessionId": "s"}, 1),
                c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("b")}, 2),
                c.envelope("session.get", {"sessionId": "s"}, 3),
                c.envelope("session.create", {"sessionId": "s"}, 4),
            ]
        )
    )
    replies = {rid: await c.wait(f) for rid, f in futs.items()}
    assert replies[1]["result"] == {"deleted": True}
    assert replies[2]["error"]["data"] == {"code": "NOT_FOUND", "kind": "session"}
    assert replies[3]["error"]["data"] == {"code": "NOT_FOUND", "kind": "session"}
    assert replies[4]["result"] == {"sessionId": "s", "created": True}
    assert transcript(data_dir, "s").read_bytes() == b""  # the queued append wrote nothing
