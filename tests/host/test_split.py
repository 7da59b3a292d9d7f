"""A big request's message split off its line (``host._endpoint._split``).

The split decodes everything but the message now and leaves the message's bytes to its
call (``TurnMethods.save_now``), which proves them JSON (``_proof``) on a thread while it
writes them. So the split must never change an answer: whenever the proof does not refuse
the bytes, the line must be exactly the request the split read, as the two-phase decode
reads it. (When the proof refuses them, the line is decoded whole, as if never split: the
end-to-end tests in test_big_checkpoints check those answers.) And a line that arrives
alone is done at once, in the read callback, only when nothing but the spare can change
before its message is proved.
"""

from __future__ import annotations

import errno
import json
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host import Host
from host._endpoint import Connection, _split
from host._errors import Conflict, InvalidParams
from host._framing import LineReader
from host._turns import _proof
from tests.e2e.test_fuzz import json_values
from tests.host.inproc import FaultyFileSystem
from tests.host.test_deferred_index import FailingCommits
from tests.host.test_endpoint import FakeWriter, line
from tests.host.test_immediate import _connect
from tests.host.test_one_pass import two_phase

METHOD = "session.saveInflightMessage"


def j(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def obj(pairs: list[tuple[str, str]]) -> str:
    """A JSON object from (key as written, value text) pairs, in that order."""
    return "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"


good_message = st.builds(
    lambda mid, role, text, extra: {"id": mid, "role": role, "content": text, **extra},
    st.sampled_from(["a1", "m.2", "x" * 128]),
    st.sampled_from(["assistant", "user", "robot"]),
    st.text(max_size=30),
    st.dictionaries(st.sampled_from(["turnId", "capped", "status", "zz"]), json_values, max_size=2),
)

# What may follow a message inside the bytes the split takes for it: nothing, or what makes
# them more (or less) than one JSON value.
tails = [
    " ",
    ',"extra":1',
    ',"message":{"id":"b2","role":"assistant","content":"later"}',
    ',"mess\\u0061ge":{"id":"b3","role":"user","content":"escaped"}',
    "}",
    ",",
    "]",
]


def mostly(usual: Any, *others: Any) -> st.SearchStrategy[Any]:
    """``usual`` five times in six, else one of ``others``."""
    return st.sampled_from([usual] * 5 * len(others) + list(others))


@st.composite
def message_text(draw: st.DrawFn) -> str:
    """A message's bytes as a client might send them, or broken in one of many ways."""
    base = j(draw(good_message if draw(mostly(True, False)) else json_values))
    how = draw(st.integers(0, 12))
    if how == 0 and len(base) > 1:  # cut short
        base = base[: draw(st.integers(1, len(base) - 1))]
    elif how == 1:  # a raw control character or a bad escape inside a string
        bad = draw(st.sampled_from(["\x01", "\\q", "\\u12"]))
        base = base.replace('"content":"', '"content":"' + bad, 1)
    elif how == 2:  # nested past any decoder's depth
        base = '{"id":"a1","role":"user","content":' + "[" * 5000 + "]" * 5000 + "}"
    elif how == 3:  # a bad field first, then not JSON
        base = '{"id":5,"role":"user","content":"x'
    return base + draw(mostly("", *tails))


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """A saveInflightMessage line, mostly in the shape the split takes, often not."""
    params = [
        (j("sessionId"), j(draw(mostly("s", "s1", "a b", "x" * 129)))),
        (j("turnId"), j(draw(mostly("t", "message", '"message":')))),
    ]
    if draw(mostly(False, True)):
        params.append((j(draw(st.sampled_from(["extra", "message", "mess\\u0061ge"]))), "null"))
    if draw(mostly(False, True)):
        params = draw(st.permutations(params))
    params.append((j("message"), draw(message_text())))
    if draw(mostly(False, True)):  # the message is not last after all
        params = draw(st.permutations(params))
    env = [
        (j("jsonrpc"), j(draw(mostly("2.0", "1.0")))),
        (j("id"), j(draw(mostly(7, "r", None, 1.5, 2**70)))),
        (j("method"), j(draw(mostly(METHOD, "session.appendMessage")))),
    ]
    if draw(mostly(False, True)):
        env.pop(1)  # a notification
    if draw(mostly(False, True)):
        env = draw(st.permutations(env))
    env.append((j("params"), obj(params)))
    return obj(env).encode()


@pytest.mark.slow
@pytest.mark.timeout(300)  # 3,000 examples: ~8 s alone, over 60 s on a loaded machine
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=lines())
def test_what_the_split_reads_is_the_request_whenever_its_message_proves_json(
    line: bytes,
) -> None:
    req = _split(line, {METHOD})
    if req is None:
        return
    method, params, rid = req
    assert rid is not msgspec.UNSET  # a notification is never split: its error has no id
    try:
        if _proof(params.message) is None:
            return  # decoded whole
    except (InvalidParams, Conflict):
        pass  # the same error the whole line's params get
    assert two_phase(line) == (method, params, rid), line


@given(message=good_message, rid=st.integers(0, 2**40) | st.sampled_from(["r", "a-b"]))
def test_a_valid_snapshot_sent_message_last_is_split(message: dict[str, Any], rid: Any) -> None:
    """The outbox's shape (and the bench's): ids, method, then params ending in message."""
    params = {"sessionId": "s", "turnId": "t", "message": message}
    line = msgspec.json.encode({"jsonrpc": "2.0", "id": rid, "method": METHOD, "params": params})
    req = _split(line, {METHOD})
    assert req is not None and req == two_phase(line)
    assert msgspec.json.decode(req[1].message) == message


async def _streaming(host: Host) -> tuple[Connection, FakeWriter]:
    """A connection with nothing read behind each line, on session s with turn t begun."""
    conn, writer = _connect(host, more=False)
    conn.feed(line("handshake", {"protocolVersion": 11}, 0))
    conn.feed(line("session.create", {"sessionId": "s"}, "create"))
    conn.feed(line("session.beginTurn", {"sessionId": "s", "turnId": "t"}, "begin"))
    await conn.finish()
    return conn, writer


def save(message: dict[str, Any], rid: int) -> bytes:
    params = {"sessionId": "s", "turnId": "t", "message": message}
    return msgspec.json.encode({"jsonrpc": "2.0", "id": rid, "method": METHOD, "params": params})


async def test_a_snapshot_alone_is_saved_at_once_one_with_a_line_behind_it_is_not(
    tmp_path: Path,
) -> None:
    async with Host.open(str(tmp_path / "data")) as host:
        conn, writer = await _streaming(host)
        behind = False
        conn.more = lambda: behind
        path = tmp_path / "data" / "sessions" / "s.inflight.json"
        for rid, behind in enumerate([True, False, False, True], start=1):
            message = {"id": "a1", "role": "assistant", "content": str(rid) * (1 << 17)}
            conn.feed(save(message, rid))
            assert (rid in writer.replies()) is not behind  # answered in the read callback
            await conn.finish()
            assert writer.replies()[rid]["result"] == {"saved": True}
            assert json.loads(path.read_bytes())["message"] == message
        # Alone but not JSON: decoded whole, as any line; nothing but the spare changed.
        kept = path.read_bytes()
        conn.feed(
            save({"id": "a1", "role": "assistant", "content": "y" * (1 << 17)}, 9)[:-4] + b"}}}"
        )
        await conn.finish()
        (bad,) = [r for r in writer.replies().values() if "error" in r]
        assert (bad["id"], bad["error"]["data"]["code"]) == (None, "PARSE_ERROR")
        assert path.read_bytes() == kept


@pytest.mark.parametrize("fail_at", range(1, 8))
async def test_a_failed_write_of_a_snapshot_saved_at_once_leaves_a_whole_checkpoint(
    tmp_path: Path, fail_at: int
) -> None:
    """Each file operation of the save fails in turn: the answer is a storage error
    exactly when the checkpoint is still the old one, whole; and a message that is not
    JSON is a parse error, whatever its write did."""
    fs = FaultyFileSystem(fail_at, errno.ENOSPC)
    async with Host.open(str(tmp_path / "data"), fs) as host:
        conn, writer = await _streaming(host)
        old = {"id": "a1", "role": "assistant", "content": "o" * (1 << 17)}
        conn.feed(save(old, 1))
        await conn.finish()
        path = tmp_path / "data" / "sessions" / "s.inflight.json"
        new = {"id": "a1", "role": "assistant", "content": "n" * (1 << 17)}
        fs.armed = True
        conn.feed(save(new, 2))
        got = writer.replies()[2]  # done at once, failed or not
        stored = json.loads(path.read_bytes())["message"]
        if "error" in got:
            assert (got["error"]["data"]["code"], stored) == ("STORAGE_ERROR", old)
        else:
            assert (got["result"], stored) == ({"saved": True}, new)
        assert fs.failed == ("error" in got)
        fs.calls, fs.fail_at = 0, 1  # the next one fails at once
        conn.feed(save(new, 3)[:-4] + b"}}}")  # its string never ends
        await conn.finish()
        (bad,) = [r for r in writer.replies().values() if r["id"] is None]
        assert bad["error"]["data"]["code"] == "PARSE_ERROR"
        # (its write failed too, when it was tried: a failed swap leaves the checkpoint's
        # ids unknown, and the next snapshot takes the awaited way)
        assert json.loads(path.read_bytes())["message"] == stored


async def test_a_snapshot_that_fills_a_read_waits_for_a_cancel_read_behind_it(
    tmp_path: Path,
) -> None:
    """uvloop reads the cancel in the same pass, before the call's task would start: the
    cancel must find the call not started, as it does when the line is not split."""
    async with Host.open(str(tmp_path / "data")) as host:
        conn, writer = _connect(host, more=False)
        reader = LineReader(conn.feed)
        conn.more = reader.more
        reader.data_received(line("handshake", {"protocolVersion": 11}, 0) + b"\n")
        reader.data_received(line("session.create", {"sessionId": "s"}, "create") + b"\n")
        first = {"sessionId": "s", "message": {"id": "u1", "role": "user", "content": "x"}}
        reader.data_received(line("session.appendMessage", first, "u1") + b"\n")  # opens it
        await conn.finish()
        with reader.get_buffer(-1) as room:
            size = len(room)
            message = {"id": "a1", "role": "assistant", "content": ""}
            message["content"] = "x" * (size - len(save(message, 1)) - 1)
            room[:] = save(message, 1) + b"\n"
        reader.buffer_updated(size)  # exactly its room: more may be waiting
        assert 1 not in writer.replies()
        cancel = {"jsonrpc": "2.0", "id": 2, "method": "$/cancelRequest", "params": {"id": 1}}
        reader.data_received(msgspec.json.encode(cancel) + b"\n")
        await conn.finish()
        assert writer.replies()[1]["error"]["data"]["code"] == "REQUEST_CANCELLED"
        assert not (tmp_path / "data" / "sessions" / "s.inflight.json").exists()


async def test_a_snapshot_is_not_saved_at_once_while_any_sessions_rows_are_stale(
    tmp_path: Path,
) -> None:
    """The awaited way first waits for the index to settle, which may fail the call."""
    fs = FailingCommits()
    async with Host.open(str(tmp_path / "data"), fs) as host:
        conn, writer = _connect(host, more=False)
        conn.feed(line("handshake", {"protocolVersion": 11}, 0))
        for sid in ("s", "s2"):
            conn.feed(line("session.create", {"sessionId": sid}, sid))
            message = {"id": f"u-{sid}", "role": "user", "content": "x"}
            conn.feed(line("session.appendMessage", {"sessionId": sid, "message": message}, sid))
            await conn.finish()
        fs.fail = 1000  # every index transaction from now on
        message = {"id": "m2", "role": "user", "content": "x"}
        conn.feed(line("session.appendMessage", {"sessionId": "s2", "message": message}, "m2"))
        await conn.finish()
        with pytest.raises(sqlite3.OperationalError):
            await host.store.index.settle()  # its row's batch failed: s2 is stale
        assert host.store.index.stale == {"s2"}
        message = {"id": "m3", "role": "user", "content": "x"}
        conn.feed(line("session.appendMessage", {"sessionId": "s", "message": message}, "m3"))
        await conn.finish()  # stored, its row queued
        conn.feed(save({"id": "a1", "role": "assistant", "content": "x" * (1 << 17)}, 1))
        assert 1 not in writer.replies()  # awaited: it waits for the index first
        await conn.finish()
        assert writer.replies()[1]["error"]["data"]["code"] == "STORAGE_ERROR"
        assert not (tmp_path / "data" / "sessions" / "s.inflight.json").exists()
