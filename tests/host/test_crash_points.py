"""A crash after any file operation of a write leaves the old state or the new one.

Each write runs against a file system that kills the "process" at its Nth operation, for
N = 1, 2, ... until the write completes; the data dir is then started again and compared
with the states before and after. Files are left exactly as a kill -9 would leave them
(every write is a direct system call), and start-up recovery must finish or forget the
change, never expose a third state.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest

from tests.host.inproc import Crash, CrashingFileSystem, open_host
from tests.host.scenario import OPS, PRE, prepare, state


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    data = str(tmp_path_factory.mktemp("base") / "data")
    asyncio.run(prepare(data))
    return data


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn"])
@pytest.mark.parametrize("name", sorted(OPS))
async def test_crash_at_every_step_gives_old_or_new_state(
    name: str, torn: bool, base: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    op, pre = OPS[name], PRE.get(name)

    def fresh(tag: str) -> str:
        d = str(tmp_path / tag)
        shutil.copytree(base, d)
        return d

    async def run(data: str, fs: CrashingFileSystem | None) -> bool:
        async with open_host(data, fs) as call:
            if pre is not None:
                await pre(call)
            if fs is not None:
                fs.armed = True
            try:
                await op(call)
            except Crash:
                return False
        return True

    old_dir, new_dir = fresh("old"), fresh("new")
    if pre is not None:
        async with open_host(old_dir) as call:
            await pre(call)
    old = await state(old_dir)
    assert await run(new_dir, None)
    new = await state(new_dir)
    if name == "promote":
        # Start-up promotes the leftover too: either way the reply is there exactly once.
        assert old == new
        assert [m["id"] for m in new[0]].count("b3") == 1
    else:
        assert old != new, "the operation must change something"
    crashes = 0
    for n in range(1, 200):
        d = fresh(f"crash{n}")
        if await run(d, CrashingFileSystem(n, torn=torn)):
            break
        crashes += 1
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="host"):
            got = await state(d)
        assert got in (old, new), f"{name}: crash at file operation {n} left a third state"
        # A kill's leftovers are a crash's normal state: the start that finishes them
        # says so, but an ERROR tells an operator that data was lost, which it was not.
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, f"{name}: start after a crash at operation {n} logged {errors}"
    else:
        raise AssertionError("the operation never completed")
    assert crashes >= 1
    print(f"crash states: {name}: {crashes}")
