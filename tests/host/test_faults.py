"""A disk that fails (EIO, ENOSPC) at any operation of a write loses nothing acknowledged.

Every file and SQLite operation of the store goes through the ``FileSystem`` seam. For
each write and N = 1, 2, ... until the write succeeds, the Nth operation fails: once
with ENOSPC (the Nth allocation: a disk that fills and is freed again at once; a full
disk fails only what needs new space, see ``FaultyFileSystem``), or with EIO from then
on: the call must answer STORAGE_ERROR, and the data dir,
started again on a healthy disk, must show the old state (a failed call changes nothing),
or, when the disk kept failing so that even the undo failed, the old or the new state,
never a third; verify agrees and no temp or intent file is left. A call whose change was
complete before the fault (only tidying up failed) answers success, and its change holds.
"""

from __future__ import annotations

import asyncio
import errno
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RpcError
from tests.host.inproc import Client, FaultyFileSystem, full_disk, open_host
from tests.host.scenario import OPS, PRE, Op, prepare, state


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    data = str(tmp_path_factory.mktemp("base") / "data")
    asyncio.run(prepare(data))
    return data


def _fresh(base: str, tmp_path: Path, tag: str) -> str:
    d = str(tmp_path / tag)
    shutil.copytree(base, d)
    return d


async def _old_and_new(name: str, base: str, tmp_path: Path) -> tuple[Any, Any]:
    """The scenario's state before and after the write ``name``, on a healthy disk."""
    op, pre = OPS[name], PRE.get(name)
    old_dir = _fresh(base, tmp_path, "old")
    if pre is not None:
        async with open_host(old_dir) as call:
            await pre(call)
    new_dir = _fresh(base, tmp_path, "new")
    async with open_host(new_dir) as call:
        if pre is not None:
            await pre(call)
        await op(call)
    return await state(old_dir), await state(new_dir)


async def _failed(name: str, data: str, fs: FaultyFileSystem, then: Op | None = None) -> bool:
    """Run the write ``name`` on ``fs`` (and ``then`` on a healthy disk, in the same host
    run); return whether the write answered an error (which must be STORAGE_ERROR)."""
    op, pre = OPS[name], PRE.get(name)
    async with open_host(data, fs) as call:
        if pre is not None:
            await pre(call)
        fs.armed = True
        try:
            await op(call)
            failed = False
        except RpcError as exc:
            assert exc.name == "STORAGE_ERROR", exc
            failed = True
        fs.armed = False
        if then is not None:
            await then(call)
    return failed


@pytest.mark.parametrize("always", [False, True], ids=["once-ENOSPC", "always-EIO"])
@pytest.mark.parametrize("name", sorted(OPS))
async def test_fault_at_every_operation(name: str, always: bool, base: str, tmp_path: Path):
    err = errno.EIO if always else errno.ENOSPC
    old, new = await _old_and_new(name, base, tmp_path)
    faults = 0
    for n in range(1, 300):
        d = _fresh(base, tmp_path, f"fault{n}")
        fs = FaultyFileSystem(n, err, always=always)
        failed = await _failed(name, d, fs)
        got = await state(d)
        if not failed:
            # Either no operation failed (N is past the write's last one: done), or only
            # tidying up after the change was made failed: the call rightly succeeded.
            assert got == new, f"{name}: a call that succeeded at fault {n} lost its change"
            if fs.failed == 0:
                break
            continue
        faults += 1
        if always:
            assert got in (old, new), f"{name}: fault at operation {n} left a third state"
        else:
            assert got == old, f"{name}: a call that failed at operation {n} changed something"
    else:
        raise AssertionError("the operation never succeeded")
    assert faults >= 1
    print(f"faults injected: {name} {'always' if always else 'once'}: {faults}")


TRUNCATIONS = ("truncate-regenerate", "truncate-plain", "regenerate-streaming", "regenerate-grows")


@pytest.mark.parametrize("name", TRUNCATIONS)
async def test_a_truncation_on_a_full_disk_changes_nothing(name: str, base: str, tmp_path: Path):
    """Found at 650cc00 (issue 26, case 9): with the disk full, ``truncateFrom`` answered
    STORAGE_ERROR, yet the lines it was to cut were gone: its undo (writing the cut bytes
    back) needed the space the disk did not have. A disk that fills at any allocation and
    stays full must leave the call done (answered) or not done at all (STORAGE_ERROR)."""
    old, new = await _old_and_new(name, base, tmp_path)
    for n in range(1, 300):
        d = _fresh(base, tmp_path, f"full{n}")
        fs = full_disk(n)
        failed = await _failed(name, d, fs)
        got = await state(d)  # started again with space
        assert got == (old if failed else new), f"{name}: disk full at allocation {n}"
        if fs.failed == 0:
            break
    else:
        raise AssertionError("the operation never succeeded")


@pytest.mark.parametrize("name", ["truncate-regenerate", "regenerate-grows"])
async def test_a_truncation_the_disk_fails_past_its_plan_is_finished_before_it_is_served(
    name: str, base: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Past its intent a regenerate no longer undoes (that needs space): an I/O error there
    leaves the change to be finished. The live host must then serve what a restart shows,
    never the half-made cut it left (a reconcile of that would quarantine the root line)."""
    live: list[Any] = []

    async def read(call: Client) -> None:
        await call("session.recoverInflightMessages")  # as state() does after its start
        live[:] = (await call("session.get", sessionId="s"))["messages"]

    for n in range(1, 300):
        d = _fresh(base, tmp_path, f"eio{n}")
        fs = FaultyFileSystem(n, errno.EIO)
        await _failed(name, d, fs, then=read)
        assert live == (await state(d))[0], f"{name}: EIO at operation {n}"
        if fs.failed == 0:
            break
    else:
        raise AssertionError("the operation never succeeded")
    assert "a recorded change is made" in caplog.text
