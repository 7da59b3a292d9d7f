"""``make chaos`` in short: 20 real SIGKILLs of host and producer, nothing acknowledged lost.

The full run (``make chaos``, 200 kills) is too long for ``make test``; this one runs the
same script on a fixed seed, as a user would, and reads its summary.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SEED = 20261202
KILLS = 20


def figure(summary: str, name: str) -> int:
    """The number on the summary line ``name``."""
    match = re.search(rf"^\s*{name}\s+(\d+)\s*$", summary, re.MULTILINE)
    assert match is not None, f"no {name!r} line in the summary:\n{summary}"
    return int(match.group(1))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_twenty_kills_lose_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "chaos.py"),
            "--kills",
            str(KILLS),
            "--seed",
            str(SEED),
            "--dir",
            str(tmp_path / "chaos"),
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=280,
    )
    report = f"stdout:\n{proc.stdout}\nstderr (tail):\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, report
    assert figure(proc.stdout, "kills") == KILLS, report
    assert figure(proc.stdout, "losses") == 0, report
    assert figure(proc.stdout, "violations") == 0, report
    assert figure(proc.stdout, "survived") == KILLS, report
