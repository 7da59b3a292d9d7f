"""A disk that fails (EIO, ENOSPC) at any operation of a write loses nothing acknowledged.

Every file and SQLite operation of the store goes through the ``FileSystem`` seam. For
each write and N = 1, 2, ... until the write succeeds, the Nth operation fails, once
(ENOSPC) or from then on (EIO): the call must answer STORAGE_ERROR, and the data dir,
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

import pytest

from host._errors import to_error_object
from tests.host.inproc import FaultyFileSystem, open_host
from tests.host.scenario import OPS, PRE, prepare, state


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    data = str(tmp_path_factory.mktemp("base") / "data")
    asyncio.run(prepare(data))
    return data


@pytest.mark.parametrize("always", [False, True], ids=["once-ENOSPC", "always-EIO"])
@pytest.mark.parametrize("name", sorted(OPS))
async def test_fault_at_every_operation(name: str, always: bool, base: str, tmp_path: Path):
    op, pre = OPS[name], PRE.get(name)
    err = errno.EIO if always else errno.ENOSPC

    def fresh(tag: str) -> str:
        d = str(tmp_path / tag)
        shutil.copytree(base, d)
        return d

    old_dir = fresh("old")
    if pre is not None:
        async with open_host(old_dir) as call:
            await pre(call)
    old = await state(old_dir)
    new_dir = fresh("new")
    async with open_host(new_dir) as call:
        if pre is not None:
            await pre(call)
        await op(call)
    new = await state(new_dir)

    faults = 0
    for n in range(1, 300):
        d = fresh(f"fault{n}")
        fs = FaultyFileSystem(n, err, always=always)
        async with open_host(d, fs) as call:
            if pre is not None:
                await pre(call)
            fs.armed = True
            try:
                await op(call)
                failed = False
            except Exception as exc:  # what the endpoint would answer
                assert to_error_object(exc)["data"]["code"] == "STORAGE_ERROR", exc
                failed = True
            fs.armed = False
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
