"""A fault after a change is complete: the call that made it still answers success.

An intent whose removal failed after its change finished must never be applied to a
file written since.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from host import FileSystem
from tests.host.inproc import msg, open_host
from tests.host.powerloss import PowerLossFileSystem


class FailOnce(FileSystem):
    """Fails the first seam call named ``what`` (whose path ends with ``suffix``) once armed."""

    def __init__(
        self, what: str, suffix: str = "", err: int = errno.EIO, error: Exception | None = None
    ) -> None:
        self.what, self.suffix, self.err, self.error = what, suffix, err, error
        self.armed = False

    def _maybe(self, what: str, path: Any = "") -> None:
        if self.armed and what == self.what and str(path).endswith(self.suffix):
            self.armed = False
            raise self.error or OSError(self.err, f"injected {what}")

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


def leftover_setup(tmp_path: Path) -> tuple[str, FailOnce, str]:
    """The data dir, a file system whose intent unlink fails once armed, and that intent."""
    data = str(tmp_path / "data")
    return (
        data,
        FailOnce("unlink", suffix=".intent.json"),
        os.path.join(data, "sessions", "s.intent.json"),
    )


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
    data, fs, intent = leftover_setup(tmp_path)
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
    data, fs, intent = leftover_setup(tmp_path)
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
    data, fs, intent = leftover_setup(tmp_path)
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
    data, fs, intent = leftover_setup(tmp_path)
    async with open_host(data, fs) as call:
        await regenerate_leaving_its_intent(call, fs, intent)
        await call("session.appendMessage", sessionId="s", message=msg("b2"))
        # edit-resend of u2: one ftruncate back to the very offset the regenerate cut at
        cut = await call("session.truncateFrom", sessionId="s", fromMessageId="u2")
        assert cut["removed"] == 2
        assert not os.path.exists(intent), "the cut kept a stale intent"
    async with open_host(data) as call:
        assert await ids(call) == ["u1", "a1"], "start-up replayed a stale cut intent"


# Changes a leftover intent's replay could undo -------------------------------------
async def revisions(call: Any, root: str = "u2") -> list[int]:
    r = await call("session.listRevisions", sessionId="s", rootId=root, includeMessages=True)
    return [m["messageCount"] for m in r["revisions"]]


async def leave_intent(call: Any, fs: FailOnce, intent: str, how: str) -> None:
    """A change of root u2's archive that finishes; only removing its intent fails."""
    if how == "regenerate":
        await regenerate_leaving_its_intent(call, fs, intent)
        return
    await call("session.create", sessionId="s")
    for m in (msg("u1", "user"), msg("a1"), msg("u2", "user"), msg("b1")):
        await call("session.appendMessage", sessionId="s", message=m)
    if how == "activate":
        await call("session.saveActiveRevision", sessionId="s")
        await call("session.saveRevision", sessionId="s", rootId="u2", messages=[msg("c1")])
        await call("session.appendMessage", sessionId="s", message=msg("b2"))  # archived too
        fs.armed = True
        await call("session.activateRevision", sessionId="s", rootId="u2", revision=1)
    else:
        fs.armed = True
        await call("session.saveActiveRevision", sessionId="s")
    assert os.path.exists(intent)


@pytest.mark.parametrize("how", ["regenerate", "save-active", "activate"])
async def test_a_leftover_intent_does_not_roll_a_saved_revision_back(
    tmp_path: Path, how: str
) -> None:
    data, fs, intent = leftover_setup(tmp_path)
    async with open_host(data, fs) as call:
        await leave_intent(call, fs, intent, how)
        saved = await call(
            "session.saveRevision", sessionId="s", rootId="u2", messages=[msg("x1"), msg("x2")]
        )
        before = await revisions(call)
        assert before[saved["revision"]] == 2
    async with open_host(data) as call:
        assert await revisions(call) == before, "start-up re-committed a stale manifest"


class DirSyncFailsAfterIntentUnlink(PowerLossFileSystem):
    """A power-cut model whose folder fsync right after an intent's unlink fails once."""

    armed_fault = False
    _next_dir_sync_fails = False

    def unlink(self, path: str) -> bool:
        gone = super().unlink(path)
        if self.armed_fault and gone and path.endswith(".intent.json"):
            self.armed_fault, self._next_dir_sync_fails = False, True
        return gone

    def fsync_dir(self, path: str) -> None:
        if self._next_dir_sync_fails:
            self._next_dir_sync_fails = False
            raise OSError(errno.EIO, "injected fsync_dir")
        super().fsync_dir(path)


async def test_a_settled_intent_whose_unlink_was_never_synced_stays_gone(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    os.makedirs(data)
    fs = DirSyncFailsAfterIntentUnlink(data)
    async with open_host(data, fs) as call:
        fs.arm()
        await call("session.create", sessionId="s")
        for m in (msg("u1", "user"), msg("a1"), msg("u2", "user"), msg("b1")):
            await call("session.appendMessage", sessionId="s", message=m)
        fs.armed_fault = True  # the regenerate succeeds; its intent's unlink is not durable
        assert (await call("session.truncateFrom", sessionId="s", fromMessageId="b1"))[
            "removed"
        ] == 1
        await call("session.appendMessage", sessionId="s", message=msg("b2"))
        cut = await call("session.truncateFrom", sessionId="s", fromMessageId="u2")
        assert cut["removed"] == 2
        assert await ids(call) == ["u1", "a1"]
    img = str(tmp_path / "img")
    fs.image(img)  # a power cut now
    async with open_host(img) as call:
        assert await ids(call) == ["u1", "a1"], "a power cut brought a settled intent back"


async def test_a_recorded_change_is_made_whatever_stopped_its_apply(tmp_path: Path) -> None:
    """Past its record a change is made, whatever the error that stopped applying it (not
    only ``OSError``): the session is served only once it is, and an append acknowledged
    after it survives the next start, which finds nothing left to replay over it."""
    data = str(tmp_path / "data")
    fs = FailOnce("ftruncate", error=RuntimeError("injected: not an OSError"))
    async with open_host(data, fs) as call:
        await call("session.create", sessionId="s")
        for m in (msg("u1", "user"), msg("a1"), msg("u2", "user"), msg("b1"), msg("b2")):
            await call("session.appendMessage", sessionId="s", message=m)
        fs.armed = True
        cut = await call("session.truncateFrom", sessionId="s", fromMessageId="b1")
        assert cut["removed"] == 2
        assert not fs.armed
        await call("session.appendMessage", sessionId="s", message=msg("c1"))
        assert await ids(call) == ["u1", "a1", "u2", "c1"]
    async with open_host(data) as call:
        assert await ids(call) == ["u1", "a1", "u2", "c1"], "an acknowledged append was lost"
