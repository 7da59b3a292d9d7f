"""The outbox journal under a power cut: a row ``enqueue`` reported durable is there after it.

The journal has no file-system seam, so the power-cut model (:mod:`tests.powercut`) stands
in for ``os`` in ``outbox._journal`` and ``outbox._files`` and judges their system calls:
a line is kept only if an fsync that began after it was written returned, a new file's
name only once its folder was fsynced. Everything else is lost at the cut, as on a real
disk. An app opened on that image must still hold every row it was told is durable
(pending in the journal), and every row it set aside (in ``outbox.jsonl.rejected``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

import outbox._files
import outbox._journal
from outbox import Journal, Outbox
from tests.outbox.kit import WAIT, FakeHost, until
from tests.powercut import SYSCALLS, Disk

JOURNAL = "outbox.jsonl"


def row(mid: str) -> dict[str, str]:
    return {"id": mid, "role": "assistant", "content": f"text of {mid}"}


@pytest.fixture
def app(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    return folder


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal's system calls go through the power-cut model."""
    for module in (outbox._journal, outbox._files):
        monkeypatch.setattr(module, "os", SYSCALLS)


async def after_a_cut(disk: Disk, image: Path) -> tuple[set[str], set[str]]:
    """Cut the power now; return the ids the app then finds pending and set aside."""
    disk.image_files(str(image))
    async with Journal.open(str(image / JOURNAL)) as journal:
        pending = {json.loads(bytes(e.message))["id"] for e in journal.pending.values()}
    rejected = image / (JOURNAL + ".rejected")
    aside = set()
    if rejected.exists():
        aside = {json.loads(line)["message"]["id"] for line in rejected.read_text().splitlines()}
    return pending, aside


async def test_the_model_sees_the_journal_s_fsyncs(app: Path, watched: None) -> None:
    disk = Disk(str(app))
    async with Outbox.open(str(app / JOURNAL)) as box:
        await box.enqueue("s", row("a"))
    assert disk.syncs >= 1, "the journal's fsyncs do not reach the model: it judges nothing"


async def test_the_first_rows_of_a_new_journal_survive_a_power_cut(
    app: Path, watched: None, tmp_path: Path
) -> None:
    disk = Disk(str(app))  # no journal yet: the app's first start
    async with Outbox.open(str(app / JOURNAL)) as box:
        for mid in ("a", "b"):
            await box.enqueue("s", row(mid))
        pending, _ = await after_a_cut(disk, tmp_path / "image")
    assert pending == {"a", "b"}


async def test_a_row_written_while_another_row_s_fsync_runs_survives_a_power_cut(
    app: Path, watched: None, tmp_path: Path
) -> None:
    """Group commit: a row written while an fsync is in flight needs the next one.

    That fsync chose its bytes before the row was written; returning after it, the row's
    enqueue would report durable a line that only the page cache holds.
    """
    path = app / JOURNAL
    async with Outbox.open(str(path)) as box:
        await box.enqueue("s", row("first"))
        disk = Disk(str(app))  # from here on the model tracks it
        entered, release = threading.Event(), threading.Event()

        def slow(_path: str) -> None:  # the next fsync: its bytes chosen, not yet returned
            disk.hold = None
            entered.set()
            release.wait(WAIT)

        disk.hold = slow
        a = asyncio.ensure_future(box.enqueue("s", row("a")))
        try:
            assert await asyncio.to_thread(entered.wait, WAIT), "a's fsync never started"
            b = asyncio.ensure_future(box.enqueue("s", row("b")))
            await until(lambda: b'"b"' in path.read_bytes(), "b written behind a's fsync")
        finally:
            release.set()
        await a
        await b  # both reported durable
        pending, _ = await after_a_cut(disk, tmp_path / "image")
    assert pending == {"first", "a", "b"}


async def test_rows_set_aside_survive_a_power_cut(app: Path, watched: None, tmp_path: Path) -> None:
    """Rows the host refused leave the journal only once ``.rejected`` holds them durably.

    Their acks are not fsynced, but the next row's fsync makes them durable with it: from
    then on the rows are in ``.rejected`` or nowhere.
    """
    disk = Disk(str(app))
    host = FakeHost()
    host.failing_sessions["gone"] = "NOT_FOUND"
    async with Outbox.open(str(app / JOURNAL)) as box:
        box.backoff = (0.001, 0.01)
        for mid in ("x1", "x2"):
            await box.enqueue("gone", row(mid))
        box.attach(host)  # type: ignore[arg-type]
        await box.drain(WAIT)
        assert box.stats["dropped"] == 2
        box.attach(None)
        await box.enqueue("s", row("later"))  # its fsync carries the acks written before it
        pending, aside = await after_a_cut(disk, tmp_path / "image")
    assert pending == {"later"}
    assert aside == {"x1", "x2"}


async def test_a_row_enqueued_after_a_compaction_survives_a_power_cut(
    app: Path, watched: None, tmp_path: Path
) -> None:
    """A start compacts a journal whose every entry was acknowledged (a new file renamed
    over it): a row enqueued after it is durable only once that name is."""
    host = FakeHost()
    async with Outbox.open(str(app / JOURNAL)) as box:
        box.attach(host)  # type: ignore[arg-type]
        await box.enqueue("s", row("old"))
        await box.drain(WAIT)
    disk = Disk(str(app))  # a clean stop: what it left is durable
    async with Outbox.open(str(app / JOURNAL)) as box:  # compacts it
        await box.enqueue("s", row("new"))
        pending, _ = await after_a_cut(disk, tmp_path / "image")
    assert pending == {"new"}
