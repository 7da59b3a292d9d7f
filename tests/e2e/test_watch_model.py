"""Watchers against the real host over its socket: random interleavings, SIGKILLs, restarts.

One writer connection makes random changes to a few sessions: appends (some big), turns
with checkpoints and live data, every kind of rewrite, a session deleted and made again.
Watchers, each on its own connection, attach, detach, stop reading for a while and resume
from their cursors; now and then the host is killed with SIGKILL and started again, and
every watcher reconnects and resumes from the cursor of the last event it took.

Each watcher rebuilds its session from the events alone, as a client does: an ``appended``
event must be for the very next line (a smaller line is a duplicate, a larger one a gap
nobody announced); a ``reset`` is the only way to skip, and after one the watcher reads the
lines before the reset's cursor and watches from it. At the end every watcher's copy must
equal ``session.get``, with 0 duplicates and 0 gaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import WAIT, Client, RpcError, StartHost, msg

SIDS = ("s0", "s1", "s2")
_GONE = {"gone": True}
_DETACH = {"detach": True}


class Watcher:
    """One watching client on its own connection, following one session."""

    def __init__(self, name: str, sid: str, model: Model) -> None:
        self.name = name
        self.sid = sid
        self.model = model
        self.lines: list[dict[str, Any]] = []
        self.cursor: str | None = None
        self.total = 0
        self.reread = True
        self.attached = True
        self.reading = asyncio.Event()
        self.reading.set()
        self.dups = self.gaps = 0
        self.resets: Counter[str] = Counter()
        self.markers: set[int] = set()
        self.wid: str | None = None
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.writer: asyncio.StreamWriter | None = None
        self.where = ""
        self.dead = False
        self.task = asyncio.get_running_loop().create_task(self.run())

    # -- the connection: read only while "reading" ---------------------------------------

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                await self.reading.wait()
                line = await reader.readline()
                if not line.endswith(b"\n"):  # end of input (a killed host's last bytes)
                    break
                item = json.loads(line)
                if item.get("method") == "session.event":
                    self.inbox.put_nowait(item["params"])
                elif (fut := self.pending.pop(item.get("id"), None)) is not None:
                    fut.set_result(item)
        except ConnectionError:
            pass
        finally:
            self.dead = True
            for fut in self.pending.values():
                fut.set_exception(ConnectionError("host gone"))
            self.pending.clear()
            self.inbox.put_nowait(_GONE)

    async def call(self, method: str, **params: Any) -> Any:
        assert self.writer is not None
        if self.dead:
            raise ConnectionError("host gone")
        rid = next(self.ids)
        fut = self.pending[rid] = asyncio.get_running_loop().create_future()
        req = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        self.writer.write(json.dumps(req).encode() + b"\n")
        self.where = f"call {method} {params}"
        answer = await fut
        self.where = f"answered {method}"
        if "error" in answer:
            raise RpcError(answer["error"])
        return answer["result"]

    # -- following --------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await self.model.up.wait()
            await self.model.attached(self)
            try:
                reader, self.writer = await asyncio.open_unix_connection(
                    str(self.model.path),
                    limit=1 << 22,  # a small read buffer: a stall shows
                )
            except OSError:  # the host died meanwhile
                await self.model.changed_after(self.model.generation)
                continue
            self.dead = False
            read = asyncio.get_running_loop().create_task(self._read(reader))
            try:
                await self.call("handshake", protocolVersion=11)
                await self._follow()
            except ConnectionError:
                pass
            finally:
                self.writer.close()
                read.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await read
                self.inbox = asyncio.Queue()
                self.wid = None

    async def _watch(self) -> bool:
        """Watch from the cursor (reading the lines before it first when they must be);
        ``False`` when the session is not there (deleted)."""
        try:
            if self.reread:
                if self.cursor is None:
                    fresh = await self.call("session.watch", sessionId=self.sid)
                    await self.call("session.unwatch", watchId=fresh["watchId"])
                    self.cursor, self.total = fresh["cursor"], fresh["totalLines"]
                lines, end = [], self.total
                while end > 0:  # pages of a few lines: some are 300 KB
                    page = await self.call(
                        "session.get", sessionId=self.sid, beforeLine=end, limit=8
                    )
                    lines[:0] = page["messages"]
                    end = page["startLine"] if page["messages"] else 0
            got = await self.call("session.watch", sessionId=self.sid, after=self.cursor)
        except RpcError as exc:
            assert exc.name == "NOT_FOUND", exc
            return False
        self.wid = got["watchId"]
        if self.reread and got["cursor"] == self.cursor:  # honoured: the read holds
            self.lines, self.reread = lines, False
        return True

    async def _follow(self) -> None:
        while True:
            if not self.attached:
                return
            generation = self.model.generation
            if not await self._watch():
                self.where = "waiting for a change"
                await self.model.changed_after(generation)
                continue
            while True:
                self.where = "inbox"
                params = await self.inbox.get()
                if params is _GONE:
                    raise ConnectionError("host gone")
                if params is _DETACH:
                    with contextlib.suppress(RpcError):
                        await self.call("session.unwatch", watchId=self.wid)
                    return
                if params["watchId"] != self.wid:
                    continue  # a watch of before (unwatched): not ours any more
                if self._take(params["event"], params["cursor"]):
                    break  # the watch is over: watch again from the cursor

    def _take(self, ev: dict[str, Any], cursor: str) -> bool:
        """Apply one event to the copy; ``True`` when it ended the watch."""
        kind = ev["kind"]
        if kind == "reset":
            self.resets[ev["reason"]] += 1
            self.cursor, self.total = cursor, ev["totalLines"]
            self.reread = self.reread or ev["reason"] != "overflow"
            return True
        if kind == "deleted":
            self.cursor, self.reread, self.lines = None, True, []
            return True
        if self.reread:
            return False  # an expired cursor: its reset comes first, before any of these
        self.cursor = cursor
        if kind == "appended":
            if ev["line"] < len(self.lines):
                self.dups += 1
            elif ev["line"] > len(self.lines):
                self.gaps += 1
            else:
                self.lines.append(ev["message"])
        elif kind == "live" and isinstance(ev["data"], dict) and "marker" in ev["data"]:
            self.markers.add(ev["data"]["marker"])
            self.model.notify()
        return False

    def detach(self) -> None:
        self.attached = False
        self.inbox.put_nowait(_DETACH)

    def attach(self) -> None:
        self.attached = True
        self.model.notify()


class Model:
    """The random run: a writer, the watchers, the host (killed and started again)."""

    def __init__(self, start_host: StartHost, data: Path, path: Path, seed: int) -> None:
        self.start_host = start_host
        self.data = data
        self.path = path
        self.rng = random.Random(seed)
        self.up = asyncio.Event()
        self.changed = asyncio.Condition()
        self.generation = 0
        self.writer: Client | None = None
        self.host: Any = None
        self.n = itertools.count()
        self.turns: dict[str, str] = {}
        self.kills = 0
        self.bursts = 0
        self.dropped = 0

    def notify(self) -> None:
        self.generation += 1

        async def tell() -> None:
            async with self.changed:
                self.changed.notify_all()

        asyncio.get_running_loop().create_task(tell())

    async def changed_after(self, generation: int) -> None:
        async with asyncio.timeout(WAIT), self.changed:
            await self.changed.wait_for(lambda: self.generation != generation)

    async def attached(self, w: Watcher) -> None:
        async with asyncio.timeout(WAIT * 4), self.changed:
            await self.changed.wait_for(lambda: w.attached)

    async def start(self) -> None:
        self.host = await self.start_host(self.data, socket=self.path)
        self.writer = await self.host.connect()
        await self.writer.handshake()
        self.up.set()
        self.notify()

    async def overflows(self) -> int:
        """Watchers the host dropped for not reading, since the host started."""
        assert self.writer is not None
        return int((await self.writer.call("host.stats"))["counters"].get("watch.overflows", 0))

    async def kill(self) -> None:
        self.dropped += await self.overflows()
        self.up.clear()
        await self.host.kill()
        self.kills += 1
        await self.start()

    async def call(self, method: str, **params: Any) -> Any:
        assert self.writer is not None
        try:
            return await self.writer.call(method, **params)
        except RpcError as exc:  # the random calls may be refused: that is no failure
            return exc

    async def step(self, stalled: list[str]) -> None:
        rng, sid = self.rng, self.rng.choice(SIDS)
        mid = f"m{next(self.n)}"
        bursts = 12 if stalled else 0  # big lines drop a watcher that stopped reading
        op = rng.choices(
            ["append", "burst", "turn", "rewrite", "recreate"], weights=(50, bursts, 20, 10, 2)
        )[0]
        if op == "append":
            await self.call("session.appendMessage", sessionId=sid, message=msg(mid))
        elif op == "burst":  # big lines: enough to drop a watcher that stopped reading
            sid = rng.choice(stalled or SIDS)
            self.bursts += 1
            for i in range(48):
                body = msg(f"{mid}-{i}", content="x" * 400_000)
                await self.call("session.appendMessage", sessionId=sid, message=body)
        elif op == "turn":
            await self._turn(sid, mid)
        elif op == "rewrite":
            await self._rewrite(sid, mid)
        else:
            await self.call("session.delete", sessionId=sid)
            await self.call("session.create", sessionId=sid)
            self.turns.pop(sid, None)
        self.notify()

    async def _turn(self, sid: str, mid: str) -> None:
        tid = self.turns.get(sid)
        if tid is None:
            tid = self.turns[sid] = f"t{mid}"
            prompt = msg(f"{mid}u", "user")
            await self.call("session.beginTurn", sessionId=sid, turnId=tid, prompt=prompt)
            return
        what = self.rng.choice(["checkpoint", "live", "reply", "end"])
        reply = msg(f"{tid}r", "assistant", content=f"reply {mid}")
        if what == "checkpoint":
            await self.call("session.saveInflightMessage", sessionId=sid, turnId=tid, message=reply)
        elif what == "live":
            await self.call("session.publish", sessionId=sid, turnId=tid, data={"delta": mid})
        elif what == "reply":
            await self.call("session.appendMessage", sessionId=sid, message=reply, turnId=tid)
        else:
            del self.turns[sid]
            await self.call("session.endTurn", sessionId=sid, turnId=tid, status="completed")

    async def _rewrite(self, sid: str, mid: str) -> None:
        got = await self.call("session.get", sessionId=sid, limit=8)
        if isinstance(got, RpcError) or not got["messages"]:
            return
        target = self.rng.choice(got["messages"])["id"]
        how = self.rng.choice(["update", "delete", "truncate", "replace"])
        if how == "update":
            body = msg(target, content=f"edited {mid}")
            await self.call("session.updateMessage", sessionId=sid, message=body)
        elif how == "delete":
            await self.call("session.deleteMessages", sessionId=sid, messageIds=[target])
        elif how == "truncate":
            await self.call("session.truncateFrom", sessionId=sid, fromMessageId=target)
            self.turns.pop(sid, None)  # a cut ends a running turn
        else:
            keep = got["messages"][-3:]
            await self.call("session.replaceMessages", sessionId=sid, messages=keep)

    async def settle(self, watchers: list[Watcher]) -> None:
        """Every watcher reading and attached; wait until each one took live data sent
        after everything else (so it has every change before it)."""
        for w in watchers:
            w.reading.set()
            w.attach()
        for n, sid in enumerate(SIDS):
            await self.caught_up([w for w in watchers if w.sid == sid], n)

    async def caught_up(self, mine: list[Watcher], n: int) -> None:
        """Wait until each of ``mine`` (all of one session) took live data ``n``. Live data
        reaches only a watcher that caught up, so it is sent again, a call at a time (each
        a round trip to the host, while the watchers read), until every one has it."""
        sid, marker = mine[0].sid, {"marker": n}
        async with asyncio.timeout(WAIT * 4):
            while not all(n in w.markers for w in mine):
                for w in mine:
                    if w.task.done():
                        w.task.result()  # a watcher that failed fails the test
                await self.call("session.publish", sessionId=sid, turnId="x", data=marker)


async def all_lines(client: Client, sid: str) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    end = (await client.call("session.get", sessionId=sid, limit=0))["totalLines"]
    while end > 0:
        page = await client.call("session.get", sessionId=sid, beforeLine=end, limit=64)
        lines[:0] = page["messages"]
        end = page["startLine"]
    return lines


async def run_model(start_host: StartHost, tmp_path: Path, seed: int, steps: int) -> None:
    model = Model(start_host, tmp_path / "data", tmp_path / "run" / "host.sock", seed)
    await model.start()
    for sid in SIDS:
        await model.call("session.create", sessionId=sid)
    watchers = [Watcher(f"w{i}", SIDS[i % len(SIDS)], model) for i in range(6)]
    rng = model.rng
    try:
        for _ in range(steps):
            roll = rng.random()
            w = rng.choice(watchers)
            if roll < 0.03:
                await model.kill()
            elif roll < 0.08:
                w.detach() if w.attached else w.attach()
            elif roll < 0.13:
                if w.reading.is_set():
                    if w.attached:  # live first: a watcher catching up waits on its own
                        await model.caught_up([w], 1000 + next(model.n))
                    w.reading.clear()  # it stops reading its connection
                else:
                    w.reading.set()
            else:
                await model.step([w.sid for w in watchers if not w.reading.is_set()])
        try:
            await model.settle(watchers)
        except TimeoutError:  # say where each watcher stands
            for w in watchers:
                print(w.name, w.sid, w.attached, w.reading.is_set(), w.cursor, w.reread, w.where)
            raise
        for w in watchers:
            want = await all_lines(model.writer, w.sid)
            assert (w.dups, w.gaps) == (0, 0), w.name
            assert w.lines == want, (w.name, w.sid, w.resets)
        dropped = model.dropped + await model.overflows()
        print(f"\nseed {seed}: {model.bursts} bursts, {dropped} watchers dropped for not reading")
        resets = sum((w.resets for w in watchers), Counter())
        print(f"seed {seed}: {steps} steps, {model.kills} kills, resets {dict(resets)}")
    finally:
        for w in watchers:
            w.task.cancel()
        await asyncio.gather(*(w.task for w in watchers), return_exceptions=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [1, 2])
async def test_watchers_rebuild_every_session_through_kills_and_rewrites(
    start_host: StartHost, tmp_path: Path, seed: int
) -> None:
    await run_model(start_host, tmp_path, seed, steps=160)
