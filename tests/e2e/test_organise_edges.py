"""Organising edges a review of issue 35 found on main (8ac0e14), each red there: a
meta.json of odd types or a long createdAt (an older host's, a hand's) read into the index
as it stood (the host could not start, or the list could not page), and a transcript
copied in while the host runs listed without its meta."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Client, StartHost, msg, restart_host


async def _walk(client: Client, **params: Any) -> list[str]:
    out: list[str] = []
    cursor = params.pop("cursor", None)
    while True:
        page = await client.call("session.list", **params, **({"cursor": cursor} if cursor else {}))
        out += [s["sessionId"] for s in page["sessions"]]
        cursor = page.get("cursor")
        if not cursor:
            return out


@pytest.mark.parametrize(
    "meta_json",
    [
        {"title": {"a": 1}, "createdAt": "2024-01-01T00:00:00.000Z"},
        {"title": "t", "createdAt": {"a": 1}},
    ],
)
async def test_meta_json_with_odd_types_rebuilds(
    start_host: StartHost, data_dir: Path, meta_json: dict[str, Any]
) -> None:
    """A meta.json an older host or a hand left with odd types: the index rebuilt from
    the files starts and lists sessions as the schema says (it failed to start)."""
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    await host.client.call("session.create", sessionId="s", title="x")
    await host.client.call("session.create", sessionId="ok", title="y")
    assert await host.stop() == 0
    (data_dir / "sessions" / "s.meta.json").write_text(json.dumps(meta_json))
    for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm"):
        if (data_dir / name).exists():
            os.unlink(data_dir / name)
    new = await restart_host(start_host, host)
    assert new.client is not None
    rows = (await new.client.call("session.list"))["sessions"]
    for r in rows:
        assert r["title"] is None or isinstance(r["title"], str), r
        assert isinstance(r["createdAt"], str), r
    assert sorted(r["sessionId"] for r in rows) == ["ok", "s"]


async def test_a_long_created_at_keeps_the_list_pageable(
    start_host: StartHost, data_dir: Path
) -> None:
    """A createdAt from meta.json is the keyset's key: one that is no timestamp is not
    taken (a long one made a cursor past MAX_CURSOR, which the next page refused)."""
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    for sid in ("a", "b", "c"):
        await host.client.call("session.create", sessionId=sid)
    assert await host.stop() == 0
    (data_dir / "sessions" / "b.meta.json").write_text(
        json.dumps({"title": "t", "createdAt": "2099-01-01T00:00:00.000Z" + "x" * 800})
    )
    for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm"):
        if (data_dir / name).exists():
            os.unlink(data_dir / name)
    new = await restart_host(start_host, host)
    assert new.client is not None
    assert sorted(await _walk(new.client, order="created", limit=1)) == ["a", "b", "c"]


async def test_a_transcript_copied_in_is_listed_with_its_meta(
    client: Client, data_dir: Path
) -> None:
    """session.create of an id whose transcript and meta.json were copied in while the
    host runs indexes it as start would, its meta and pin included (they were not)."""
    await client.call("session.create", sessionId="src", title="t")
    await client.call("session.appendMessage", sessionId="src", message=msg("m0"))
    await client.call("session.update", sessionId="src", meta={"pinned": True, "tag": "x"})
    sessions = data_dir / "sessions"
    (sessions / "copy.jsonl").write_bytes((sessions / "src.jsonl").read_bytes())
    (sessions / "copy.meta.json").write_bytes((sessions / "src.meta.json").read_bytes())
    got = await client.call("session.create", sessionId="copy")
    assert got["created"] is False
    rows = {r["sessionId"]: r for r in (await client.call("session.list"))["sessions"]}
    assert rows["copy"]["title"] == "t"
    assert rows["copy"]["meta"] == {"pinned": True, "tag": "x"}, rows["copy"]
    await client.call("session.create", sessionId="z")  # newer, not pinned: listed last
    walked = await _walk(client, pinnedFirst=True, limit=1)
    assert sorted(walked[:2]) == ["copy", "src"] and walked[2:] == ["z"], walked


async def test_a_title_holding_nul_is_listed_whole(start_host: StartHost) -> None:
    """JSON lets a string hold U+0000 (``\\u0000``); the update stored it whole, but the
    list cut it there (SQL's ``substr`` counts characters up to the first NUL)."""
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    title = "Budget\x002025 plan"
    await host.client.call("session.create", sessionId="a")
    assert (await host.client.call("session.update", sessionId="a", title=title))["title"] == title
    for _ in range(2):  # served, and read again from meta.json at a start
        (listed,) = (await host.client.call("session.list"))["sessions"]
        assert listed["title"] == title
        host = await restart_host(start_host, host)
        assert host.client is not None
