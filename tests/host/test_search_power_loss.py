"""A power cut at any write of session.update, session.fork and an append leaves search
results that agree with the transcripts after the restart (issue 35).

The model is ``tests/host/powerloss.py``'s: only what was fsynced survives, the index as
SQLite's ``synchronous`` rule leaves it. After each cut the host starts on the image and
every word of the scenario is searched; the hits must be exactly the messages whose
transcript line holds it (a brute-force scan), and ``verify`` (which checks the search
documents by digest) must agree. Title and ``meta`` must be the old or the new.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from host._verify import verify
from tests.host.inproc import Crash, msg, open_host
from tests.host.powerloss import PowerLossFileSystem

WORDS = ["apple", "banana", "cherry", "durian", "東京"]


async def _prepare(data: str) -> None:
    async with open_host(data) as c:
        await c("session.create", sessionId="s", title="old title")
        for i, word in enumerate(WORDS[:3]):
            await c("session.appendMessage", sessionId="s", message=msg(f"m{i}", content=word))


OPS: dict[str, Any] = {
    "append": lambda c: c(
        "session.appendMessage", sessionId="s", message=msg("m9", content="durian 東京")
    ),
    "update": lambda c: c("session.update", sessionId="s", title="new", meta={"pinned": True}),
    "fork": lambda c: c("session.fork", sessionId="s", atMessageId="m1", newSessionId="f"),
}


def _brute(data: str, word: str) -> set[tuple[str, str]]:
    out = set()
    for path in sorted(Path(data, "sessions").glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            m = json.loads(line)
            if isinstance(m.get("content"), str) and word in m["content"]:
                out.add((path.stem, m["id"]))
    return out


async def _check(data: str) -> tuple[Any, ...]:
    async with open_host(data) as c:
        for word in WORDS:
            got = await c("session.search", query=word, limit=100)
            assert not got["partial"]
            hits = {(h["sessionId"], h["messageId"]) for h in got["hits"]}
            assert hits == _brute(data, word), word
        rows = (await c("session.list"))["sessions"]
    report = io.StringIO()
    assert await verify(data, out=report) == 0, report.getvalue()
    return tuple(sorted((r["sessionId"], r["title"], json.dumps(r["meta"])) for r in rows))


async def _run(op: str, data: str, fs: PowerLossFileSystem | None) -> bool:
    async with open_host(data, fs) as c:
        if fs is not None:
            fs.arm()
        try:
            await OPS[op](c)
        except Crash:
            return False
    return True


@pytest.mark.parametrize("op", sorted(OPS))
async def test_power_cut_leaves_search_agreeing(op: str, tmp_path: Path) -> None:
    base = str(tmp_path / "base")
    await _prepare(base)
    old_dir, new_dir = str(tmp_path / "old"), str(tmp_path / "new")
    shutil.copytree(base, old_dir)
    shutil.copytree(base, new_dir)
    assert await _run(op, new_dir, None)
    old, new = await _check(old_dir), await _check(new_dir)
    for n in range(1, 200):
        d = str(tmp_path / f"run{n}")
        shutil.copytree(base, d)
        fs = PowerLossFileSystem(d, crash_at=n)
        done = await _run(op, d, fs)
        for label, torn, index in (("plain", False, "current"), ("synced", n % 2 == 1, "synced")):
            img = str(tmp_path / f"img{n}-{label}")
            fs.image(img, torn=torn, index=index)
            got = await _check(img)  # search agrees with the transcripts, whatever the cut
            assert got in (old, new), (n, label, got)
            if done:
                assert got == new, (n, label)
        if done:
            break
