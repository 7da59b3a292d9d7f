"""The scenario the crash, fault and power-loss tests share: a session mid-regenerate.

``prepare`` builds it; ``state`` reads it back after a restart (transcript, archives,
checkpoint, turns) and checks that ``verify`` agrees and no temp or intent file is left;
``OPS`` are the writes under test and ``PRE`` what runs before one in the same host run.
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from host._verify import verify
from tests.conftest import RpcError
from tests.host.inproc import Client, msg, open_host

Op = Callable[[Client], Awaitable[Any]]


async def prepare(data: str) -> None:
    async with open_host(data) as call:
        await call("session.create", sessionId="s", title="crash")
        await call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1", "user"))
        await call("session.appendMessage", sessionId="s", turnId="t1", message=msg("a1"))
        await call("session.appendMessage", sessionId="s", turnId="t1", message=msg("a2"))
        await call("session.endTurn", sessionId="s", turnId="t1", status="completed")
        await call("session.saveActiveRevision", sessionId="s")
        await call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("u2", "user"))
        await call("session.appendMessage", sessionId="s", turnId="t2", message=msg("b1"))
        await call("session.saveInflightMessage", sessionId="s", turnId="t2", message=msg("b2"))


async def state(data: str) -> Any:
    sessions = Path(data, "sessions")
    async with open_host(data) as call:
        # Files of a session whose transcript is gone (a delete cut short), as start left them.
        orphans = sorted(
            p.name
            for p in sessions.iterdir()
            if p.name.startswith("s.") and not (sessions / "s.jsonl").exists()
        )
        await call("session.recoverInflightMessages")  # the connect sequence
        try:
            page = await call("session.get", sessionId="s")
        except RpcError as exc:
            assert exc.name == "NOT_FOUND", exc
            return None, orphans
        revs = {
            root: await call(
                "session.listRevisions", sessionId="s", rootId=root, includeMessages=True
            )
            for root in ("u1", "u2")
            if any(m["id"] == root for m in page["messages"])
        }
        for r in revs.values():
            for rev in r["revisions"]:
                rev.pop("createdAt")
        checkpoint = Path(data, "sessions", "s.inflight.json").exists()
        turns = {}
        for tid in ("t1", "t2", "t3"):  # every turn is ended by the start: this only reads
            try:
                got = await call("session.endTurn", sessionId="s", turnId=tid, status="error")
                turns[tid] = got["status"]
            except RpcError as exc:
                assert exc.name == "NOT_FOUND", exc
    report = io.StringIO()
    assert await verify(data, out=report) == 0, report.getvalue()
    temp = (".tmp", ".intent.json", ".inflight.spare")
    leftovers = [p.name for p in Path(data).rglob("*") if p.name.endswith(temp)]
    assert leftovers == []
    return page["messages"], revs, checkpoint, turns, orphans


OPS: dict[str, Op] = {
    "append": lambda c: c("session.appendMessage", sessionId="s", message=msg("b3")),
    "update": lambda c: c("session.updateMessage", sessionId="s", message=msg("a1", content="new")),
    "delete": lambda c: c("session.deleteMessages", sessionId="s", messageIds=["a2"]),
    "replace": lambda c: c(
        "session.replaceMessages", sessionId="s", messages=[msg("u1", "user"), msg("a1")]
    ),
    "truncate-regenerate": lambda c: c("session.truncateFrom", sessionId="s", fromMessageId="b1"),
    "truncate-plain": lambda c: c("session.truncateFrom", sessionId="s", fromMessageId="a2"),
    "save-active": lambda c: c("session.saveActiveRevision", sessionId="s"),
    "activate": lambda c: c("session.activateRevision", sessionId="s", rootId="u2", revision=0),
    "checkpoint": lambda c: c(
        "session.saveInflightMessage", sessionId="s", turnId="t2", message=msg("b2", content="more")
    ),
    "promote": lambda c: c(
        "session.endTurn", sessionId="s", turnId="t2", status="aborted", recoverInflight=True
    ),
    "delete-session": lambda c: c("session.delete", sessionId="s"),
    "end-turn": lambda c: c("session.endTurn", sessionId="s", turnId="t3", status="completed"),
}


async def _turn_with_checkpoint(c: Client) -> None:
    await c("session.beginTurn", sessionId="s", turnId="t3")
    await c("session.saveInflightMessage", sessionId="s", turnId="t3", message=msg("b3"))


# What runs (without crashing) before the write under test, in the same host run.
PRE: dict[str, Op] = {
    "end-turn": lambda c: c("session.beginTurn", sessionId="s", turnId="t3"),
    "activate": OPS["truncate-regenerate"],  # archives u2's branch, then paging back to it
    "checkpoint": lambda c: c("session.beginTurn", sessionId="s", turnId="t3"),
    "promote": _turn_with_checkpoint,
    "regenerate-streaming": _turn_with_checkpoint,
}
OPS["checkpoint"] = lambda c: c(
    "session.saveInflightMessage", sessionId="s", turnId="t3", message=msg("b3")
)
OPS["promote"] = lambda c: c(
    "session.endTurn", sessionId="s", turnId="t3", status="aborted", recoverInflight=True
)


async def _two_snapshots(c: Client) -> None:
    await _turn_with_checkpoint(c)  # the file
    await c(
        "session.saveInflightMessage", sessionId="s", turnId="t3", message=msg("b3", content="2")
    )


# The third snapshot of a reply: the first to overwrite the spare in place and swap it in.
PRE["checkpoint-again"] = _two_snapshots
OPS["checkpoint-again"] = lambda c: c(
    "session.saveInflightMessage", sessionId="s", turnId="t3", message=msg("b3", content="3")
)
# Regenerate from the reply still streaming: its checkpoint is promoted, then cut away.
OPS["regenerate-streaming"] = lambda c: c("session.truncateFrom", sessionId="s", fromMessageId="b3")
# A big snapshot (hundreds of KB), as a long streaming reply saves.
PRE["checkpoint-big"] = _two_snapshots
OPS["checkpoint-big"] = lambda c: c(
    "session.saveInflightMessage",
    sessionId="s",
    turnId="t3",
    message=msg("b3", content="4" * 80_000),
)


async def _tiny_branch(c: Client) -> None:
    await c("session.recoverInflightMessages")  # t2's checkpoint settled first
    await c("session.appendMessage", sessionId="s", message=msg("u3", "user"))
    await c("session.appendMessage", sessionId="s", message={"id": "x", "role": "tool"})


# A regenerate whose restamped root is longer than the root and branch it replaces: the
# cut grows the file, into room reserved before the change is recorded.
PRE["regenerate-grows"] = _tiny_branch
OPS["regenerate-grows"] = lambda c: c("session.truncateFrom", sessionId="s", fromMessageId="x")
