"""A fault after a change is complete: the call that made it still answers success.

An intent whose removal failed after its change finished must never be applied to a
file written since.
"""

from __future__ import annotations

import errno
import os
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


async def regenerate_leaving_its_intent(call: Any, fs: FailOnce, intent: str) -> None:
    """A regenerate of b1 that succeeds; only removing its intent fails."""
    await call("session.create", sessionId="s")
    for m in (msg("u1", "user"), msg("a1"), msg("u2", "user"), msg("b1")):
        await call("session.appendMessage", sessionId="s", message=m)
    fs.armed = True
    cut = await call("session.truncateFrom", sessionId="s", fromMessageId="b1")
    assert cut["removed"] == 1
    assert os.path.exists(intent)


async def test_a_leftover_intent_does_not_bring_a_deleted_message_back(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    fs = FailOnce("unlink", suffix=".intent.json")
    intent = os.path.join(data, "sessions", "s.intent.json")
    async with open_host(data, fs) as call:
        await regenerate_leaving_its_intent(call, fs, intent)
        # the user deletes the unanswered prompt (the file is now exactly the cut) and quits
        await call("session.deleteMessages", sessionId="s", messageIds=["u2"])
        assert await ids(call) == ["u1", "a1"]
        assert not os.path.exists(intent), "the rewrite kept a stale intent"
    async with open_host(data) as call:
        assert await ids(call) == ["u1", "a1"], "start-up replayed a stale cut intent"


async def test_a_rewrite_that_cannot_remove_a_leftover_intent_changes_nothing(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    fs = FailOnce("unlink", suffix=".intent.json")
    intent = os.path.join(data, "sessions", "s.intent.json")
    async with open_host(data, fs) as call:
        await regenerate_leaving_its_intent(call, fs, intent)
        fs.armed = True
        err = await call.error("session.deleteMessages", sessionId="s", messageIds=["u2"])
        assert err["data"]["code"] == "STORAGE_ERROR"
        assert await ids(call) == ["u1", "a1", "u2"]
        await call("session.deleteMessages", sessionId="s", messageIds=["u2"])  # the retry
        assert await ids(call) == ["u1", "a1"]
    async with open_host(data) as call:
        assert await ids(call) == ["u1", "a1"]


async def test_a_deleted_sessions_intent_never_reaches_a_new_one_of_its_id(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    fs = FailOnce("unlink", suffix=".intent.json")
    intent = os.path.join(data, "sessions", "s.intent.json")
    async with open_host(data, fs) as call:
        await regenerate_leaving_its_intent(call, fs, intent)
        fs.armed = True  # deleted all the same; its intent stays behind
        assert (await call("session.delete", sessionId="s"))["deleted"] is True
        assert os.path.exists(intent)
        await call("session.create", sessionId="s")
        for m in (msg("u1", "user"), msg("a1")):  # exactly the old cut's offset
            await call("session.appendMessage", sessionId="s", message=m)
    async with open_host(data) as call:
        assert await ids(call) == ["u1", "a1"], "a deleted session's message came back"


async def test_a_plain_cut_to_a_leftover_intents_offset_keeps_its_root_away(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    fs = FailOnce("unlink", suffix=".intent.json")
    intent = os.path.join(data, "sessions", "s.intent.json")
    async with open_host(data, fs) as call:
        await regenerate_leaving_its_intent(call, fs, intent)
        await call("session.appendMessage", sessionId="s", message=msg("b2"))
        # edit-resend of u2: one ftruncate back to the very offset the regenerate cut at
        cut = await call("session.truncateFrom", sessionId="s", fromMessageId="u2")
        assert cut["removed"] == 2
        assert not os.path.exists(intent), "the cut kept a stale intent"
    async with open_host(data) as call:
        assert await ids(call) == ["u1", "a1"], "start-up replayed a stale cut intent"
