"""A corrupt outbox journal (issue 6): damaged entries are reported and skipped, the rest delivered.

Each test writes a journal with the real :class:`~outbox.Journal`, damages it the way a disk
could (flipped bytes, garbage, a torn tail), opens it again in an :class:`~outbox.Outbox`
that drains into a real ``python -m host serve``, and checks what reaches the host: every
intact entry, once, in order; the damaged one never, and reported in the log.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from outbox import ClientError, HostClient, Journal, Outbox

WAIT = 30.0  # the bound of every wait (pytest-timeout is the outer guard)
SESSION = "s"


def body(n: int) -> bytes:
    return b'{"id":"m%d","role":"user","content":"text of m%d"}' % (n, n)


async def _write(path: Path, n: int = 5, acked: tuple[int, ...] = ()) -> list[bytes]:
    """Journal ``n`` entries (m1..mN) and acknowledge ``acked``; return the file's lines."""
    async with Journal.open(str(path)) as journal:
        for i in range(1, n + 1):
            await journal.append(SESSION, body(i), "t1")
        for seq in acked:
            journal.ack(seq)
    return path.read_bytes().split(b"\n")[:-1]


def _rewrite(path: Path, lines: list[bytes], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines) + tail)


class Watched:
    """A host client that says when a batch failed (the outbox then retries it)."""

    def __init__(self, client: HostClient) -> None:
        self.client = client
        self.gone = client.gone
        self.failed = asyncio.Event()

    async def batch(self, calls: list[tuple[str, dict[str, Any]]], **kw: Any) -> list[Any]:
        try:
            return await self.client.batch(calls, **kw)
        except ClientError:
            self.failed.set()
            raise

    async def call(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        return await self.client.call(method, params, **kw)


@contextlib.asynccontextmanager
async def _host(tmp_path: Path, deadline: float = WAIT) -> AsyncIterator[Watched]:
    """A real host with session ``s``, handshaken; stopped (or killed) at the end."""
    client = await HostClient.spawn(
        str(tmp_path / "host"), log_path=str(tmp_path / "host.log"), deadline=deadline
    )
    try:
        async with asyncio.timeout(WAIT):
            await client.handshake()
            await client.call("session.create", {"sessionId": SESSION})
        yield Watched(client)
    except BaseException:
        client.kill()
        raise
    finally:
        await client.close()


async def _delivered(host: Watched) -> list[str]:
    page = await host.call("session.get", {"sessionId": SESSION})
    return [m["id"] for m in page["messages"]]


async def _drain(box: Outbox, host: Watched) -> None:
    """Drain everything, or fail as soon as a batch fails (it would be retried forever)."""
    box.attach(host)  # type: ignore[arg-type]  # the watched edge of the same client
    drained = asyncio.ensure_future(box.drain(WAIT))
    failed = asyncio.ensure_future(host.failed.wait())
    try:
        done, _ = await asyncio.wait({drained, failed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (drained, failed):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    assert drained in done and failed not in done, (
        f"a batch failed and is being retried: every later entry is held back ({box.stats})"
    )


def _offset(lines: list[bytes], n: int) -> int:
    return sum(len(line) + 1 for line in lines[:n])


DAMAGE = {
    "flip-brace": lambda line: b"X" + line[1:],
    "garbage": lambda line: b"#garbage of another length#",
    "cut-in-half": lambda line: line[: len(line) // 2],
    "binary": lambda line: b"\x00\xff\xfe" + line[3:],
    "bad-escape": lambda line: line.replace(b"text of", b"text\\q of"),
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
async def test_a_damaged_middle_entry_is_reported_and_the_others_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    path = tmp_path / "app" / "outbox.jsonl"
    lines = await _write(path)
    lines[1] = DAMAGE[how](lines[1])  # entry 2 of 5
    _rewrite(path, lines, tail=b'{"seq":6,"sessionId":"s","mess')  # and a torn tail
    with caplog.at_level(logging.WARNING, logger="outbox"):
        async with Outbox.open(str(path)) as box, _host(tmp_path) as host:
            assert sorted(box.journal.pending) == [1, 3, 4, 5]
            await _drain(box, host)
            assert await _delivered(host) == ["m1", "m3", "m4", "m5"]
            assert not box.journal.pending
    assert f"unreadable entry at byte {_offset(lines, 1)} skipped" in caplog.text
    assert "torn last entry" in caplog.text
    assert _quarantined(path) == [lines[1]]  # kept there; the journal, rewritten, is cut
    assert lines[1] not in path.read_bytes()


def _quarantined(path: Path) -> list[bytes]:
    quarantine = path.with_name(path.name + ".quarantine")
    return [base64.b64decode(q) for q in quarantine.read_bytes().split()]


# Found at 4d444d5 (helper-22): with entries still pending (no host), every open found
# the damaged line again and appended it to the quarantine once more.
async def test_a_damaged_entry_is_quarantined_once_however_often_it_is_opened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.jsonl"
    lines = await _write(path, 3)
    lines[1] = DAMAGE["garbage"](lines[1])
    _rewrite(path, lines)
    for _ in range(3):
        async with Journal.open(str(path)) as journal:
            assert sorted(journal.pending) == [1, 3]
    assert _quarantined(path) == [lines[1]]


async def test_a_torn_tail_is_cut_and_the_next_entry_lands_on_a_clean_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "outbox.jsonl"
    lines = await _write(path, 3)
    _rewrite(path, lines, tail=b'{"seq":4,"sessionId":"s","message":{"id":"m4","ro')
    with caplog.at_level(logging.WARNING, logger="outbox"):
        async with Outbox.open(str(path)) as box, _host(tmp_path) as host:
            assert path.read_bytes() == b"".join(line + b"\n" for line in lines)
            await box.enqueue(SESSION, body(9), "t1")  # written after the cut, whole
            await _drain(box, host)
            assert await _delivered(host) == ["m1", "m2", "m3", "m9"]
    assert "torn last entry" in caplog.text
    async with Journal.open(str(path)) as journal:
        assert not journal.pending


def _reported(caplog: pytest.LogCaptureFixture, lines: list[bytes], n: int) -> bool:
    """Whether entry ``n`` (line ``n - 1``) was reported: unreadable at open, or dropped."""
    return (
        f"unreadable entry at byte {_offset(lines, n - 1)} skipped" in caplog.text
        or f"entry {n} for session {SESSION} dropped" in caplog.text
    )


SPOILED = {
    # A flipped byte that leaves the line JSON and the entry an entry, but its message no
    # longer a message: caught by the line's CRC at open, or refused by the host.
    "role": lambda line: line.replace(b'"role":"user"', b'"role":"usar"'),
    # A byte that is not UTF-8: the host would refuse the whole batch line it rides in.
    "invalid-utf8": lambda line: line.replace(b"text of", b"te\xffxt of"),
    "bad-utf8-lead": lambda line: line.replace(b"text of", b"te\xc3xt of"),
}


@pytest.mark.parametrize("how", sorted(SPOILED))
async def test_an_entry_whose_message_was_spoiled_is_reported_and_the_rest_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    path = tmp_path / "outbox.jsonl"
    lines = await _write(path)
    lines[1] = SPOILED[how](lines[1])
    _rewrite(path, lines)
    with caplog.at_level(logging.WARNING, logger="outbox"):
        # A short deadline: a batch nobody answers fails fast instead of after 130 s.
        async with Outbox.open(str(path)) as box, _host(tmp_path, deadline=2.0) as host:
            await _drain(box, host)
            assert await _delivered(host) == ["m1", "m3", "m4", "m5"]
            assert not box.journal.pending
    assert _reported(caplog, lines, 2), caplog.text


@pytest.mark.parametrize("how", ["seq", "ack"])
async def test_a_flipped_digit_never_loses_an_entry_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    # Without a checksum such a line is valid JSON that says something else: a seq that
    # repeats a later one (that entry overwrites it), an ack of an entry never delivered.
    path = tmp_path / "outbox.jsonl"
    lines = await _write(path, acked=(1,))
    if how == "seq":
        n, spoiled = 2, "m2"
        assert lines[1].startswith(b'{"seq":2,')
        lines[1] = b'{"seq":4,' + lines[1][len(b'{"seq":2,') :]
    else:
        n, spoiled = 6, "m4"
        assert lines[5].startswith(b'{"ack":1')
        lines[5] = b'{"ack":4' + lines[5][len(b'{"ack":1') :]
    _rewrite(path, lines)
    with caplog.at_level(logging.WARNING, logger="outbox"):
        async with Outbox.open(str(path)) as box, _host(tmp_path) as host:
            await _drain(box, host)
            delivered = await _delivered(host)
    assert spoiled in delivered or _reported(caplog, lines, n), (delivered, caplog.text)
    if how == "ack":  # the entry whose ack was spoiled is sent again: harmless, deduplicated
        assert delivered == ["m1", "m2", "m3", "m4", "m5"]


async def test_an_unreadable_journal_never_stops_the_outbox_from_opening(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    path.write_bytes(os.urandom(64 * 1024).replace(b"\n", b" ") + b"\n")
    async with Outbox.open(str(path)) as box, _host(tmp_path) as host:
        assert not box.journal.pending
        await box.enqueue(SESSION, body(1), "t1")
        await _drain(box, host)
        assert await _delivered(host) == ["m1"]
