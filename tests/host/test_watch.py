"""Watches through the real endpoint (issue 34): events in apply order, durable cursors,
replay from the files, resets, deletes, restarts, and the bounds on a client that stops
reading. The transport is the only fake (``tests/host/inproc.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from host import _watch
from host._service import Host
from tests.host.inproc import Client, msg, open_host


class Events:
    """The ``session.event`` notifications a client was sent, in order, awaited by count."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.got: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        edge = client.edge
        dispatch = edge._dispatch

        def take(answer: Any) -> None:
            if isinstance(answer, dict) and answer.get("method") == "session.event":
                self.got.append(answer["params"])
                self.changed.set()
                return
            dispatch(answer)

        edge._dispatch = take  # type: ignore[method-assign]

    async def wait(self, n: int) -> list[dict[str, Any]]:
        """Wait until ``n`` events came; return them all (and forget them)."""
        while len(self.got) < n:
            self.changed.clear()
            await self.changed.wait()
        out, self.got = self.got, []
        return out

    async def until(self, kind: str) -> list[dict[str, Any]]:
        """Wait for an event of ``kind``; return every event up to it (and forget them)."""
        while not any(e["event"]["kind"] == kind for e in self.got):
            self.changed.clear()
            await self.changed.wait()
        at = next(i for i, e in enumerate(self.got) if e["event"]["kind"] == kind)
        out, self.got = self.got[: at + 1], self.got[at + 1 :]
        return out


@contextlib.asynccontextmanager
async def second(host: Host) -> AsyncIterator[tuple[Client, Events]]:
    """Another connection to the same host."""
    other = Client(host)
    events = Events(other)
    await other.connect()
    try:
        yield other, events
    finally:
        await other.close()


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"]["kind"] for e in events]


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"]["message"]["id"] for e in events if e["event"]["kind"] == "appended"]


async def test_a_watcher_gets_each_change_in_order_with_the_cursor_after_it(
    tmp_path: Path,
) -> None:
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        await c("session.appendMessage", sessionId="s", message=msg("a0"))
        async with second(c.host) as (w, events):
            got = await w("session.watch", sessionId="s")
            assert got["totalLines"] == 1
            await c("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", "user"))
            part = msg("r1", content="Hel")
            await c("session.saveInflightMessage", sessionId="s", turnId="t1", message=part)
            await c("session.publish", sessionId="s", turnId="t1", data={"delta": "lo"})
            await c("session.appendMessage", sessionId="s", message=msg("r1", content="Hello"))
            await c("session.endTurn", sessionId="s", turnId="t1", status="completed")
            seen = await events.wait(6)
            assert kinds(seen) == ["turn", "appended", "checkpoint", "live", "appended", "turn"]
            assert seen[0]["event"]["status"] == "running"
            assert seen[2]["event"]["message"] == part
            assert seen[3]["event"]["data"] == {"delta": "lo"}
            assert [e["event"]["line"] for e in seen if e["event"]["kind"] == "appended"] == [1, 2]
            assert seen[5]["event"]["status"] == "completed"
            assert all(e["watchId"] == got["watchId"] for e in seen)
            # each cursor is the position just after its change; a live one moves nothing
            lines = [int(e["cursor"].split(".")[1]) for e in seen]
            assert lines == [1, 2, 2, 2, 3, 3]
            assert seen[3]["cursor"] == seen[2]["cursor"]
            assert await w("session.unwatch", watchId=got["watchId"]) == {"unwatched": True}
            await c("session.appendMessage", sessionId="s", message=msg("a9"))
            await w("session.list")  # an answer after the append's would-be event
            assert events.got == []


async def test_a_cursor_replays_what_came_after_it_then_goes_live(tmp_path: Path) -> None:
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        async with second(c.host) as (w, events):
            first = await w("session.watch", sessionId="s")
            await c("session.appendMessage", sessionId="s", message=msg("a0"))
            (a0,) = await events.wait(1)
            await w("session.unwatch", watchId=first["watchId"])
            # while nobody watches: lines, a turn, a checkpoint
            await c("session.appendMessage", sessionId="s", message=msg("a1"))
            await c("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", "user"))
            cp = msg("r1", content="partial")
            await c("session.saveInflightMessage", sessionId="s", turnId="t1", message=cp)
            again = await w("session.watch", sessionId="s", after=a0["cursor"])
            assert again["cursor"] == a0["cursor"]  # honoured
            replayed = await events.wait(4)
            assert kinds(replayed) == ["appended", "appended", "turn", "checkpoint"]
            assert ids(replayed) == ["a1", "u1"]
            assert replayed[3]["event"]["message"] == cp
            await c("session.appendMessage", sessionId="s", message=msg("r1", content="done"))
            (live,) = await events.wait(1)
            assert live["event"]["line"] == 3
            # the same cursor again: the same events, nothing more
            await w("session.unwatch", watchId=again["watchId"])
            await w("session.watch", sessionId="s", after=a0["cursor"])
            assert ids(await events.wait(4)) == ["a1", "u1", "r1"]


async def test_a_watch_without_a_cursor_starts_at_the_lines_as_they_are(tmp_path: Path) -> None:
    """Mid-turn: the turn log replayed, then the last checkpoint, then live data after it."""
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        await c("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", "user"))
        cp = msg("r1", content="so far")
        await c("session.saveInflightMessage", sessionId="s", turnId="t1", message=cp)
        async with second(c.host) as (w, events):
            got = await w("session.watch", sessionId="s")
            assert got["totalLines"] == 1  # read the lines with session.get
            turn, checkpoint = await events.wait(2)
            assert (turn["event"]["kind"], turn["event"]["status"]) == ("turn", "running")
            assert checkpoint["event"] == {"kind": "checkpoint", "turnId": "t1", "message": cp}
            await c("session.publish", sessionId="s", turnId="t1", data="+ more")
            (live,) = await events.wait(1)
            assert live["event"] == {"kind": "live", "turnId": "t1", "data": "+ more"}


async def test_a_rewrite_resets_its_watchers_and_ends_the_old_epoch(tmp_path: Path) -> None:
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        for i in range(3):
            await c("session.appendMessage", sessionId="s", message=msg(f"a{i}"))
        async with second(c.host) as (w, events):
            got = await w("session.watch", sessionId="s")
            await c("session.deleteMessages", sessionId="s", messageIds=["a1"])
            (reset,) = await events.wait(1)
            assert reset["event"] == {"kind": "reset", "reason": "rewritten", "totalLines": 2}
            assert reset["cursor"].split(".")[0] != got["cursor"].split(".")[0]
            # the watch is over: nothing more comes on it
            await c("session.appendMessage", sessionId="s", message=msg("a3"))
            assert await w("session.unwatch", watchId=got["watchId"]) == {"unwatched": False}
            # the old cursor is gone: reset (expired) at once, with the cursor now
            old = await w("session.watch", sessionId="s", after=got["cursor"])
            (expired,) = await events.wait(1)
            assert expired["event"] == {"kind": "reset", "reason": "expired", "totalLines": 3}
            assert old["cursor"] == expired["cursor"] != got["cursor"]
            # the reset's cursor goes on from the rewrite: only a3 follows it
            await w("session.watch", sessionId="s", after=reset["cursor"])
            assert ids(await events.wait(1)) == ["a3"]


async def test_every_kind_of_rewrite_resets(tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("session.updateMessage", {"message": msg("a1", content="edited")}),
        ("session.replaceMessages", {"messages": [msg("a0"), msg("a1")]}),
        ("session.truncateFrom", {"fromMessageId": "a1"}),
        ("session.saveActiveRevision", {}),
    ]
    async with open_host(str(tmp_path)) as c, second(c.host) as (w, events):
        for n, (method, params) in enumerate(calls):
            sid = f"s{n}"
            await c("session.create", sessionId=sid)
            await c("session.appendMessage", sessionId=sid, message=msg("u0", "user"))
            for i in range(2):
                await c("session.appendMessage", sessionId=sid, message=msg(f"a{i}"))
            await w("session.watch", sessionId=sid)
            await c(method, sessionId=sid, **params)
            (reset,) = await events.wait(1)
            assert reset["event"]["kind"] == "reset", method
            total = (await c("session.get", sessionId=sid))["totalLines"]
            assert reset["event"]["totalLines"] == total, method


async def test_a_deleted_session_ends_its_watchers_and_a_new_one_is_a_new_epoch(
    tmp_path: Path,
) -> None:
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        await c("session.appendMessage", sessionId="s", message=msg("a0"))
        async with second(c.host) as (w, events):
            got = await w("session.watch", sessionId="s")
            await c("session.delete", sessionId="s")
            (gone,) = await events.wait(1)
            assert gone["event"] == {"kind": "deleted"}
            await c("session.create", sessionId="s")
            for i in range(3):
                await c("session.appendMessage", sessionId="s", message=msg(f"b{i}"))
            await w("session.watch", sessionId="s", after=got["cursor"])
            (expired,) = await events.wait(1)
            assert expired["event"]["reason"] == "expired"
            missing = await w.error("session.watch", sessionId="nope")
            assert missing["data"]["code"] == "NOT_FOUND"


async def test_a_cursor_outlives_the_host(tmp_path: Path) -> None:
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        async with second(c.host) as (w, events):
            await w("session.watch", sessionId="s")
            await c("session.appendMessage", sessionId="s", message=msg("a0"))
            (a0,) = await events.wait(1)
        await c("session.appendMessage", sessionId="s", message=msg("a1"))
    async with open_host(str(tmp_path)) as c:  # a restart (the index kept or not)
        events = Events(c)
        await c("session.appendMessage", sessionId="s", message=msg("a2"))
        got = await c("session.watch", sessionId="s", after=a0["cursor"])
        assert got["cursor"] == a0["cursor"]
        assert ids(await events.wait(2)) == ["a1", "a2"]
    os.remove(tmp_path / "index.sqlite3")  # a rebuilt index: the epoch is not in it
    async with open_host(str(tmp_path)) as c:
        events = Events(c)
        await c("session.watch", sessionId="s", after=a0["cursor"])
        assert ids(await events.wait(2)) == ["a1", "a2"]


async def test_bad_cursors_and_the_bounds_on_watches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_watch, "WATCHES_PER_CONNECTION", 2)
    monkeypatch.setattr(_watch, "WATCHERS_PER_SESSION", 3)
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        for bad in ("nonsense", "0123456789abcdef.1.2", "0123456789ABCDEF.1.2.3", ""):
            err = await c.error("session.watch", sessionId="s", after=bad)
            assert err["data"]["code"] == "INVALID_PARAMS", bad
        await c("session.watch", sessionId="s")
        await c("session.watch", sessionId="s")
        err = await c.error("session.watch", sessionId="s")
        assert (err["data"]["code"], err["data"]["limit"]) == ("LIMIT_EXCEEDED", 2)
        async with second(c.host) as (w, _):
            await w("session.watch", sessionId="s")
            err = await w.error("session.watch", sessionId="s")
            assert (err["data"]["code"], err["data"]["limit"]) == ("LIMIT_EXCEEDED", 3)
        big = "x" * (1 << 20)
        err = await c.error("session.publish", sessionId="s", turnId="t", data=big)
        assert err["data"]["code"] == "LIMIT_EXCEEDED"
        assert await c("session.unwatch", watchId="w999") == {"unwatched": False}


class Stalled:
    """A client that stopped reading: its writer reports paused, as a full socket does."""

    def __init__(self, client: Client) -> None:
        self.conn = client.conn

    def stall(self) -> None:
        self.conn.writer_paused(True)

    def read_again(self) -> None:
        self.conn.writer_paused(False)


async def test_a_watcher_that_stops_reading_is_dropped_with_one_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It slows no writer and no other watcher; its queue stays bounded; its reset's cursor
    resumes it with nothing lost (the files replay what was dropped)."""
    monkeypatch.setattr(_watch, "WATCH_QUEUE", 4096)
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        async with second(c.host) as (slow, slow_events), second(c.host) as (fast, fast_events):
            s1 = await slow("session.watch", sessionId="s")
            await fast("session.watch", sessionId="s")
            await c("session.appendMessage", sessionId="s", message=msg("a0"))
            (first,) = await slow_events.wait(1)
            await fast_events.wait(1)
            Stalled(slow).stall()
            hub = c.host.registry.watch
            for i in range(1, 200):
                body = msg(f"a{i}", content="y" * 200)
                await c("session.appendMessage", sessionId="s", message=body)
                assert hub.queued <= 4096 + 2048  # its queue is bounded while it is paused
            assert len(await fast_events.wait(199)) == 199  # the other watcher got them all
            assert slow_events.got == []
            Stalled(slow).read_again()
            (reset,) = await slow_events.wait(1)
            assert reset["event"] == {"kind": "reset", "reason": "overflow", "totalLines": 1}
            assert reset["cursor"] == first["cursor"]  # what it was given last
            assert await slow("session.unwatch", watchId=s1["watchId"]) == {"unwatched": False}
            await slow("session.watch", sessionId="s", after=reset["cursor"])
            assert ids(await slow_events.wait(199)) == [f"a{i}" for i in range(1, 200)]
            assert c.host.registry.watch.queued == 0


async def test_a_burst_for_a_client_that_reads_is_no_overflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group commit of many appends queues many events in one pass: a client that takes
    them is handed them all, however far past the bound that burst goes."""
    monkeypatch.setattr(_watch, "WATCH_QUEUE", 4096)
    async with open_host(str(tmp_path)) as c:
        await c("session.create", sessionId="s")
        async with second(c.host) as (w, events):
            await w("session.watch", sessionId="s")
            batch = [
                c.envelope(
                    "session.appendMessage",
                    {"sessionId": "s", "message": msg(f"a{i}", content="z" * 1000)},
                    rid=f"b{i}",
                )
                for i in range(100)
            ]
            await c.batch(batch)  # one line: one group, one fsync, 100 events at once
            got = await events.wait(100)
            assert ids(got) == [f"a{i}" for i in range(100)]
            assert c.host.registry.counters.get("watch.overflows", 0) == 0
