"""A fault after a change is complete: the call that made it still answers success.

An intent whose removal failed after its change finished must never be applied to a
file written since.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from host import FileSystem
from tests.host.inproc import msg, open_host


class FailOnce(FileSystem):
    """Fails the first seam call named ``what`` (whose path ends with ``suffix``) once armed."""

    def __init__(self, what: str, suffix: str = "", err: int = errno.EIO) -> None:
        self.what, self.suffix, self.err = what, suffix, err
        self.armed = False

    def _maybe(self, what: str, path: Any = "") -> None:
        if self.armed and what == self.what and str(path).endswith(self.suffix):
            self.armed = False
            raise OSError(self.err, f"injected {what}")

    def ftruncate(self, fd: int, size: int) -> None:
        self._maybe("ftruncate")
        super().ftruncate(fd, size)

    def fsync_dir(self, path: str) -> None:
        self._maybe("fsync_dir", path)
        super().fsync_dir(path)

    def unlink(self, path: str) -> bool:
        self._maybe("unlink", path)
        return super().unlink(path)


async def ids(call: Any, sid: str = "s") -> list[str]:
    return [m["id"] for m in (await call("session.get", sessionId=sid))["messages"]]


async def test_a_leftover_intent_does_not_bring_a_deleted_message_back(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    fs = FailOnce("unlink", suffix=".intent.json")
    async with open_host(data, fs) as call:
        await call("session.create", sessionId="s")
        for m in (msg("u1", "user"), msg("a1"), msg("u2", "user"), msg("b1")):
            await call("session.appendMessage", sessionId="s", message=m)
        fs.armed = True  # the regenerate succeeds; only removing its intent fails
        cut = await call("session.truncateFrom", sessionId="s", fromMessageId="b1")
        assert cut["removed"] == 1
        # the user deletes the unanswered prompt and quits
        await call("session.deleteMessages", sessionId="s", messageIds=["u2"])
        assert await ids(call) == ["u1", "a1"]
    async with open_host(data) as call:
        assert await ids(call) == ["u1", "a1"], "start-up replayed a stale cut intent"


# 4 -------------------------------------------------------------------------------------
