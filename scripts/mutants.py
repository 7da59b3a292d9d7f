#!/usr/bin/env python3
"""Plant small durability bugs, one at a time, in a scratch copy; print which survive.

Each mutant is one text substitution in one file of ``host/`` or ``outbox/`` (an fsync
left out, a sync flag dropped, a dirty mark forgotten, a cut one line off, a replay not
deduplicated, a wrong promotion status, a cancel that stops a started call, a limit
relaxed) and the tests that must go red on it. Its pattern must match exactly once in the
current code: a mutant gone stale (the code it names moved) fails loudly before anything
runs, never passes quietly. The suite is run against a scratch copy of this tree (never
this tree itself), with the copy first on ``PYTHONPATH`` so that every host and drive the
tests start runs the mutated code; the targeted tests must pass on the unmutated copy first.

    python scripts/mutants.py                  # every mutant, against its own tests
    python scripts/mutants.py --full           # every mutant, against the whole suite
    python scripts/mutants.py --only NAME ...  # some of them
    python scripts/mutants.py --list           # the table

Exit 0 when every mutant was killed, 1 when one survived, 2 when the table or the baseline
is broken. Not part of ``make test``: the targeted run takes minutes, ``--full`` an hour.
To re-point a mutant at moved code, edit its row of :data:`MUTANTS`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(
    ".git", ".venv", ".cache", "node_modules", "__pycache__", "*.pyc", ".*_cache", "data", "run"
)


@dataclass(frozen=True)
class Mutant:
    """One planted bug: ``old`` becomes ``new`` in ``file``; ``tests`` must go red."""

    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


# The tests of each mutant, by the outcome they check.
POWER_CUT = "tests/host/test_power_loss.py::test_power_cut_at_every_step"
OUTBOX_CUT = "tests/outbox/test_power_cut.py"
SEQUENCES = "tests/host/test_power_loss_sequences.py"
CANCEL = "tests/host/test_cancel.py"

# fmt: off
MUTANTS: list[Mutant] = [
    # -- outbox: the journal ----------------------------------------------------------------
    Mutant("outbox-group-commit-if", "outbox/_journal.py",
           "while self._synced < seq:", "if self._synced < seq:",
           (f"{OUTBOX_CUT}::test_a_row_written_while_another_row_s_fsync_runs_survives_a_power_cut",)),
    Mutant("outbox-append-no-fsync", "outbox/_journal.py",
           "await asyncio.to_thread(os.fsync, fd)", "await asyncio.to_thread(os.fstat, fd)",
           (f"{OUTBOX_CUT}::test_the_first_rows_of_a_new_journal_survive_a_power_cut",)),
    Mutant("outbox-new-journal-no-folder-fsync", "outbox/_journal.py",
           "self._dir_synced = os.path.lexists(self.path)", "self._dir_synced = True",
           (f"{OUTBOX_CUT}::test_the_first_rows_of_a_new_journal_survive_a_power_cut",)),
    Mutant("outbox-compaction-no-folder-fsync", "outbox/_journal.py",
           "        self._dir_synced = False\n        self._sync_dir()",
           "        self._dir_synced = True",
           (f"{OUTBOX_CUT}::test_a_row_enqueued_after_a_compaction_survives_a_power_cut",)),
    Mutant("outbox-rejected-no-fsync", "outbox/_journal.py",
           "                write_all(fd, data)\n                os.fsync(fd)\n",
           "                write_all(fd, data)\n",
           (f"{OUTBOX_CUT}::test_rows_set_aside_survive_a_power_cut",)),
    Mutant("outbox-rejected-no-folder-fsync", "outbox/_journal.py",
           "        if size == 0:  # a new file: its name is durable only once the folder is\n"
           "            fsync_dir(path)",
           "        if size == 0:  # a new file: its name is durable only once the folder is\n"
           "            pass",
           (f"{OUTBOX_CUT}::test_rows_set_aside_survive_a_power_cut",)),
    Mutant("outbox-torn-tail-cut-one-line-more", "outbox/_journal.py",
           "            os.ftruncate(self._fd, pos)\n",
           '            os.ftruncate(self._fd, data.rfind(b"\\n", 0, pos - 1) + 1)\n',
           ("tests/outbox/test_journal.py::test_torn_last_line_is_cut_and_later_entries_read_back",)),
    Mutant("outbox-acks-not-replayed-at-open", "outbox/_journal.py",
           "                self.pending.pop(line.ack, None)", "                pass",
           ("tests/outbox/test_regenerate.py",)),
    Mutant("outbox-refused-acks-never-written", "outbox/_journal.py",
           "        if self._unwritten:\n            self._write_acks([])\n", "",
           ("tests/outbox/test_journal.py::test_acks_a_full_disk_refused_are_written_before_a_cut_or_it_is_refused",)),
    Mutant("outbox-second-outbox-not-locked-out", "outbox/_journal.py",
           "fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)", "pass",
           ("tests/outbox/test_journal.py::test_a_second_outbox_on_the_same_journal_is_refused",)),
    # -- outbox: the drain and the driver ---------------------------------------------------
    Mutant("outbox-transient-error-drops-rows", "outbox/_outbox.py",
           'DROP = {"NOT_FOUND", "INVALID_PARAMS", "CONFLICT", "PARSE_ERROR"}',
           'DROP = {"NOT_FOUND", "INVALID_PARAMS", "CONFLICT", "PARSE_ERROR", "STORAGE_ERROR"}',
           ("tests/outbox/test_drain.py",)),
    Mutant("outbox-id-limit-relaxed", "outbox/_rows.py",
           "[A-Za-z0-9._:-]{1,128}", "[A-Za-z0-9._:-]{1,256}",
           ("tests/outbox/test_bad_rows.py",)),
    Mutant("outbox-cut-acks-not-synced", "outbox/_driver.py",
           "        await self.outbox.journal.sync_acks()\n", "",
           ("tests/outbox/test_regenerate.py",)),
    Mutant("host-recover-ignores-keep", "host/_turns.py",
           "            if sid in keep:\n                continue\n", "",
           ("tests/outbox/test_host_dies_midturn.py",)),
    Mutant("outbox-crashed-turn-not-promoted", "outbox/_driver.py",
           'params = {"status": "aborted", "recoverInflight": True}',
           'params = {"status": "aborted"}',
           ("tests/outbox/test_crashed_turn.py",)),
    # -- host: the file system seam ---------------------------------------------------------
    Mutant("host-checkpoint-write-no-dsync", "host/_fs.py",
           "done = os.pwritev(fd, parts, 0, _RWF_DSYNC)", "done = os.pwritev(fd, parts, 0)",
           ("tests/host/test_power_loss.py::test_an_answered_checkpoint_survives_a_power_cut",)),
    Mutant("host-new-file-no-fsync", "host/_fs.py",
           "            self.write_all(fd, data)\n            self.fsync(fd)\n",
           "            self.write_all(fd, data)\n",
           (f"{POWER_CUT}[truncate-regenerate]",)),
    Mutant("host-rename-no-folder-fsync", "host/_fs.py",
           "            renamed = True\n            self.fsync_dir(os.path.dirname(path))",
           "            renamed = True",
           (f"{POWER_CUT}[checkpoint]", f"{POWER_CUT}[truncate-regenerate]")),
    Mutant("host-swap-no-folder-fsync", "host/_fs.py",
           "        try:\n            self.fsync_dir(os.path.dirname(path))\n"
           "        except BaseException:\n            with contextlib.suppress(OSError):",
           "        try:\n            pass\n"
           "        except BaseException:\n            with contextlib.suppress(OSError):",
           (f"{POWER_CUT}[checkpoint-again]",)),
    # -- host: the store, the turn log, the index -------------------------------------------
    Mutant("host-append-no-fsync", "host/_session.py",
           "    stamp = transcript.stamp()\n    transcript.sync()\n",
           "    stamp = transcript.stamp()\n",
           (f"{POWER_CUT}[append]",)),
    Mutant("host-turn-log-no-fsync", "host/_turnlog.py",
           "                fs.write_all(fd, line)  # all of it, or it raises\n"
           "                fs.fsync(fd)\n",
           "                fs.write_all(fd, line)  # all of it, or it raises\n",
           (f"{POWER_CUT}[end-turn]",)),
    Mutant("host-dirty-mark-not-synced", "host/_index.py",
           "        async with self.transaction(durable=True) as db:\n"
           '            await db.execute("UPDATE sessions SET dirty = 1',
           "        async with self.transaction(durable=False) as db:\n"
           '            await db.execute("UPDATE sessions SET dirty = 1',
           (SEQUENCES,)),
    Mutant("host-change-no-dirty-mark", "host/_session.py",
           "        await reg.index.mark_dirty(self.id)\n", "",
           (SEQUENCES,)),
    Mutant("host-change-apply-not-idempotent", "host/_intents.py",
           "        with contextlib.suppress(FileNotFoundError):"
           "  # renamed already: only the fsync left\n"
           "            self.fs.rename(",
           "        if True:\n            self.fs.rename(",
           ("tests/host/test_crash_points.py", "tests/host/test_after_fault.py")),
    Mutant("host-change-folder-not-synced-before-record", "host/_intents.py",
           "                self.fs.fsync_dir(self.archive.folder(sid, change.root_id))\n",
           "                pass\n",
           (f"{POWER_CUT}[save-active]", f"{POWER_CUT}[truncate-regenerate]")),
    Mutant("host-delete-no-dirty-mark", "host/_store.py",
           "        await self.index.mark_dirty(sid)  # a same-id",
           "        pass  # a same-id",
           (SEQUENCES,)),
    # -- host: recovery, history, appends, turns, the endpoint ------------------------------
    Mutant("host-start-reconciles-only-shorter-files", "host/_recovery.py",
           "        elif not row.matches(FileStamp.of(os.stat(store.layout.transcript(sid)))):",
           "        elif FileStamp.of(os.stat(store.layout.transcript(sid))).size < row.byte_size:",
           ("tests/host/test_deferred_index.py",)),
    Mutant("host-truncate-one-line-off", "host/_history.py",
           "            if row is not None:\n                return row.line\n",
           "            if row is not None:\n                return row.line + 1\n",
           ("tests/e2e/test_truncate.py",)),
    Mutant("host-replay-not-deduplicated", "host/_sessions.py",
           "            if a.msg.id in stored:", "            if False:",
           ("tests/e2e/test_append.py",)),
    Mutant("host-leftover-promoted-complete", "host/_turns.py",
           '        row = await self.promote(s, cp, "aborted")\n        if turn == "running":',
           '        row = await self.promote(s, cp, "complete")\n        if turn == "running":',
           ("tests/e2e/test_checkpoints.py",)),
    Mutant("host-end-turn-promotes-complete", "host/_turns.py",
           'recovered = await self.promote(s, cp, "aborted") is not None',
           'recovered = await self.promote(s, cp, "complete") is not None',
           ("tests/e2e/test_checkpoints.py",)),
    Mutant("host-cancel-stops-a-started-call", "host/_locks.py",
           "        if self.started or not self.keys:\n            return False",
           "        if not self.keys:\n            return False",
           (CANCEL,)),
    Mutant("host-calls-in-flight-relaxed", "host/_limits.py",
           "CALLS_IN_FLIGHT = 1_024\n", "CALLS_IN_FLIGHT = 1_024 * 1_024\n",
           ("tests/host/test_endpoint.py::test_reading_pauses_at_the_bound_of_calls_in_flight_and"
            "_resumes_after",)),
]
# fmt: on


def check_table(mutants: Sequence[Mutant]) -> list[str]:
    """What is wrong with the table: a pattern that does not match exactly once, a name twice."""
    problems = []
    names = [m.name for m in mutants]
    problems += [f"{n}: named twice" for n in sorted({n for n in names if names.count(n) > 1})]
    for m in mutants:
        path = REPO / m.file
        if not path.is_file():
            problems.append(f"{m.name}: {m.file} does not exist")
            continue
        found = path.read_text().count(m.old)
        if found != 1:
            problems.append(f"{m.name}: its pattern matches {found} times in {m.file}, not once")
        if not m.tests:
            problems.append(f"{m.name}: no tests")
    return problems


def scratch_copy() -> Path:
    """A copy of this tree (no .git, no venv, no caches) in a new temp folder."""
    root = Path(tempfile.mkdtemp(prefix="hostcore-mutants-"))
    tree = root / "tree"
    shutil.copytree(REPO, tree, ignore=IGNORE, symlinks=True)
    return tree


def pytest(tree: Path, tests: Sequence[str], jobs: str, log: Path) -> tuple[int, float]:
    """Run pytest on ``tests`` in ``tree`` with its code first on the path; (exit, seconds)."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
    )
    env.pop("PYTEST_ADDOPTS", None)
    # -x only without workers: pytest-xdist stopped by -x exits 2 (interrupted), not 1
    stop = ["-x"] if jobs == "0" else []
    cmd = [sys.executable, "-m", "pytest", "-q", *stop, "-n", jobs, "-p", "no:cacheprovider"]
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run([*cmd, *tests], cwd=tree, env=env, stdout=out, stderr=out)
    return proc.returncode, time.monotonic() - t0


def runs_the_copy(tree: Path) -> bool:
    """Whether a Python started as the tests start it imports host and outbox from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = "import host, outbox; print(host.__file__); print(outbox.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True
    ).stdout.split()
    return len(out) == 2 and all(Path(p).is_relative_to(tree) for p in out)


def first_failure(log: Path) -> str:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(("FAILED tests", "ERROR tests")):
            return line.split(" - ")[0][:110]
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    ap.add_argument("--full", action="store_true", help="run the whole suite against each")
    ap.add_argument("--jobs", "-n", default="0", help="pytest-xdist workers (default 0)")
    ap.add_argument("--list", action="store_true", help="print the table and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy and the logs")
    a = ap.parse_args(argv)
    mutants = MUTANTS
    if a.only:
        unknown = sorted(set(a.only) - {m.name for m in MUTANTS})
        if unknown:
            print(f"no such mutant: {', '.join(unknown)}", file=sys.stderr)
            return 2
        mutants = [m for m in MUTANTS if m.name in a.only]
    if a.list:
        for m in mutants:
            print(f"{m.name:<42} {m.file:<20} {' '.join(m.tests)}")
        return 0
    problems = check_table(mutants)
    if problems:
        print("the mutant table is stale:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    tree = scratch_copy()
    logs = tree.parent / "logs"
    logs.mkdir()
    print(f"mutants: {len(mutants)}, scratch copy {tree}", file=sys.stderr)
    try:
        if not runs_the_copy(tree):
            print("the scratch copy's code is not what the tests would import", file=sys.stderr)
            return 2
        every = ["tests"] if a.full else sorted({t for m in mutants for t in m.tests})
        code, secs = pytest(tree, every, a.jobs, logs / "baseline.log")
        if code != 0:
            print(f"the tests fail with no mutant planted (exit {code}): see", file=sys.stderr)
            print(f"  {logs / 'baseline.log'}", file=sys.stderr)
            a.keep = True
            return 2
        print(f"baseline: the tests pass unmutated ({secs:.0f} s)", file=sys.stderr)
        survivors: list[str] = []
        for m in mutants:
            path = tree / m.file
            clean = path.read_text()
            path.write_text(clean.replace(m.old, m.new, 1))
            log = logs / f"{m.name}.log"
            try:
                code, secs = pytest(tree, ["tests"] if a.full else m.tests, a.jobs, log)
            finally:
                path.write_text(clean)
            if code == 0:
                verdict = "SURVIVED"
                survivors.append(m.name)
            elif code == 1:
                verdict = "killed"
            else:
                verdict = f"ERROR (pytest exit {code})"
                survivors.append(m.name)
                a.keep = True
            print(f"{m.name:<42} {verdict:<9} {secs:5.0f} s  {first_failure(log)}", flush=True)
        print(f"\n{len(mutants) - len(survivors)} of {len(mutants)} killed;", end=" ")
        print(f"survivors: {', '.join(survivors) if survivors else 'none'}")
        if survivors:
            a.keep = True
        return 1 if survivors else 0
    finally:
        if a.keep:
            print(f"kept: {tree.parent}", file=sys.stderr)
        else:
            shutil.rmtree(tree.parent, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
