"""A crash after any file operation of a write leaves the old state or the new one.

Each write runs against a file system that kills the "process" at its Nth operation, for
N = 1, 2, ... until the write completes; the data dir is then started again and compared
with the states before and after. Files are left exactly as a kill -9 would leave them
(every write is a direct system call), and start-up recovery must finish or forget the
change, never expose a third state.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from host._verify import verify
from tests.host.inproc import Client, Crash, CrashingFileSystem, msg, open_host

Op = Callable[[Client], Awaitable[Any]]


async def _prepare(data: str) -> None:
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


async def _state(data: str) -> Any:
    async with open_host(data) as call:
        page = await call("session.get", sessionId="s")
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
    report = io.StringIO()
    assert await verify(data, out=report) == 0, report.getvalue()
    leftovers = [p.name for p in Path(data).rglob("*") if p.name.endswith((".tmp", ".intent.json"))]
    assert leftovers == []
    return page["messages"], revs, checkpoint


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
}


async def _turn_with_checkpoint(c: Client) -> None:
    await c("session.beginTurn", sessionId="s", turnId="t3")
    await c("session.saveInflightMessage", sessionId="s", turnId="t3", message=msg("b3"))


# What runs (without crashing) before the write under test, in the same host run.
PRE: dict[str, Op] = {
    "activate": OPS["truncate-regenerate"],  # archives u2's branch, then paging back to it
    "checkpoint": lambda c: c("session.beginTurn", sessionId="s", turnId="t3"),
    "promote": _turn_with_checkpoint,
}
OPS["checkpoint"] = lambda c: c(
    "session.saveInflightMessage", sessionId="s", turnId="t3", message=msg("b3")
)
OPS["promote"] = lambda c: c(
    "session.endTurn", sessionId="s", turnId="t3", status="aborted", recoverInflight=True
)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    import asyncio

    data = str(tmp_path_factory.mktemp("base") / "data")
    asyncio.run(_prepare(data))
    return data


@pytest.mark.parametrize("name", sorted(OPS))
async def test_crash_at_every_step_gives_old_or_new_state(name: str, base: str, tmp_path: Path):
    op, pre = OPS[name], PRE.get(name)

    def fresh(tag: str) -> str:
        d = str(tmp_path / tag)
        shutil.copytree(base, d)
        return d

    async def run(data: str, fs: CrashingFileSystem | None) -> bool:
        async with open_host(data, fs) as call:
            if pre is not None:
                await pre(call)
            if fs is not None:
                fs.armed = True
            try:
                await op(call)
            except Crash:
                return False
        return True

    old_dir, new_dir = fresh("old"), fresh("new")
    if pre is not None:
        async with open_host(old_dir) as call:
            await pre(call)
    old = await _state(old_dir)
    assert await run(new_dir, None)
    new = await _state(new_dir)
    if name == "promote":
        # Start-up promotes the leftover too: either way the reply is there exactly once.
        assert old == new
        assert [m["id"] for m in new[0]].count("b3") == 1
    else:
        assert old != new, "the operation must change something"
    crashes = 0
    for n in range(1, 200):
        d = fresh(f"crash{n}")
        if await run(d, CrashingFileSystem(n)):
            break
        crashes += 1
        got = await _state(d)
        assert got in (old, new), f"{name}: crash at file operation {n} left a third state"
    else:
        raise AssertionError("the operation never completed")
    assert crashes >= 1
