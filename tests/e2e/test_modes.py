"""Everything the host creates is private: files 0600, folders 0700, whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.conftest import StartHost, msg, transcript


async def test_files_are_0600_and_folders_0700_even_with_umask_000(
    start_host: StartHost, data_dir: Path, tmp_path: Path
) -> None:
    host = await start_host(umask=0o000)
    c = host.client
    assert c is not None
    await c.handshake()
    await c.call("session.create", sessionId="s", title="t")
    await c.call("session.appendMessage", sessionId="s", message=msg("a"))
    await c.call("session.updateMessage", sessionId="s", message=msg("a", content="b"))  # rewrite
    await c.call("session.replaceMessages", sessionId="s", messages=[msg("x"), msg("y")])
    await c.call("session.deleteMessages", sessionId="s", messageIds=["x"])
    assert await host.stop() == 0
    with open(transcript(data_dir, "s"), "ab") as f:
        f.write(b"garbage\n")  # quarantined at the next start: a file the host creates
    host = await start_host(umask=0o000)
    assert host.client is not None
    await host.client.handshake()
    await host.client.call("session.get", sessionId="s")
    await host.client.call("session.beginTurn", sessionId="s", turnId="t")
    for text in ("a", "ab"):  # the second keeps the first as the spare
        params = {"sessionId": "s", "turnId": "t", "message": msg("r", "assistant", content=text)}
        await host.client.call("session.saveInflightMessage", **params)
    assert (data_dir / "sessions" / "s.jsonl.quarantine").exists()
    wrong = []
    paths = [data_dir, *data_dir.rglob("*")]
    for path in paths:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        want = 0o700 if path.is_dir() else 0o600
        if mode != want:
            wrong.append(f"{path.relative_to(tmp_path)}: {oct(mode)}")
    assert wrong == []
    assert {p.name for p in paths} >= {
        "sessions",
        "revisions",
        "index.sqlite3",
        "host.lock",
        "s.jsonl",
        "s.meta.json",
        "s.jsonl.quarantine",
        "s.inflight.json",
        "s.inflight.spare",
    }
