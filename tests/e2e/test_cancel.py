"""$/cancelRequest: a request still waiting for its session's lock is answered
REQUEST_CANCELLED and does nothing.

Over the wire, "still waiting" is made deterministic by putting the request and its
cancel in one write of less than PIPE_BUF (4096) bytes, behind another call on the same
session: a pipe delivers such a write whole, the host reads it in one go and handles every
line of it before any call's task runs, so the cancel always reaches a request queued
behind the first, which holds the lock. (A request whose task already waits on the lock
is covered in-process, in tests/host/test_endpoint.py, where the test itself can hold
the lock.)
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Client, HostProcess, dumps, msg, transcript

PIPE_BUF = 4096


def _one_write(client: Client, items: list[dict[str, object]]) -> bytes:
    data = b"".join(dumps(item) + b"\n" for item in items)
    assert len(data) < PIPE_BUF  # delivered (and read by the host) in one piece
    return data


async def _stored_ids(data_dir: Path) -> list[str]:
    raw = transcript(data_dir, "s").read_bytes()
    return [json.loads(line)["id"] for line in raw.split(b"\n")[:-1]]


async def test_cancel_of_a_request_waiting_for_its_lock(
    host: HostProcess, client: Client, data_dir: Path
) -> None:
    c = client
    await c.call("session.create", sessionId="s")
    first, waiting = c.expect(1), c.expect(2)
    await c.send_raw(
        _one_write(
            c,
            [
                c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("a")}, 1),
                c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("b")}, 2),
                c.envelope("$/cancelRequest", {"id": 2}),
            ],
        )
    )
    # End of input right behind: the host finishes everything in flight, then closes, so
    # a missing reply shows up at once as a closed connection instead of a hang.
    await c.close_input()
    assert (await c.wait(first))["result"] == {"line": 0, "appended": True}
    reply = await c.wait(waiting)
    assert reply["error"]["code"] == -32800
    assert reply["error"]["data"]["code"] == "REQUEST_CANCELLED"
    assert await host.wait() == 0
    assert await _stored_ids(data_dir) == ["a"]


async def test_cancel_inside_a_batch(host: HostProcess, client: Client, data_dir: Path) -> None:
    c = client
    await c.call("session.create", sessionId="s")
    fut = c.expect_batch([1, 2])
    items = [
        c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("a")}, 1),
        c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("b")}, 2),
        c.envelope("$/cancelRequest", {"id": 2}),
    ]
    await c.send_raw(dumps(items) + b"\n")
    await c.close_input()
    by_id = {r["id"]: r for r in await c.wait(fut)}
    assert by_id[1]["result"] == {"line": 0, "appended": True}
    assert by_id[2]["error"]["data"]["code"] == "REQUEST_CANCELLED"
    assert await host.wait() == 0
    assert await _stored_ids(data_dir) == ["a"]


async def test_a_cancel_after_the_answer_changes_nothing(client: Client, data_dir: Path) -> None:
    await client.call("session.create", sessionId="s")
    resp = await client.request(
        "session.appendMessage", {"sessionId": "s", "message": msg("a")}, rid=41
    )
    assert resp["result"] == {"line": 0, "appended": True}
    await client.notify("$/cancelRequest", id=41)
    await client.notify("$/cancelRequest", id="never-sent")
    await client.notify("$/cancelRequest", bogus=True)
    assert [m["id"] for m in (await client.call("session.get", sessionId="s"))["messages"]] == ["a"]
    assert client.unmatched == []


async def test_a_cancel_names_only_its_own_id_type(client: Client, data_dir: Path) -> None:
    """Cancelling id "2" (a string) must not cancel request 2 (a number)."""
    c = client
    await c.call("session.create", sessionId="s")
    first, second = c.expect(1), c.expect(2)
    await c.send_raw(
        _one_write(
            c,
            [
                c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("a")}, 1),
                c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("b")}, 2),
                c.envelope("$/cancelRequest", {"id": "2"}),
            ],
        )
    )
    assert (await c.wait(first))["result"]["appended"] is True
    assert (await c.wait(second))["result"] == {"line": 1, "appended": True}
    assert await _stored_ids(data_dir) == ["a", "b"]
    assert (await c.call("host.stats"))["counters"]["locks.held"] == 0


async def test_a_cancelled_request_leaves_no_lock_behind(client: Client, data_dir: Path) -> None:
    c = client
    await c.call("session.create", sessionId="s")
    futs = [c.expect(i) for i in (1, 2, 3)]
    await c.send_raw(
        _one_write(
            c,
            [
                c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("a")}, 1),
                c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("b")}, 2),
                c.envelope("$/cancelRequest", {"id": 2}),
                c.envelope("session.appendMessage", {"sessionId": "s", "message": msg("c")}, 3),
            ],
        )
    )
    replies = [await c.wait(f) for f in futs]
    assert replies[0]["result"] == {"line": 0, "appended": True}
    assert replies[1]["error"]["data"]["code"] == "REQUEST_CANCELLED"
    assert replies[2]["result"] == {"line": 1, "appended": True}
    assert await _stored_ids(data_dir) == ["a", "c"]
    counters = (await c.call("host.stats"))["counters"]
    assert counters["locks.held"] == 0
