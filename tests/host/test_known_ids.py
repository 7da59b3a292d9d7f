"""Dedup from memory: the ids an append checks are kept per session, and stay true.

``Index.lookup_now`` answers from the committed ids it read once per session (plus the
rows still queued). These tests replay ids after every kind of write that removes or
moves rows, and over the memory bound, and check the answer against what is stored.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from host import _index
from tests.host.inproc import Client, msg, open_host


async def append(call: Client, mid: str, sid: str = "s") -> tuple[int, bool]:
    r = await call("session.appendMessage", sessionId=sid, message=msg(mid, "user"))
    return r["line"], r["appended"]


async def settled(call: Client) -> None:
    """Let the queued rows commit, so the next lookups are answered from memory."""
    await call.host.registry.index.settle()
    assert call.host.registry.sessions["s"].cache.known, "the ids were not read into memory"


async def test_a_deleted_and_recreated_session_stores_a_replayed_id_again(tmp_path: Path) -> None:
    async with open_host(str(tmp_path / "d")) as call:
        await call("session.create", sessionId="s")
        assert await append(call, "a") == (0, True)
        assert await append(call, "b") == (1, True)
        await settled(call)
        assert await append(call, "a") == (0, False)  # a replay: deduplicated
        await call("session.delete", sessionId="s")
        await call("session.create", sessionId="s")
        assert await append(call, "b") == (0, True)  # a new session: stored, not "line 1"
        ids = [m["id"] for m in (await call("session.get", sessionId="s"))["messages"]]
        assert ids == ["b"]


async def test_ids_removed_by_a_cut_or_a_delete_are_stored_again(tmp_path: Path) -> None:
    async with open_host(str(tmp_path / "d")) as call:
        await call("session.create", sessionId="s")
        for mid in "abcd":
            await append(call, mid)
        await settled(call)
        assert await append(call, "c") == (2, False)
        await call("session.truncateFrom", sessionId="s", fromMessageId="c")
        await call("session.deleteMessages", sessionId="s", messageIds=["a"])
        # what is left moved up a line; what was cut or deleted is new again
        assert await append(call, "b") == (0, False)
        assert await append(call, "d") == (1, True)
        assert await append(call, "a") == (2, True)
        ids = [m["id"] for m in (await call("session.get", sessionId="s"))["messages"]]
        assert ids == ["b", "d", "a"]


async def test_past_the_memory_bound_replays_are_still_deduplicated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_index, "KNOWN_IDS", 30)
    monkeypatch.setattr(_index, "KNOWN_SESSION", 12)
    async with open_host(str(tmp_path / "d")) as call:
        index = call.host.registry.index
        sessions = [f"s{i}" for i in range(6)]
        for sid in sessions:
            await call("session.create", sessionId=sid)
            for i in range(20 if sid == "s0" else 8):  # s0 is over KNOWN_SESSION
                await append(call, f"{sid}-{i}", sid)
        for _ in range(3):
            await index.settle()
            for sid in sessions:
                assert await append(call, f"{sid}-3", sid) == (3, False)
                assert index._known_count <= 30
                assert index._known_count == sum(len(c.known or {}) for c in index._known)
        assert call.host.registry.sessions["s0"].cache.known is None  # looked up each time
        for sid in sessions:
            page = await call("session.get", sessionId=sid)
            assert page["totalLines"] == (20 if sid == "s0" else 8)


async def test_rows_committed_after_the_ids_were_read_are_known(tmp_path: Path) -> None:
    async with open_host(str(tmp_path / "d")) as call:
        await call("session.create", sessionId="s")
        await append(call, "a")
        await settled(call)
        # appends answered before their batch commits, then replayed after it
        lines = await asyncio.gather(*(append(call, f"m{i}") for i in range(50)))
        assert all(appended for _, appended in lines)
        await call.host.registry.index.settle()
        for i in (0, 25, 49):
            assert await append(call, f"m{i}") == (lines[i][0], False)
