"""The outbox journal: durable on return, torn tail cut, group commit, compaction."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import random
import signal
import stat
import threading
from pathlib import Path

import pytest

from outbox import Journal, _journal
from tests.outbox.kit import WAIT, python, reap, until

PRODUCER = """
import asyncio, sys
from outbox import Journal

async def writer(j, w):
    for i in range(1_000_000):
        body = b'{"id":"w%d-%d","role":"assistant","content":"%s"}' % (w, i, b"x" * (i % 300))
        entry = await j.append("s%d" % w, body, "t%d" % w)
        print(entry.seq, flush=True)

async def main():
    async with Journal.open(sys.argv[1]) as j:
        await asyncio.gather(*(writer(j, w) for w in range(4)))

asyncio.run(main())
"""


def body(seq: int) -> bytes:
    return b'{"id":"m%d","role":"user","content":"text %d"}' % (seq, seq)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_entry_whose_append_returned_survives_kill_9(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "app" / "outbox.jsonl"
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER)
    proc = await python(str(script), str(path))
    assert proc.stdout is not None
    kill_after = random.Random(seed).randrange(20, 400)
    printed: list[int] = []
    async with asyncio.timeout(WAIT):
        while len(printed) < kill_after:
            line = await proc.stdout.readline()
            assert line, f"the producer died early: {await reap(proc)}"
            printed.append(int(line))
    proc.send_signal(signal.SIGKILL)
    rest, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    printed += [int(n) for n in rest.split()]  # every seq it printed before it died
    assert proc.returncode == -signal.SIGKILL

    async with Journal.open(str(path)) as journal:
        missing = sorted(set(printed) - set(journal.pending))
        assert not missing, f"entries reported durable are gone after kill -9: {missing[:10]}"
        for seq in printed:
            entry = journal.pending[seq]
            message = json.loads(bytes(entry.message))
            assert message["id"].startswith("w") and entry.session_id == f"s{message['id'][1]}"
        assert journal.next_seq > max(printed)


async def test_torn_last_line_is_cut_and_later_entries_read_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "outbox.jsonl"
    async with Journal.open(str(path)) as journal:
        for seq in (1, 2):
            await journal.append("s", body(seq), "t")
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"seq":3,"sessionId":"s","message":{"id":"m3","ro')

    with caplog.at_level(logging.WARNING, logger="outbox.journal"):
        async with Journal.open(str(path)) as journal:
            assert sorted(journal.pending) == [1, 2]
            assert path.read_bytes() == whole, "the torn tail is cut on open"
            third = await journal.append("s", body(3), "t")
    assert "torn last entry" in caplog.text

    async with Journal.open(str(path)) as journal:
        assert sorted(journal.pending) == [1, 2, third.seq]
        assert bytes(journal.pending[third.seq].message) == body(3)


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    n = 500
    async with Journal.open(str(path)) as journal:
        entries = await asyncio.gather(
            *(journal.append(f"s{i % 7}", body(i), None) for i in range(n))
        )
        assert journal.fsyncs < n / 4, f"{journal.fsyncs} fsyncs for {n} concurrent appends"
    assert sorted(e.seq for e in entries) == list(range(1, n + 1))
    async with Journal.open(str(path)) as journal:
        assert len(journal.pending) == n


async def test_cancelling_one_append_does_not_fail_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow disk: the first fsync waits until the test lets it go (the edge is faked,
    # the file is real), so the cancel lands while that fsync leads the group.
    entered, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if not entered.is_set():
            entered.set()
            release.wait(WAIT)
        real_fsync(fd)

    async with Journal.open(str(tmp_path / "outbox.jsonl")) as journal:
        monkeypatch.setattr(os, "fsync", slow_fsync)
        first = asyncio.create_task(journal.append("s", body(1), None))
        await until(entered.is_set, "the first fsync to start")
        others = [asyncio.create_task(journal.append("s", body(i), None)) for i in (2, 3)]
        await until(lambda: len(journal.pending) == 3, "the other appends to write their lines")
        first.cancel()
        release.set()
        results = await asyncio.gather(*others, return_exceptions=True)
        with contextlib.suppress(asyncio.CancelledError):
            await first
        monkeypatch.undo()
    assert [type(r).__name__ for r in results] == ["Entry", "Entry"], results


async def test_journal_is_compacted_once_everything_is_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_journal, "COMPACT_BYTES", 2000)
    path = tmp_path / "outbox.jsonl"
    async with Journal.open(str(path)) as journal:
        entries = [await journal.append("s", body(i), None) for i in range(60)]
        grown = path.stat().st_size
        for entry in entries:
            journal.ack(entry.seq)
        assert path.stat().st_size < grown / 10, "acknowledged entries are compacted away"
        later = await journal.append("s", body(99), None)  # appends go to the new file
    async with Journal.open(str(path)) as journal:
        assert list(journal.pending) == [later.seq]
        assert bytes(journal.pending[later.seq].message) == body(99)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# Found at 4d444d5 (helper-22's producer pass): compaction waited for 4,096 acks with
# nothing pending, so 300 acknowledged tool rows of 1 MiB kept a 300 MB journal (read
# whole at the next open), and one entry never acknowledged kept every later one.
async def test_big_acknowledged_rows_are_compacted_while_one_stays_pending(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.jsonl"
    row = 256 << 10
    sizes = []
    async with Journal.open(str(path)) as journal:
        stuck = await journal.append("s", body(0), None)  # never acknowledged
        for i in range(1, 65):  # 16 MiB of rows, each acknowledged once delivered
            entry = await journal.append(
                "s", b'{"id":"t%d","role":"tool","c":"%s"}' % (i, b"x" * row), None
            )
            journal.ack(entry.seq)
            sizes.append(path.stat().st_size)
        assert list(journal.pending) == [stuck.seq]
    assert max(sizes) < _journal.COMPACT_BYTES + 3 * row, "the journal grows with what was acked"
    async with Journal.open(str(path)) as journal:
        assert list(journal.pending) == [stuck.seq]
        assert bytes(journal.pending[stuck.seq].message) == body(0)


HOLDER = """
import asyncio, sys
from outbox import Journal

async def main():
    async with Journal.open(sys.argv[1]) as j:
        await j.append("s", b'{"id":"m1","role":"user"}', None)
        print("open", flush=True)
        await asyncio.sleep(3600)  # until killed

asyncio.run(main())
"""


# Found at 4d444d5 (helper-22): a second app instance on the same journal compacted it
# (a rename over it) while the first kept appending to the unlinked file: its later
# rows, reported durable, were gone after a restart.
async def test_a_second_outbox_on_the_same_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    proc = await python("-c", HOLDER, str(path))
    assert proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), WAIT) == b"open\n"
        with pytest.raises(_journal.JournalBusy, match=f"pid {proc.pid}"):
            async with Journal.open(str(path)):
                pass
        assert [json.loads(line)["seq"] for line in path.read_bytes().splitlines()] == [1]
    finally:
        proc.kill()
        await proc.wait()
    async with Journal.open(str(path)) as journal:  # its holder killed: it opens
        assert list(journal.pending) == [1]


async def test_reopening_a_fully_acknowledged_journal_compacts_it(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    async with Journal.open(str(path)) as journal:
        for i in range(20):
            journal.ack((await journal.append("s", body(i), None)).seq)
        kept = await journal.append("s", body(20), None)
    async with Journal.open(str(path)) as journal:
        assert list(journal.pending) == [kept.seq], "the unacknowledged entry survives"
        journal.ack(kept.seq)
    assert path.stat().st_size > 0
    async with Journal.open(str(path)) as journal:
        assert not journal.pending
    assert path.stat().st_size == 0


FULL_DISK = """
import asyncio, os, resource, signal, sys
from outbox import Journal

async def main():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a short write, then EFBIG: a full disk
    async with Journal.open(sys.argv[1]) as j:
        await j.append("s", b'{"id":"m1","role":"user","content":"hi"}', "t")
        size = os.path.getsize(sys.argv[1])
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, resource.RLIM_INFINITY))
        try:
            await j.append("s", b'{"id":"m2","role":"user","content":"%s"}' % (b"x" * 200), "t")
            print("m2 durable", flush=True)
        except OSError:
            print("m2 refused", flush=True)
        full = os.path.getsize(sys.argv[1])
        resource.setrlimit(resource.RLIMIT_FSIZE, (full, resource.RLIM_INFINITY))
        j.ack(1)  # no room for the ack either: logged, not raised
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)  # room again
        await j.append("s", b'{"id":"m3","role":"user","content":"again"}', "t")
        print("m3 durable", flush=True)

asyncio.run(main())
"""


# Found at 0a904eb: os.write's count was not checked. A full disk wrote part of an entry and
# append returned "durable"; the next entry ran into it, and both were lost at reopen.
async def test_a_full_disk_refuses_the_entry_and_loses_none_after_it(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    proc = await python("-c", FULL_DISK, str(path))
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out.decode().split() == ["m2", "refused", "m3", "durable"]
    assert "ack of entry 1 not written" in err.decode()
    async with Journal.open(str(path)) as journal:
        messages = [json.loads(bytes(e.message))["id"] for e in journal.pending.values()]
    assert messages == ["m1", "m3"]  # m1's ack was lost: sent again, which the host dedups
    assert not path.with_name(path.name + ".quarantine").exists()


ACKS_ON_A_FULL_DISK = """
import asyncio, os, resource, signal, sys
from outbox import Journal

async def main():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a short write, then EFBIG: a full disk
    async with Journal.open(sys.argv[1]) as j:
        for i in (1, 2):
            await j.append("s", b'{"id":"a%d","role":"assistant","content":"hi"}' % i, "t")
        size = os.path.getsize(sys.argv[1])
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
        j.ack(1)
        j.ack(2)  # both refused: logged
        try:
            await j.sync_acks()
            print("synced", flush=True)
        except OSError:
            print("refused", flush=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)  # room again
        await j.sync_acks()
        print("synced", flush=True)

asyncio.run(main())
"""


# Found at 4d444d5 (helper-22): acks a full disk refused were never written, and the
# fsync of acks before a regenerate's cut made only the written ones durable; the cut
# took the reply away, and the restart sent it again, after the regenerated one.
async def test_acks_a_full_disk_refused_are_written_before_a_cut_or_it_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.jsonl"
    proc = await python("-c", ACKS_ON_A_FULL_DISK, str(path))
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out.decode().split() == ["refused", "synced"]
    async with Journal.open(str(path)) as journal:
        assert journal.pending == {}, "an ack made durable before a cut is replayed"


async def test_a_message_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    async with Journal.open(str(path)) as journal:
        for bad in (b"not json", b'{"id":"m1"', "caf\u00e9".encode("latin-1")):
            with pytest.raises(ValueError):
                await journal.append("s", bad, "t")
        assert journal.pending == {}
    assert path.read_bytes() == b""


async def test_entries_after_a_compaction_whose_folder_fsync_failed_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_journal, "COMPACT_BYTES", 1)
    path = tmp_path / "outbox.jsonl"
    real_fsync = os.fsync
    failed: list[int] = []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode) and not failed:
            failed.append(fd)
            raise OSError(errno.EIO, "folder fsync failed")
        real_fsync(fd)

    async with Journal.open(str(path)) as journal:
        first = await journal.append("s", b'{"id":"m1","role":"user"}', None)
        monkeypatch.setattr(os, "fsync", fsync)
        journal.ack(first.seq)  # compacts: rename done, then the folder fsync fails
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert failed
        second = await journal.append("s", b'{"id":"m2","role":"user"}', None)  # "durable"
    async with Journal.open(str(path)) as journal:
        assert second.seq in journal.pending, "an entry append reported durable is gone"


@pytest.mark.parametrize(
    "row",
    [
        b'{"id":"t1","role":"tool","value":1e999}',  # JSON syntax no decoder can read back
        b'{"id":"t1","role":"tool","n":' + b"[" * 3000 + b"]" * 3000 + b"}",  # past the host
    ],
)
async def test_a_row_the_host_or_client_could_not_read_is_refused_and_not_written(
    tmp_path: Path, row: bytes
) -> None:
    path = tmp_path / "outbox.jsonl"
    async with Journal.open(str(path)) as journal:
        with pytest.raises(ValueError):
            await journal.append("s", row, None)
        assert journal.pending == {}
        ok = await journal.append(
            "s", b'{"id":"t2","role":"tool","n":' + b"[" * 200 + b"]" * 200 + b"}", None
        )
    async with Journal.open(str(path)) as journal:
        assert list(journal.pending) == [ok.seq]  # one refused row holds nothing back


async def test_a_compaction_a_full_disk_refuses_leaves_nothing_and_is_not_retried_per_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Since a compaction copies pending entries, a full disk can refuse it: its half copy
    was left behind, one more at every ack, each ack copying every pending entry again; a
    refused one at open failed the open. Now the copy is removed, the next try waits for as
    many bytes more to be acknowledged, and an open goes on uncompacted."""
    monkeypatch.setattr(_journal, "COMPACT_BYTES", 2000)
    tries: list[str] = []

    def full(path: str, data: bytes) -> None:  # a full disk: half the copy, then ENOSPC
        tries.append(path)
        with open(path, "xb") as f:
            f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", path)

    path = tmp_path / "outbox.jsonl"
    async with Journal.open(str(path)) as journal:
        stuck = await journal.append("s", body(0), None)  # pending throughout
        monkeypatch.setattr(_journal, "write_new", full)
        for i in range(1, 200):
            journal.ack((await journal.append("s", body(i), None)).seq)
        # a try per 2,000 bytes acknowledged at most, not one per ack
        assert 1 <= len(tries) <= path.stat().st_size // 2000, (len(tries), path.stat())
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    with path.open("ab") as f:
        f.write(b"#a damaged line#\n")  # an open that quarantines it compacts
    async with Journal.open(str(path)) as journal:  # refused: the open goes on
        assert list(journal.pending) == [stuck.seq]
    monkeypatch.undo()
    async with Journal.open(str(path)) as journal:
        assert list(journal.pending) == [stuck.seq]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


async def test_entries_after_a_compaction_whose_new_file_could_not_be_opened_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found at a11d84c (helper-23): the new file was opened after the rename; an open
    that failed then (EMFILE) left the journal appending into the old file, unlinked by
    the rename: the next entry, reported durable, was gone at the next open. It is opened
    before the rename now, and a failure there leaves the old file the journal."""
    monkeypatch.setattr(_journal, "COMPACT_BYTES", 2000)
    real, failed = _journal.open_regular, []

    def emfile(path: str, flags: int = os.O_RDONLY) -> int:
        if flags == os.O_RDWR | os.O_APPEND and not failed:  # the compacted file's open
            failed.append(path)
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real(path, flags)

    path = tmp_path / "outbox.jsonl"
    async with Journal.open(str(path)) as journal:
        stuck = await journal.append("s", body(0), None)
        monkeypatch.setattr(_journal, "open_regular", emfile)
        for i in range(1, 60):
            journal.ack((await journal.append("s", body(i), None)).seq)
            if failed:  # the compaction failed here: no other one before the next entry
                break
        assert failed
        later = await journal.append("s", body(99), None)  # reported durable
    monkeypatch.undo()
    async with Journal.open(str(path)) as journal:
        assert set(journal.pending) >= {stuck.seq, later.seq}


async def test_a_compactions_copy_a_kill_left_is_removed_at_open(tmp_path: Path) -> None:
    """Found at a11d84c (helper-23): a kill during a compaction, which now copies what is
    pending (150 MiB in its run), left the copy for good; one more at each such kill."""
    path = tmp_path / "outbox.jsonl"
    async with Journal.open(str(path)) as journal:
        kept = await journal.append("s", body(1), None)
    left = tmp_path / "outbox.jsonl.0badf00d.tmp"  # what the kill left
    left.write_bytes(b'{"seq":1,"sessionId":"s","mess')
    other = tmp_path / "notes.jsonl.0badf00d.tmp"  # not the journal's: left alone
    other.write_bytes(b"x")
    async with Journal.open(str(path)) as journal:
        assert list(journal.pending) == [kept.seq]
    assert not left.exists() and other.exists()
