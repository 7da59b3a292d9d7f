"""docs/python-api.md's agent loop runs as written, and the API it shows is typed.

The example is taken out of the page itself (its first ``python`` code block) and run as
a user would save and run it, in a folder of its own, against the real host it spawns;
what it prints is compared with the page's ``text`` block after it. Its typing is checked
as an app's would be: ``mypy --strict`` outside the repo, with hostcore installed from its
wheel (so the packages' ``py.typed`` markers are what makes them typed).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import outbox
from tests.conftest import REPO

PAGE = REPO / "docs" / "python-api.md"


def blocks(lang: str) -> list[str]:
    """The page's fenced code blocks in ``lang``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)


@pytest.fixture
def my_app(tmp_path: Path) -> Path:
    """The page's example, saved as the page says, in a folder of its own."""
    app = tmp_path / "app"
    app.mkdir()
    path = app / "my_app.py"
    path.write_text(blocks("python")[0])
    return path


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_pages_agent_loop_persists_its_turn_and_a_rerun_stores_nothing_twice(
    my_app: Path,
) -> None:
    (printed,) = blocks("text")
    data = my_app.parent / "data"
    first = run(sys.executable, my_app, "./data", cwd=my_app.parent)
    assert (first.returncode, first.stdout) == (0, printed), first.stderr[-3000:]
    transcript = data / "host" / "sessions" / "chat.jsonl"
    rows = [json.loads(line) for line in transcript.read_bytes().splitlines()]
    assert rows == [
        {"id": "t1-u", "role": "user", "content": "Plan a day in Lyon", "turnId": "t1"},
        {
            "id": "t1-a",
            "role": "assistant",
            "content": "You asked: Plan a day in Lyon",
            "status": "complete",
            "turnId": "t1",
        },
    ]
    stored = transcript.read_bytes()
    again = run(sys.executable, my_app, "./data", cwd=my_app.parent)
    assert (again.returncode, again.stdout) == (0, printed), again.stderr[-3000:]
    assert transcript.read_bytes() == stored
    assert (data / "app" / "outbox.jsonl").exists()  # the rows went through the journal
    check = run(sys.executable, "-m", "host", "verify", "--data-dir", data / "host", cwd=REPO)
    assert check.returncode == 0, check.stdout


def test_the_pages_agent_loop_type_checks_against_the_installed_wheel(
    my_app: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    keep = shutil.ignore_patterns("__pycache__")
    for name in ("host", "outbox"):
        shutil.copytree(REPO / name, src / name, ignore=keep)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    built = run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        wheels,
        ".",
        cwd=src,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("hostcore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"host/py.typed", "outbox/py.typed"} <= set(names)
    env = tmp_path / "env"  # an app's own environment: hostcore installed, nothing else
    venv.create(env, with_pip=False)
    py = env / "bin" / "python"
    site = run(py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path)
    zipfile.ZipFile(wheel).extractall(site.stdout.strip())
    mypy = Path(sys.executable).parent / "mypy"
    checked = run(
        mypy,
        "--strict",
        "--python-executable",
        py,
        "--cache-dir",
        tmp_path / "mypy-cache",
        my_app.name,
        cwd=my_app.parent,
    )
    assert checked.returncode == 0, checked.stdout


def test_every_name_outbox_exports_is_on_the_page() -> None:
    """``__all__`` is the API (ruff's RUF022 keeps it sorted); the page names all of it."""
    page = PAGE.read_text()
    missing = [name for name in outbox.__all__ if f"`{name}`" not in page]
    assert missing == []
