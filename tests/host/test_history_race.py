"""ADR 0060's lost message, made deterministic: an append lands after the archive's read."""

from __future__ import annotations

import asyncio

from tests.host.inproc import msg, open_host, pause_history_at


async def _queued_on_lock(client: object, session_id: str, users: int) -> None:
    """Wait until ``users`` calls hold or wait for the session's lock (bounded)."""
    locks = client.host.registry.locks  # type: ignore[attr-defined]
    for _ in range(10_000):
        if locks.users(session_id) >= users:
            return
        await asyncio.sleep(0)
    raise AssertionError("the append never queued on the session lock")


async def test_append_after_archive_read_survives_in_transcript_and_next_archive(tmp_path):
    async with open_host(str(tmp_path / "data")) as call:
        await call("session.create", sessionId="s")
        await call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", "user"))
        await call("session.appendMessage", sessionId="s", turnId="t1", message=msg("a1"))

        reached, release = pause_history_at(call, "branch-read")
        archive = asyncio.create_task(call("session.saveActiveRevision", sessionId="s"))
        await reached.wait()
        late = asyncio.create_task(
            call("session.appendMessage", sessionId="s", turnId="t1", message=msg("a2"))
        )
        await _queued_on_lock(call, "s", 2)
        release.set()
        first = await archive
        appended = await late
        call.host.history.hook = None

        assert first["archived"] == 1  # the archive saw the transcript as it was when it read
        assert appended == {"line": 2, "appended": True}
        page = await call("session.get", sessionId="s")
        assert [m["id"] for m in page["messages"]] == ["u1", "a1", "a2"]
        assert page["messages"][0]["revisionCount"] == 1  # the stamp did not cost a2

        second = await call("session.saveActiveRevision", sessionId="s")
        assert second["archived"] == 2
        listed = await call(
            "session.listRevisions", sessionId="s", rootId="u1", includeMessages=True
        )
        assert [m["id"] for m in listed["revisions"][0]["messages"]] == ["a1", "a2"]
        assert all(m["turnId"] == "t1" for m in listed["revisions"][0]["messages"])


async def test_pipelined_archives_and_appends_lose_nothing(tmp_path):
    async with open_host(str(tmp_path / "data")) as call:
        await call("session.create", sessionId="s")
        await call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", "user"))
        calls = []
        for i in range(30):
            calls.append(
                call("session.appendMessage", sessionId="s", turnId="t1", message=msg(f"a{i}"))
            )
            if i % 3 == 0:
                calls.append(call("session.saveActiveRevision", sessionId="s"))
        results = await asyncio.gather(*calls)
        assert sum(1 for r in results if r.get("appended")) == 30
        page = await call("session.get", sessionId="s")
        assert [m["id"] for m in page["messages"]] == ["u1"] + [f"a{i}" for i in range(30)]
        final = await call("session.saveActiveRevision", sessionId="s")
        assert final["archived"] == 30
