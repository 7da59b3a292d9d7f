"""Watch edges a review of this stop's fixes found (red at 681ded8..f797d72): a call on
another session letting go sent a running call's events before its answer (the fan-out now
takes only the released session's notes), and a pause that overflowed a watcher whose last
event was queued dropped that event, so its client never heard of the end."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import Client, msg
from tests.e2e.test_watch_edges import Order, settle


async def test_begin_turn_answers_before_its_events_while_another_session_is_busy(
    client: Client,
) -> None:
    """Another session's calls letting go while beginTurn still holds its session do not
    send beginTurn's events before its answer."""
    await client.call("session.create", sessionId="s")
    await client.call("session.create", sessionId="b")
    await client.call("session.appendMessage", sessionId="b", message=msg("b0"))
    await client.call("session.watch", sessionId="s")
    order = Order(client)
    bad: list[list[str]] = []
    for i in range(20):
        rid = client.next_id()
        fut = client.expect(rid)
        lines = [
            {
                "jsonrpc": "2.0",
                "id": rid,
                "method": "session.beginTurn",
                "params": {"sessionId": "s", "turnId": f"t{i}", "prompt": msg(f"u{i}")},
            }
        ]
        for _ in range(100):  # another session's calls, each letting go of it in turn
            lines.append(
                {
                    "jsonrpc": "2.0",
                    "id": client.next_id(),
                    "method": "session.get",
                    "params": {"sessionId": "b"},
                }
            )
        start = len(order)
        await client.send_raw(b"".join(json.dumps(x).encode() + b"\n" for x in lines))
        await client.wait(fut)
        await settle(client, "s", order)
        seen = [
            o
            for o in order[start:]
            if o == f"answer:{rid}" or o in ("event:turn", "event:appended")
        ]
        if seen[0] != f"answer:{rid}":
            bad.append(seen)
        await client.call("session.endTurn", sessionId="s", turnId=f"t{i}", status="completed")
        await settle(client, "s", order)  # its turn event out before the next round
    assert not bad, bad[:3]


async def _read_until(s: Any, done: Any, buf: bytearray, timeout: float = 10.0) -> None:
    import asyncio
    import time

    def run() -> None:
        import select

        end = time.monotonic() + timeout
        seen = max(0, len(buf) - 16)
        while not done(buf[seen:]) and time.monotonic() < end:
            if not select.select([s], [], [], 0.5)[0]:
                continue
            chunk = s.recv(4 << 20)
            if not chunk:
                return
            seen = max(0, len(buf) - 16)
            buf.extend(chunk)

    await asyncio.to_thread(run)


async def test_an_ending_watcher_past_its_bound_at_a_pause_is_told(
    start_host: Any, tmp_path: Any
) -> None:
    """A paused client's watcher holds one event past the bound (one alone is allowed),
    then gets its last event (the session deleted: pushed unbounded). The next pause
    (Outlet.paused checks the queues since 681ded8) overflows it: its queue is dropped,
    the deleted event with it, and overflow's reset is not queued (push returns at once
    for a watcher already ending). The client never hears of the delete nor of a reset;
    the watcher stays in its outlet for good (a watch slot of the connection)."""
    import asyncio
    import socket

    path = tmp_path / "run" / "h.sock"
    host = await start_host(socket=path)
    x = await host.connect()
    await x.handshake()
    others = [f"a{i}" for i in range(1, 121)]
    sids = ["a0", *others, "t"]
    for sid in sids:
        await x.call("session.create", sessionId=sid)
    w = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    w.connect(str(path))
    reqs = [{"jsonrpc": "2.0", "id": "h", "method": "handshake", "params": {"protocolVersion": 11}}]
    reqs += [
        {
            "jsonrpc": "2.0",
            "id": f"w-{sid}",
            "method": "session.watch",
            "params": {"sessionId": sid},
        }
        for sid in sids
    ]
    w.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in reqs))
    buf = bytearray()
    await _read_until(w, lambda b: False, buf, timeout=1)
    assert buf.count(b"\n") == len(reqs)
    watch_ids = {}
    for line in bytes(buf).split(b"\n")[:-1]:
        m = json.loads(line)
        if str(m.get("id", "")).startswith("w-"):
            watch_ids[m["id"][2:]] = m["result"]["watchId"]
    t_watch = watch_ids["t"]
    del buf[:]
    big = "z" * 100_000
    for i in range(100):  # the watcher's client stops reading: its connection pauses
        await x.call("session.appendMessage", sessionId="a0", message=msg(f"p{i}", content=big))
    for sid in others:  # 450 KB queued for each, under the 1 MiB bound: 54 MB in all
        await x.batch(
            [
                x.envelope(
                    "session.appendMessage",
                    {"sessionId": sid, "message": msg(f"q{i}", content="q" * 90_000)},
                    rid=f"{sid}-{i}",
                )
                for i in range(5)
            ]
        )
    await x.call(
        "session.appendMessage", sessionId="t", message=msg("one", content="y" * 1_500_000)
    )
    await x.call("session.delete", sessionId="t")  # t's watcher: [1.5 MB, deleted], ending
    # Read 6 MiB (the connection resumes), then stop: the host writes on round-robin
    # (one event of each other watcher, ~10.8 MB, before t's) and pauses again.
    await _read_until(w, lambda b: len(buf) >= 6 << 20, buf, timeout=10)
    await asyncio.sleep(1.0)
    await _read_until(w, lambda b: False, buf, timeout=5)  # everything else
    w.close()
    kinds = []
    for line in bytes(buf).split(b"\n")[:-1]:
        m = json.loads(line)
        if (
            isinstance(m, dict)
            and m.get("method") == "session.event"
            and m["params"]["watchId"] == t_watch
        ):
            kinds.append(m["params"]["event"]["kind"])
    overflowed = [ln for ln in host.log_lines if "of t: its client fell behind" in ln]
    assert kinds and kinds[-1] in ("deleted", "reset"), (kinds, overflowed)
