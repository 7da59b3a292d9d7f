"""Watch edges a review of issue 34 found on main (8ac0e14), each red there: a call's
events went out before its answer when the call went on after noting them; a watcher that
never reads was handed a whole group commit's events in one write; a reset that failed
dropped its watchers without a word."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host._limits import WATCHES_PER_CONNECTION
from tests.conftest import Client, RpcError, StartHost, msg


class Order(list[str]):
    """Every line a client reads, as 'event:<kind>' or 'answer:<id>', in arrival order."""

    def __init__(self, client: Client) -> None:
        super().__init__()
        self.grew = asyncio.Event()
        dispatch = client._dispatch

        def take(m: Any) -> None:
            if isinstance(m, dict) and m.get("method") == "session.event":
                self.append("event:" + m["params"]["event"]["kind"])
            elif isinstance(m, dict):
                self.append(f"answer:{m.get('id')}")
            self.grew.set()
            dispatch(m)

        client._dispatch = take  # type: ignore[method-assign]

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not done():
                self.grew.clear()
                await self.grew.wait()


def record_order(client: Client) -> Order:
    return Order(client)


async def settle(client: Client, sid: str, order: Order) -> None:
    """Publish a mark on the session and wait for its event: every event of the calls
    before it is out (the session's calls are queued in order)."""
    seen = order.count("event:live")
    await client.call("session.publish", sessionId=sid, turnId="x", data="mark")
    await order.until(lambda: order.count("event:live") > seen)


async def answered_then(client: Client, order: Order, method: str, **params: Any) -> list[str]:
    """Send one call on the watching connection; its answer and the events, in order."""
    rid = client.next_id()
    fut = client.expect(rid)
    line = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    await client.send_raw(json.dumps(line).encode() + b"\n")
    await client.wait(fut)
    await settle(client, params["sessionId"], order)
    return [o for o in order if o == f"answer:{rid}" or o.startswith("event:")]


async def test_begin_turn_answers_before_its_events(client: Client) -> None:
    """beginTurn notes its turn, then waits on the index: its events come after its answer."""
    await client.call("session.create", sessionId="s")
    await client.call("session.watch", sessionId="s")
    order = record_order(client)
    got = await answered_then(
        client, order, "session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1")
    )
    assert got[0].startswith("answer:") and got[1:3] == ["event:turn", "event:appended"], got


async def test_an_append_that_settles_a_checkpoint_answers_before_its_event(
    client: Client,
) -> None:
    """A streamed reply's last append removes its checkpoint (a thread) after its line was
    noted: the appended event still comes after the answer."""
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1")
    part = msg("r1", "assistant", content="Hel")
    await client.call("session.saveInflightMessage", sessionId="s", turnId="t1", message=part)
    order = record_order(client)
    await client.call("session.watch", sessionId="s")
    await order.until(lambda: "event:checkpoint" in order)  # the replay's last: live now
    del order[:]
    final = msg("r1", "assistant", content="Hello")
    got = await answered_then(
        client, order, "session.appendMessage", sessionId="s", message=final, turnId="t1"
    )
    assert got[:2] == [got[0], "event:appended"] and got[0].startswith("answer:"), got


async def _stalled_watcher(path: str, sid: str) -> socket.socket:
    """A socket client that handshakes, watches ``sid``, then stops reading."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"handshake","params":{"protocolVersion":11}}\n')
    req = {"jsonrpc": "2.0", "id": 2, "method": "session.watch", "params": {"sessionId": sid}}
    s.sendall(json.dumps(req).encode() + b"\n")
    buf = b""
    while buf.count(b"\n") < 2:
        buf += await asyncio.to_thread(s.recv, 65536)
    return s


async def test_a_watcher_that_never_reads_is_held_to_its_bound_in_a_group_commit(
    start_host: StartHost, tmp_path: Path
) -> None:
    """40 appends of 1 MiB in one batch line (one group commit, one fan-out pass): a
    watcher that never reads gets what fits its bounds (4 MiB unread, 1 MiB queued, the
    one being written, the kernel's buffer), then an overflow reset, not all 40 MiB."""
    path = tmp_path / "run" / "h.sock"
    host = await start_host(socket=path)
    writer = await host.connect()
    await writer.handshake()
    await writer.call("session.create", sessionId="s")
    stalled = await _stalled_watcher(str(path), "s")
    batch = [
        writer.envelope(
            "session.appendMessage",
            {"sessionId": "s", "message": msg(f"a{i}", content="z" * (1 << 20))},
            rid=f"b{i}",
        )
        for i in range(40)
    ]
    await writer.batch(batch)
    await writer.call("session.appendMessage", sessionId="s", message=msg("after"))
    kinds: list[str] = []
    stalled.settimeout(5.0)
    buf = b""
    while "reset" not in kinds:
        chunk = await asyncio.to_thread(stalled.recv, 1 << 20)
        assert chunk, kinds
        buf += chunk
        *lines, buf = buf.split(b"\n")
        kinds += [json.loads(line)["params"]["event"]["kind"] for line in lines]
    stalled.close()
    assert kinds.count("appended") <= 8 and kinds[-1] == "reset", kinds


async def test_a_watcher_whose_reset_fails_is_told(client: Client, data_dir: Path) -> None:
    """A rewrite's reset that cannot be made (the watch folder swapped for a link: the new
    epoch cannot be written; a full disk takes the same path) ends the watch with a reset,
    never silently."""
    order = record_order(client)
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a0"))
    w = await client.call("session.watch", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("a1"))
    watch, aside = data_dir / "watch", data_dir / "watch-real"
    os.rename(watch, aside)
    os.symlink(aside, watch)
    with pytest.raises(RpcError) as refused:  # its epoch cannot be ended on disk
        await client.call("session.deleteMessages", sessionId="s", messageIds=["a0"])
    assert refused.value.name == "STORAGE_ERROR"
    await order.until(lambda: "event:reset" in order)
    os.unlink(watch)
    os.rename(aside, watch)
    assert [o for o in order if o.startswith("event:")] == ["event:appended", "event:reset"]
    assert await client.call("session.unwatch", watchId=w["watchId"]) == {"unwatched": False}


async def test_a_cursor_of_a_session_removed_by_hand_is_not_honoured_by_its_successor(
    start_host: StartHost, data_dir: Path
) -> None:
    """A session's files removed while the host was down (its epoch file left behind), then
    a new session of that id: an old cursor names lines that are not there; it expires."""
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    await host.client.call("session.create", sessionId="s")
    await host.client.call("session.appendMessage", sessionId="s", message=msg("old"))
    cursor = (await host.client.call("session.watch", sessionId="s"))["cursor"]
    assert await host.stop() == 0
    for path in (data_dir / "sessions").glob("s.*"):
        path.unlink()
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    await host.client.call("session.create", sessionId="s")
    await host.client.call("session.appendMessage", sessionId="s", message=msg("new"))
    got = await host.client.call("session.watch", sessionId="s", after=cursor)
    assert got["cursor"] != cursor, "the old cursor was honoured against another transcript"


async def test_a_turn_log_cut_by_hand_is_passed_over_by_a_catch_up(
    start_host: StartHost, tmp_path: Path, data_dir: Path
) -> None:
    """A turn log whose last record lost its newline (cut by hand while the host runs):
    a catch-up over it replays the whole records and goes live (it spun for good)."""
    host = await start_host(socket=tmp_path / "run" / "h.sock")
    writer, late = await host.connect(), await host.connect()
    await writer.handshake()
    await late.handshake()
    order, late_order = Order(writer), Order(late)
    await writer.call("session.create", sessionId="s")
    start = (await writer.call("session.watch", sessionId="s"))["cursor"]
    await writer.call("session.beginTurn", sessionId="s", turnId="t1")
    await writer.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    log = data_dir / "sessions" / "s.turns.log"
    log.write_bytes(log.read_bytes()[:-1])
    await late.call("session.watch", sessionId="s", after=start)
    async with asyncio.timeout(10):  # a publish reaches the late watcher once it is live
        while "event:live" not in late_order:
            await settle(writer, "s", order)
    assert late_order.count("event:turn") == 1, late_order  # t1 begun; its end cut off


async def test_a_cursor_inside_a_turn_log_record_is_invalid_params(client: Client) -> None:
    """A cursor's turn offset must end a record of the log, as every cursor the host gives
    does: one forged to fall inside the first record was honoured, and the change it cut
    was passed over as "not a record", silently (an honest watch replays it)."""
    await client.call("session.create", sessionId="s")
    await client.call("session.beginTurn", sessionId="s", turnId="t1")
    await client.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    cursor = (await client.call("session.watch", sessionId="s"))["cursor"]
    epoch, lines, turns, tag = cursor.split(".")
    end = int(turns)  # where the last record ends: an honest offset
    replayed = await client.call("session.watch", sessionId="s", after=f"{epoch}.{lines}.0.{tag}")
    assert replayed["cursor"] == f"{epoch}.{lines}.0.{tag}"
    for inside in (1, 10, end - 1):
        forged = f"{epoch}.{lines}.{inside}.{tag}"
        with pytest.raises(RpcError) as err:
            await client.call("session.watch", sessionId="s", after=forged)
        assert err.value.name == "INVALID_PARAMS", err.value.error


async def test_catch_ups_of_a_client_that_never_reads_read_only_what_it_can_take(
    start_host: StartHost, tmp_path: Path
) -> None:
    """256 watches from a session's start on one connection whose client reads nothing:
    each catch-up read its first chunk from the files under the session, all before the
    client had taken a byte (the writer's appends waited behind 256 reads: 50x slower
    in a probe). A connection's catch-ups read one chunk at a time, each once what was
    read before was handed on, so reading stops where the client stops taking."""
    path = tmp_path / "run" / "h.sock"
    host = await start_host(socket=path)
    writer = await host.connect()
    await writer.handshake()
    await writer.call("session.create", sessionId="s")
    for i in range(40):  # a chunk a line
        line = msg(f"a{i}", content="z" * (200 << 10))
        await writer.call("session.appendMessage", sessionId="s", message=line)
    epoch = (await writer.call("session.watch", sessionId="s"))["cursor"].split(".")[0]
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(str(path))
    hello = {"jsonrpc": "2.0", "id": 0, "method": "handshake", "params": {"protocolVersion": 11}}
    watches = [
        {
            "jsonrpc": "2.0",
            "id": i,
            "method": "session.watch",
            "params": {"sessionId": "s", "after": f"{epoch}.0.0.0"},
        }
        for i in range(1, 257)
    ]
    stalled.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in [hello, *watches]))
    async with asyncio.timeout(30):  # each stats answer comes after the lines read before it
        started = 0
        while started < 257:
            started = (await writer.call("host.stats"))["counters"].get("watch.started", 0)
    for i in range(3):  # each answered after every read queued on the session before it
        await writer.call("session.appendMessage", sessionId="s", message=msg(f"w{i}"))
    chunks = (await writer.call("host.stats"))["counters"].get("watch.chunks", 0)
    stalled.close()
    assert 0 < chunks < 64, chunks  # 4 MiB unread, the kernel's buffer: about 25


async def test_watches_sent_at_once_are_held_to_the_connection_bound(client: Client) -> None:
    """Found at 4d444d5 (helper-20's watch pass): the bound was checked before a watch
    waited for its session and its epoch's fsync, so 2,000 watches sent in one write all
    passed it; sent one at a time they stop at 256."""
    n = WATCHES_PER_CONNECTION + 40
    for i in range(n):
        await client.call("session.create", sessionId=f"s{i}")
    ids = [client.next_id() for _ in range(n)]
    futs = [client.expect(rid) for rid in ids]
    lines = [
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": rid,
                "method": "session.watch",
                "params": {"sessionId": f"s{i}"},
            }
        ).encode()
        + b"\n"
        for i, rid in enumerate(ids)
    ]
    await client.send_raw(b"".join(lines))
    answers = [await client.wait(f) for f in futs]
    refused = [a for a in answers if "error" in a]
    assert len(answers) - len(refused) == WATCHES_PER_CONNECTION
    assert {a["error"]["data"]["limit"] for a in refused} == {WATCHES_PER_CONNECTION}


async def test_a_cursor_spelled_otherwise_than_the_host_gives_is_invalid_params(
    client: Client,
) -> None:
    """Found at 4d444d5 (helper-20): leading zeros were honoured and answered with the
    host's spelling, so a client comparing ``cursor`` with ``after`` (as the protocol says
    to) waited for a reset that never came; a tag no CRC-32 can be was taken too."""
    await client.call("session.create", sessionId="s")
    await client.call("session.appendMessage", sessionId="s", message=msg("m1"))
    cursor = (await client.call("session.watch", sessionId="s"))["cursor"]
    epoch, lines, turns, tag = cursor.split(".")
    for forged in (
        f"{epoch}.0{lines}.{turns}.{tag}",
        f"{epoch}.{lines}.00.{tag}",
        f"{epoch}.{lines}.{turns}.0{tag}",
        f"{epoch}.{lines}.{turns}.{1 << 32}",
    ):
        with pytest.raises(RpcError) as err:
            await client.call("session.watch", sessionId="s", after=forged)
        assert err.value.name == "INVALID_PARAMS", (forged, err.value.error)
    assert (await client.call("session.watch", sessionId="s", after=cursor))["cursor"] == cursor


async def test_a_save_active_revision_that_stamps_nothing_resets_no_watcher(
    client: Client,
) -> None:
    """Found at 4d444d5 (helper-20): a saveActiveRevision that only archived (``stamped:
    false``, the transcript untouched) ended the epoch: every watcher was reset and every
    saved cursor expired, each client re-reading the whole transcript."""
    await client.call("session.create", sessionId="s")
    for m in (msg("u1"), msg("a1", "assistant")):
        await client.call("session.appendMessage", sessionId="s", message=m)
    await client.call("session.saveActiveRevision", sessionId="s")  # stamps u1
    order = record_order(client)
    cursor = (await client.call("session.watch", sessionId="s"))["cursor"]
    again = await client.call("session.saveActiveRevision", sessionId="s")
    assert again["stamped"] is False and again["archived"] == 1, again
    await settle(client, "s", order)
    assert "event:reset" not in order, order
    assert (await client.call("session.watch", sessionId="s", after=cursor))["cursor"] == cursor
