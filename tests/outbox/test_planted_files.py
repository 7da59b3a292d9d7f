"""A symlink, FIFO or folder planted where the producer writes a file (issue 36, case 7).

The producer holds to the host's rule: no link followed, no FIFO opened blocking, only a
regular file written. A file it appends to beside the journal (``.rejected``,
``.quarantine``, the host's and pi's logs) finds the planted thing moved aside to
``<name>.odd-<hex>`` (the link itself, never what it points to), logged, and a file made in
its place, as the host does with its sidecars. The journal itself is the only copy of the
rows not yet delivered: ``drive`` refuses to open one that is not a regular file and says
so in one line. pi's session file and ``drive``'s run count are written whole, as a new
file renamed over whatever is there, which is never opened.
Each case runs ``python -m outbox drive`` against a real host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from outbox._journal import Entry, _sealed
from tests.outbox.kit import CAPTURES, drive_pi, finished, python, spawned, stored
from tests.outbox.test_bad_rows import ECHO, ok

VICTIM = b"a file of the user's, elsewhere\n"


def plant(path: Path, kind: str, victim: Path) -> None:
    """A symlink to ``victim``, a FIFO or a folder at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        os.symlink(victim, path)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.mkdir(mode=0o700)


def is_kind(path: Path, kind: str) -> bool:
    test: Callable[[int], bool] = {
        "symlink": stat.S_ISLNK,
        "fifo": stat.S_ISFIFO,
        "folder": stat.S_ISDIR,
    }[kind]
    return test(os.lstat(path).st_mode)


def journal_lines(entries: list[tuple[str, dict[str, object]]]) -> list[bytes]:
    enc = msgspec.json.Encoder()
    return [
        _sealed(enc.encode(Entry(seq, sid, msgspec.Raw(enc.encode(m)), "t1"))).rstrip(b"\n")
        for seq, (sid, m) in enumerate(entries, start=1)
    ]


async def data_dir(tmp_path: Path, journal: list[bytes]) -> Path:
    """A data dir with session ``s`` on the host and ``journal`` as the outbox's lines."""
    data = tmp_path / "data"
    (data / "app").mkdir(parents=True)
    async with spawned(data / "host") as client:
        await client.call("session.create", {"sessionId": "s"})
    (data / "app" / "outbox.jsonl").write_bytes(b"".join(line + b"\n" for line in journal))
    return data


async def recover(data: Path) -> tuple[int, str]:
    args = ("-m", "outbox", "drive", "--recover-only", "--json", "--data-dir", str(data))
    code, _, err = await finished(await python(*args, start_new_session=True))
    return code, err


def moved_aside(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.odd-*"))


def regular_0600(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
async def test_a_thing_planted_at_rejected_is_moved_aside_and_the_row_set_aside_in_a_file(
    tmp_path: Path, kind: str
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    data = await data_dir(tmp_path, journal_lines([("s", ok("a0")), ("s", ECHO), ("s", ok("a1"))]))
    rejected = data / "app" / "outbox.jsonl.rejected"
    plant(rejected, kind, victim)
    code, err = await recover(data)
    assert code == 0, err
    assert victim.read_bytes() == VICTIM, "nothing written through the link"
    (aside,) = moved_aside(rejected)
    assert is_kind(aside, kind)
    assert f"{rejected} is not a regular file" in err
    assert regular_0600(rejected)
    assert msgspec.json.decode(rejected.read_bytes())["message"] == ECHO
    async with spawned(data / "host") as client:
        assert [m["id"] for m in await stored(client, "s")] == ["a0", "a1"]


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
async def test_a_thing_planted_at_quarantine_is_moved_aside_and_the_bad_line_kept_in_a_file(
    tmp_path: Path, kind: str
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    good, spoiled = journal_lines([("s", ok("a0")), ("s", ok("a1"))])
    spoiled = spoiled.replace(b'"a1"', b'"b1"')  # its CRC no longer matches
    data = await data_dir(tmp_path, [good, spoiled])
    quarantine = data / "app" / "outbox.jsonl.quarantine"
    plant(quarantine, kind, victim)
    code, err = await recover(data)
    assert code == 0, err
    assert victim.read_bytes() == VICTIM
    (aside,) = moved_aside(quarantine)
    assert is_kind(aside, kind)
    assert regular_0600(quarantine) and quarantine.read_bytes().count(b"\n") == 1


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
async def test_a_journal_that_is_not_a_regular_file_is_refused_in_one_line(
    tmp_path: Path, kind: str
) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"  # another journal, with a row still to send
    elsewhere.write_bytes(journal_lines([("s", ok("a0"))])[0] + b"\n")
    data = await data_dir(tmp_path, [])
    journal = data / "app" / "outbox.jsonl"
    journal.unlink()
    plant(journal, kind, elsewhere)
    before = elsewhere.read_bytes()
    code, err = await recover(data)
    assert code == 1
    assert err.strip().splitlines() == [
        f"drive: the outbox journal is not a regular file (a symlink, FIFO or folder);"
        f" the outbox writes through none: {journal}"
    ]
    assert elsewhere.read_bytes() == before, "no ack written through the link"
    assert is_kind(journal, kind)


@pytest.mark.parametrize("where", ["host.log", "pi.log"])
async def test_a_fifo_planted_at_a_log_drive_writes_is_moved_aside(
    tmp_path: Path, where: str
) -> None:
    data = await data_dir(tmp_path, [])
    planted = data / where
    if planted.exists():
        planted.unlink()
    plant(planted, "fifo", tmp_path)
    proc = await drive_pi(data, str(CAPTURES / "text"), "--sessions", "1", "--turns", "1")
    code, facts, err = await finished(proc)
    assert code == 0, err
    assert facts[-1]["outcomes"] == {"completed": 1}
    (aside,) = moved_aside(planted)
    assert is_kind(aside, "fifo")
    assert regular_0600(planted)


@pytest.mark.parametrize(
    ("where", "kind"),
    [("app/pi/s0.jsonl", "symlink"), ("app/runs", "symlink"), ("app/runs", "fifo")],
)
async def test_a_file_replaced_whole_replaces_what_is_planted_never_opening_it(
    tmp_path: Path, where: str, kind: str
) -> None:
    """pi's session file and ``drive``'s run count: a new file renamed over the name."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    data = await data_dir(tmp_path, [])
    plant(data / where, kind, victim)
    proc = await drive_pi(data, str(CAPTURES / "text"), "--sessions", "1", "--turns", "1")
    code, facts, err = await finished(proc)
    assert code == 0, err
    assert facts[-1]["outcomes"] == {"completed": 1}
    assert victim.read_bytes() == VICTIM
    assert regular_0600(data / where)
