"""A cursor handed out before a power cut resumes after it with nothing acknowledged missing.

A host runs on the power-cut model (``tests/host/powerloss.py``: only what was fsynced
survives; SQLite loses every commit since its last sync, or a prefix of them) while a
watcher follows its session through appends, a turn with a checkpoint, and rewrites. After
each answered call (and the events it made), the data dir is imaged as a cut then would
leave it. A host started on each image is asked to watch from every cursor handed out so
far: one whose epoch the cut left standing must be honoured, and the lines the watcher held
at it plus the lines replayed after it must be exactly ``session.get``'s, every turn change
it was sent after it must come again, in order; one from before a rewrite answered before
the cut must be answered ``reset``, never honoured.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.host.inproc import Client, msg, open_host
from tests.host.powerloss import PowerLossFileSystem
from tests.host.test_watch import Events, second

Step = tuple[str, dict[str, Any], list[str]]  # method, params, the event kinds it makes


def append(mid: str, **extra: Any) -> Step:
    return ("session.appendMessage", {"message": msg(mid, **extra)}, ["appended"])


STEPS: list[Step] = [
    append("a1"),
    ("session.beginTurn", {"turnId": "t1", "prompt": msg("u1", "user")}, ["turn", "appended"]),
    ("session.saveInflightMessage", {"turnId": "t1", "message": msg("r1")}, ["checkpoint"]),
    append("r1", turnId="t1"),
    ("session.endTurn", {"turnId": "t1", "status": "completed"}, ["turn"]),
    ("session.deleteMessages", {"messageIds": ["a0"]}, ["reset"]),
    append("a2"),
    ("session.beginTurn", {"turnId": "t2"}, ["turn"]),
    append("a3"),
    ("session.truncateFrom", {"fromMessageId": "a3"}, ["turn", "reset"]),
    append("a4"),
    append("a5"),
]


class Follower:
    """A watcher that keeps a copy of the session: every cursor it was handed, with the
    message ids and the turn changes it held at that cursor."""

    def __init__(self, client: Client, events: Events) -> None:
        self.client = client
        self.events = events
        self.lines: list[str] = []
        self.turns: list[tuple[str, str]] = []
        self.held: list[tuple[str, list[str], int]] = []  # cursor, ids, turn changes seen

    async def start(self, cursor: str | None = None, total: int = 0) -> None:
        """Read the lines before ``cursor`` (where the session stands, without one), then
        watch from it."""
        w = self.client
        if cursor is None:
            fresh = await w("session.watch", sessionId="s")
            await w("session.unwatch", watchId=fresh["watchId"])
            cursor, total = fresh["cursor"], fresh["totalLines"]
        page = await w("session.get", sessionId="s", beforeLine=total)
        self.lines = [m["id"] for m in page["messages"]]
        got = await w("session.watch", sessionId="s", after=cursor)
        assert got["cursor"] == cursor  # nothing came between: honoured
        self.held.append((cursor, list(self.lines), len(self.turns)))

    async def take(self, kinds: list[str]) -> None:
        got = await self.events.wait(len(kinds))
        assert [e["event"]["kind"] for e in got] == kinds
        for e in got:
            ev = e["event"]
            if ev["kind"] == "reset":
                await self.start(e["cursor"], ev["totalLines"])
                continue
            if ev["kind"] == "appended":
                assert ev["line"] == len(self.lines)
                self.lines.append(ev["message"]["id"])
            elif ev["kind"] == "turn":
                self.turns.append((ev["turnId"], ev["status"]))
            self.held.append((e["cursor"], list(self.lines), len(self.turns)))


async def check_image(img: str, follower: Follower, epoch: str) -> list[str]:
    """Watch from every cursor on a host started on ``img``; return what was wrong.

    ``epoch``: the epoch of the last cursor handed out before the cut.
    """
    problems = []
    async with open_host(img) as c, second(c.host) as (w, events):
        await c("session.recoverInflightMessages")
        for n, (cursor, lines, turns_seen) in enumerate(follower.held):
            got = await w("session.watch", sessionId="s", after=cursor)
            standing = cursor.split(".")[0] == epoch
            if got["cursor"] != cursor:
                (reset,) = await events.wait(1)
                assert reset["event"]["kind"] == "reset"
                if standing:
                    problems.append(f"{img}: {cursor} of the standing epoch not honoured")
                continue
            if not standing:
                problems.append(f"{img}: {cursor} of an epoch a rewrite ended honoured")
            # live data reaches only a watcher that caught up: the end of its replay
            marker = {"caughtUp": n}
            while not (await c("session.publish", sessionId="s", turnId="x", data=marker))[
                "watchers"
            ]:
                pass
            seen: list[dict[str, Any]] = []
            while not any(e["event"].get("data") == marker for e in seen):
                seen += await events.wait(1)
            await w("session.unwatch", watchId=got["watchId"])
            replayed = [
                e["event"]["message"]["id"] for e in seen if e["event"]["kind"] == "appended"
            ]
            turns = [
                (e["event"]["turnId"], e["event"]["status"])
                for e in seen
                if e["event"]["kind"] == "turn"
            ]
            want = [m["id"] for m in (await c("session.get", sessionId="s"))["messages"]]
            if lines + replayed != want:
                problems.append(f"{img}: from {cursor}: {lines} + {replayed} != {want}")
            sent = follower.turns[turns_seen:]
            if turns[: len(sent)] != sent:  # a start may add its own (a running turn aborted)
                problems.append(f"{img}: from {cursor}: turns {turns} do not begin with {sent}")
    return problems


async def test_cursors_handed_out_before_a_power_cut_resume_after_it(tmp_path: Path) -> None:
    base = tmp_path / "base"
    async with open_host(str(base)) as c:
        await c("session.create", sessionId="s")
        await c("session.appendMessage", sessionId="s", message=msg("a0"))
    run = tmp_path / "run"
    shutil.copytree(base, run)
    fs = PowerLossFileSystem(str(run))
    images: list[tuple[str, Follower, str]] = []
    async with open_host(str(run), fs) as c, second(c.host) as (w, events):
        fs.arm()
        follower = Follower(w, events)
        await follower.start()
        for i, (method, params, kinds) in enumerate(STEPS):
            await c(method, sessionId="s", **params)
            await follower.take(kinds)
            epoch = follower.held[-1][0].split(".")[0]
            for index in ("synced", "middle"):
                img = str(tmp_path / f"img{i}-{index}")
                fs.image(img, index=index)
                snapshot = Follower(w, events)
                snapshot.held, snapshot.turns = list(follower.held), list(follower.turns)
                images.append((img, snapshot, epoch))
    problems = []
    for img, snapshot, epoch in images:
        problems += await check_image(img, snapshot, epoch)
    assert problems == []
