"""Rows the host could never store: refused at enqueue, set aside by the drain (issue 29).

The rows here are what a real agent runtime hands over when nothing maps its events: pi
0.73.1's echoed prompt has no ``id``, its tool results have role ``toolResult``, and a
tool call id from OpenAI's Responses API holds ``|`` (``call_...|fc_...``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from outbox import Journal, Outbox, RemoteError
from outbox._journal import Entry, _sealed
from tests.outbox.kit import FakeHost, python, spawned, stored

ECHO = {  # pi's message_end for the prompt it was sent, verbatim (fixtures: text.jsonl)
    "role": "user",
    "content": [{"type": "text", "text": "[text] Say something about stores."}],
    "timestamp": 1796516198780,
}
TOOL_RESULT = {  # pi's tool row, verbatim but for an id (fixtures: tool.jsonl)
    "id": "call_mock_1",
    "role": "toolResult",
    "toolCallId": "call_mock_1",
    "toolName": "bash",
    "content": [{"type": "text", "text": "hi\n"}],
    "isError": False,
    "timestamp": 1796516206788,
}


def ok(mid: str, **extra: Any) -> dict[str, Any]:
    return {"id": mid, "role": "assistant", "content": [{"type": "text", "text": mid}], **extra}


# (session, message, turnId) the host refuses at every try, and a word of the reason.
BAD: dict[str, tuple[str, dict[str, Any], str | None, str]] = {
    "echoed prompt, no id": ("s", ECHO, None, "missing required field `id`"),
    "role toolResult": ("s", TOOL_RESULT, None, "'toolResult'"),
    "id with a bar": ("s", ok("call_1|fc_2"), None, "regex"),
    "id too long": ("s", ok("a" * 129), None, "regex"),
    "id is ..": ("s", ok(".."), None, "regex"),
    "id not a string": ("s", {"id": 7, "role": "user"}, None, "Expected `str`"),
    "status outside the contract": ("s", ok("a1", status="done"), None, "'done'"),
    "display-capped copy": ("s", ok("a1", capped=True), None, "capped"),
    "turnId in the message": ("s", ok("a1", turnId="t/1"), None, "regex"),
    "turnId of the call": ("s", ok("a1"), "t 1", "turnId"),
    "sessionId": ("../s", ok("a1"), None, "sessionId"),
}
GOOD: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "plain": ("s", ok("g1"), "t1"),
    "every id character": ("s", ok("Az09._:-"), None),
    "id of 128": ("s", ok("b" * 128), None),
    "turnId null in the message": ("s", ok("g2", turnId=None), None),
    "status error": ("s", ok("g3", status="error"), None),
    "capped false": ("s", ok("g4", capped=False), None),
    "pager fields (the host drops them)": ("s", ok("g5", revisionCount="x"), None),
    "tool row": ("s", {**TOOL_RESULT, "id": "t1:tool:call_mock_1", "role": "tool"}, "t1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
async def test_enqueue_refuses_a_row_the_host_could_never_store(tmp_path: Path, case: str) -> None:
    sid, message, turn, why = BAD[case]
    path = str(tmp_path / "outbox.jsonl")
    async with Outbox.open(path) as box:
        with pytest.raises(ValueError, match="row refused") as err:
            await box.enqueue(sid, message, turn)
        assert why in str(err.value)
        await box.enqueue("s", ok("after"), "t1")  # the outbox goes on
    async with Journal.open(path) as journal:
        kept = [msgspec.json.decode(e.message)["id"] for e in journal.pending.values()]
    assert kept == ["after"], "a refused row never enters the journal"


async def test_the_outbox_refuses_exactly_the_rows_the_host_refuses(tmp_path: Path) -> None:
    cases = {
        **{k: (*v[:3], True) for k, v in BAD.items()},
        **{k: (*v, False) for k, v in GOOD.items()},
    }
    async with (
        Outbox.open(str(tmp_path / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        disagree = []
        for case, (sid, message, turn, bad) in sorted(cases.items()):
            try:
                await box.enqueue(sid, message, turn)
                outbox_refused = False
            except ValueError:
                outbox_refused = True
            params: dict[str, Any] = {"sessionId": sid, "message": message}
            if turn is not None:
                params["turnId"] = turn
            try:
                await client.call("session.appendMessage", params)
                host_refused = False
            except RemoteError as exc:
                assert exc.name in ("INVALID_PARAMS", "CONFLICT"), (case, exc)
                host_refused = True
            if not outbox_refused == host_refused == bad:
                disagree.append((case, outbox_refused, host_refused))
        assert not disagree, "(case, outbox refused, host refused)"


def _write_journal(path: Path, entries: list[tuple[str, dict[str, Any], str | None]]) -> None:
    """A journal as an app written before enqueue checked rows would have left it."""
    enc = msgspec.json.Encoder()
    lines = [
        _sealed(enc.encode(Entry(seq, sid, msgspec.Raw(enc.encode(m)), turn)))
        for seq, (sid, m, turn) in enumerate(entries, start=1)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))


async def test_a_journal_holding_an_id_less_entry_sets_it_aside_and_drains_the_rows_behind_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "app" / "outbox.jsonl"
    _write_journal(
        path,
        [
            ("s", ok("a0"), "t1"),
            ("s", ECHO, "t1"),  # what TurnDriver.run journaled before it raised KeyError
            ("s", ok("a1"), "t1"),
            ("s", TOOL_RESULT, "t1"),
            ("s", ok("a2"), "t1"),
            ("t", ok("b0"), None),
        ],
    )
    reported: list[tuple[int, str]] = []
    with caplog.at_level(logging.WARNING, logger="outbox"):
        async with Outbox.open(str(path)) as box, spawned(tmp_path / "host") as client:
            for sid in ("s", "t"):
                await client.call("session.create", {"sessionId": sid})
            box.on_set_aside = lambda entry, why: reported.append((entry.seq, why))
            box.attach(client)
            await box.drain(10.0)
            assert [m["id"] for m in await stored(client, "s")] == ["a0", "a1", "a2"]
            assert [m["id"] for m in await stored(client, "t")] == ["b0"]
            stats = await client.call("host.stats")
    assert stats["methods"]["session.appendMessage"]["count"] == 4, "set aside, never sent"
    assert [seq for seq, _ in reported] == [2, 4]
    assert "missing required field `id`" in reported[0][1]
    assert "'toolResult'" in reported[1][1]
    rejected = (tmp_path / "app" / "outbox.jsonl.rejected").read_text()
    aside = [json.loads(line) for line in rejected.splitlines()]
    assert [(r["seq"], r["sessionId"], r["turnId"]) for r in aside] == [
        (2, "s", "t1"),
        (4, "s", "t1"),
    ]
    assert [r["message"] for r in aside] == [ECHO, TOOL_RESULT], "kept with their bytes"
    assert all(r["reason"] == why for r, (_, why) in zip(aside, reported, strict=True))
    assert "entry 2 for session s dropped, set aside" in caplog.text
    async with Journal.open(str(path)) as journal:
        assert not journal.pending and not journal.refused, "never sent again"


async def test_drive_s_connect_sequence_sets_an_id_less_entry_aside_and_reports_it(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    async with spawned(data / "host") as client:
        await client.call("session.create", {"sessionId": "s"})
    _write_journal(
        data / "app" / "outbox.jsonl",
        [("s", ok("a0"), "t1"), ("s", ECHO, "t1"), ("s", ok("a1"), "t1")],
    )
    proc = await python(
        "-m", "outbox", "drive", "--recover-only", "--json", "--data-dir", str(data)
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    facts = [json.loads(line) for line in out.decode().splitlines()]
    aside = [f for f in facts if f["event"] == "setAside"]
    assert [(f["sessionId"], f["seq"]) for f in aside] == [("s", 2)]
    assert "missing required field `id`" in aside[0]["reason"]
    async with spawned(data / "host") as client:
        assert [m["id"] for m in await stored(client, "s")] == ["a0", "a1"]


async def test_rows_set_aside_are_kept_whole_when_the_disk_takes_part_of_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write may take part of what it is given (a filling disk, a big buffer): the rows
    set aside are acked only once all of them are in the file, fsynced."""
    path = tmp_path / "app" / "outbox.jsonl"
    _write_journal(path, [("s", ECHO, "t1"), ("s", TOOL_RESULT, "t1")])
    real_write = os.write

    def short_write(fd: int, data: Any) -> int:
        return real_write(fd, memoryview(data)[:16])  # 16 bytes a call, as POSIX allows

    async with Journal.open(str(path)) as journal:
        entries = [(e, "refused") for e in journal.pending.values()]
        monkeypatch.setattr(os, "write", short_write)
        await journal.set_aside(entries)
        monkeypatch.undo()
    rejected = (tmp_path / "app" / "outbox.jsonl.rejected").read_text()
    aside = [json.loads(line) for line in rejected.splitlines()]
    assert [r["message"] for r in aside] == [ECHO, TOOL_RESULT]
    async with Journal.open(str(path)) as journal:
        assert not journal.pending


HOST_DEPTH = 979
"""The deepest message the host reads inside a batch line on every call path, as the
outbox sends rows: its decoder runs some twenty frames down CPython's 1,000, and the first
append of a run one frame deeper than the next (979 there, 980 after; since every step of
a call runs in its task, both a frame less deep than before). The outbox takes the lower:
a row of 980 is refused, though a host warmed up would take it; two past, every path
refuses it (``PARSE_ERROR`` with the row's id)."""


def nested(mid: str, depth: int) -> bytes:
    """A row nesting ``depth`` levels (the message object is the first)."""
    return b'{"id":"%s","role":"tool","n":%s%s}' % (
        mid.encode(),
        b"[" * (depth - 1),
        b"]" * (depth - 1),
    )


def sized(mid: str, size: int) -> bytes:
    """A row of exactly ``size`` bytes."""
    head = b'{"id":"%s","role":"tool","content":"' % mid.encode()
    return head + b"x" * (size - len(head) - 2) + b'"}'


@pytest.mark.slow
async def test_the_outbox_takes_every_row_the_host_takes_up_to_its_limits(
    tmp_path: Path,
) -> None:
    """Nesting and size, at the host's bounds and one past them: the outbox refuses a row
    only when the host would (here, inside a batch, as the drain sends it)."""
    from host._wire import MAX_MESSAGE  # 64 MiB less the room kept for the host's fields

    cases = {
        "deepest": (nested("d0", HOST_DEPTH), False),
        "past every path's limit": (nested("d1", HOST_DEPTH + 2), True),
        "longest": (sized("b0", MAX_MESSAGE), False),
        "one byte longer": (sized("b1", MAX_MESSAGE + 1), True),
    }
    async with (
        Outbox.open(str(tmp_path / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        await client.call("session.create", {"sessionId": "direct"})
        warm = {"sessionId": "direct", "message": ok("warm")}
        await client.call("session.appendMessage", warm)  # (see HOST_DEPTH)
        disagree = []
        for case, (row, bad) in sorted(cases.items()):
            try:
                await box.enqueue("s", row, "t1")
                outbox_refused = False
            except ValueError:
                outbox_refused = True
            params = {"sessionId": "direct", "message": msgspec.Raw(row)}
            (result,) = await client.batch([("session.appendMessage", params)])
            host_refused = isinstance(result, RemoteError)
            if not outbox_refused == host_refused == bad:
                disagree.append((case, outbox_refused, host_refused))
        assert not disagree, "(case, outbox refused, host refused)"
        box.attach(client)
        await box.drain(20.0)
        assert [m["id"] for m in await stored(client, "s")] == ["d0", "b0"], "the drain's too"


async def test_a_row_the_host_cannot_parse_is_set_aside(tmp_path: Path) -> None:
    """``PARSE_ERROR`` with the row's id: the host could not read that message (nested a
    level past what its stack left it), and never will: it is set aside, not retried."""
    host = FakeHost()
    host.append_errors = ["PARSE_ERROR"]
    async with Outbox.open(str(tmp_path / "outbox.jsonl")) as box:
        box.attach(host)  # type: ignore[arg-type]
        await box.enqueue("s", ok("d0"), "t1")
        await box.enqueue("s", ok("after"), "t1")
        await box.drain(10.0)
        assert box.stats["dropped"] == 1 and box.depth == 0
    assert host.ids("s") == ["after"]
    aside = (tmp_path / "outbox.jsonl.rejected").read_text().splitlines()
    assert [json.loads(line)["message"]["id"] for line in aside] == ["d0"]


async def test_a_row_holding_half_a_surrogate_pair_is_taken_and_delivered(
    tmp_path: Path,
) -> None:
    """``JSON.stringify`` writes half an emoji as ``\\ud83d``; the host stores it, alone or
    in a batch. The outbox refused such rows while the host answered any batch line holding
    one ``LIMIT_EXCEEDED``, ``id: null`` (its batch decode counted 1,025 elements): both are
    mended, and the drain delivers the row as sent."""
    row = b'{"id":"h0","role":"tool","content":"Bonjour \\ud83d"}'
    async with (
        Outbox.open(str(tmp_path / "outbox.jsonl")) as box,
        spawned(tmp_path / "host") as client,
    ):
        await client.call("session.create", {"sessionId": "s"})
        await box.enqueue("s", row, "t1")
        box.attach(client)
        await box.drain(20.0)
        assert box.depth == 0 and box.stats["dropped"] == 0
    transcript = (tmp_path / "host" / "sessions" / "s.jsonl").read_bytes()
    assert b"Bonjour \\ud83d" in transcript
