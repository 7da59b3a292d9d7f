"""``scripts/bench.py --quick --json`` runs to the end and reports every figure.

Only that: no timing is asserted here (STYLE.md rule 10); machines are shared and noisy.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIGURES = (
    "append_one",
    "append_backlog",
    "update_message",
    "update_memory",
    "get_page",
    "truncate_tail",
    "save_inflight",
    "host_start",
    "host_start_bytes",
)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_bench_prints_every_figure_with_a_ratio(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/bench.py", "--quick", "--json", "--dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    figures = {f["key"]: f for f in report["figures"]}
    assert set(FIGURES) <= set(figures), sorted(figures)
    for key in FIGURES:
        ratio = figures[key]["ratio"]
        assert isinstance(ratio, int | float) and math.isfinite(ratio), (key, ratio)
        assert isinstance(figures[key]["met"], bool)
    rewrite = [p for p in report["peers"] if p["key"].startswith("peer_rewrite_")]
    assert len(rewrite) == 3 and all(isinstance(p["ratio"], float) for p in rewrite)
    assert list(tmp_path.iterdir()) == []  # the run's folder is removed


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_watch_bench_reports_every_figure(tmp_path: Path) -> None:
    """``scripts/bench_watch.py --quick --json``: each figure, every event delivered."""
    proc = subprocess.run(
        [sys.executable, "scripts/bench_watch.py", "--quick", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    figures = {f["figure"]: f for f in json.loads(proc.stdout)["figures"]}
    assert set(figures) == {"event_latency", "append_watched", "stalled_watcher"}
    assert figures["event_latency"]["events"] == figures["event_latency"]["expected"]
    assert math.isfinite(figures["append_watched"]["ratio"])
