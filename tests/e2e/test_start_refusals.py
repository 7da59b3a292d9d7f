"""A start on a disk the host cannot write: full, failing or read-only (issue 26, 10 and 12).

The host exits with a documented status and one line on stderr (no traceback), and
changes nothing but what recovery rolls forward (a turn left running is logged ended
before the index takes it): a full disk or an I/O error is not damage, so the index (and its turn
table, which nothing else holds) is never set aside for it. Once the disk is writable
again the next start serves everything as it was. A real file system each time: a small
tmpfs filled with ballast, or remounted read-only (both need root; skipped elsewhere). A
folder of the host's own user without write permission is no refusal: the host owns its
modes (folders 0700) and sets them back; one of another user gives EACCES or EPERM, which
exit 5 the same way.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import HostProcess, StartHost, disk_state, get_messages, msg

FULL = 4  # exit status: the disk is full or failing (docs/protocol.md, Command line)
NOT_WRITABLE = 5  # exit status: the data dir is read-only or not ours to write


async def _build(start_host: StartHost, data: Path, *, kill: bool) -> None:
    """Session ``s``: a completed turn and a running one (so the turn table matters)."""
    host = await start_host(data)
    c = host.client
    assert c is not None
    await c.handshake()
    await c.call("session.create", sessionId="s", title="kept")
    await c.call("session.beginTurn", sessionId="s", turnId="t1", prompt=msg("u1"))
    await c.call(
        "session.appendMessage", sessionId="s", turnId="t1", message=msg("a1", "assistant")
    )
    await c.call("session.endTurn", sessionId="s", turnId="t1", status="completed")
    await c.call("session.beginTurn", sessionId="s", turnId="t2", prompt=msg("u2"))
    if kill:  # the index's WAL and shared memory stay behind
        await host.kill()
    else:
        assert await host.stop() == 0


def _files(data: Path) -> dict[str, bytes]:
    """The transcripts and their sidecars (SQLite may checkpoint its own files meanwhile).

    A turn log is taken up to its last line but recovery's own: a start that ends a turn
    left running logs it first (the log is the commit, made again by every start until
    the index takes it), and a full disk may refuse the start only after that.
    """
    out = disk_state(data)
    for name, body in out.items():
        if name.endswith(".turns.log"):
            lines = body.splitlines(keepends=True)
            while lines and b'"aborted"' in lines[-1]:
                lines.pop()
            out[name] = b"".join(lines)
    return out


def _fill(disk: Path) -> Path:
    """Write ballast until the disk is full; return it (removing it makes room again)."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return ballast


def _remount(disk: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(disk)], check=True)


async def _refused(start_host: StartHost, data: Path, code: int) -> HostProcess:
    host = await start_host(data)
    assert await host.log_or_exit("recovered") is None, f"the host started:\n{host.log}"
    assert await host.wait() == code, host.log
    lines = host.log.splitlines()
    assert len(lines) == 1 and " ERROR " in lines[0] and str(data) in lines[0], host.log
    assert host.client is not None and host.client.lines == 0
    return host


async def _served_as_before(start_host: StartHost, data: Path) -> None:
    host = await start_host(data)
    c = host.client
    assert c is not None
    await c.handshake()
    assert [m["id"] for m in await get_messages(c, "s")] == ["u1", "a1", "u2"]
    assert (await c.call("session.list"))["sessions"][0]["title"] == "kept"
    # The turn table survived: t1 is still known as completed (a rebuilt index has no turns).
    ended = await c.call("session.endTurn", sessionId="s", turnId="t1", status="error")
    assert ended == {"status": "completed", "recovered": False}
    assert await host.stop() == 0
    assert not list(data.glob("index.sqlite3.damaged-*"))


@pytest.mark.parametrize("kill", [False, True], ids=["stopped", "killed"])
async def test_a_full_disk_at_start_is_no_damage(
    start_host: StartHost, small_disk: Path, kill: bool
) -> None:
    """Found at 650cc00 (issue 26, case 10): SQLite's "disk I/O error" (its shared memory
    could not grow) and "database or disk is full" at start were taken for a damaged
    index: it was moved aside, the host exited 1 with a traceback, and the next start,
    with space back, rebuilt an index with no turn table."""
    data = small_disk / "data"
    await _build(start_host, data, kill=kill)
    ballast = _fill(small_disk)
    before = _files(data)
    await _refused(start_host, data, FULL)
    assert _files(data) == before
    await _refused(start_host, data, FULL)  # as often as it is tried
    os.unlink(ballast)
    await _served_as_before(start_host, data)


async def test_a_read_only_data_dir_is_refused_in_a_line(
    start_host: StartHost, small_disk: Path
) -> None:
    """Found at 650cc00 (issue 26, case 12): a read-only data dir (a remount after disk
    errors, a backup mounted read-only) crashed the start with a traceback."""
    data = small_disk / "data"
    await _build(start_host, data, kill=False)
    before = _files(data)
    _remount(small_disk, "ro")
    try:
        host = await _refused(start_host, data, NOT_WRITABLE)
        assert "read-only" in host.log.lower(), host.log
    finally:
        _remount(small_disk, "rw")
    assert _files(data) == before
    await _served_as_before(start_host, data)


OTHER = 6  # exit status: any other error of the operating system at start


def _sessions_a_file(data: Path) -> Path:
    (data / "sessions").rmdir()  # empty: built by a host that stopped
    (data / "sessions").write_bytes(b"a user's file where the sessions folder was\n")
    return data


def _data_dir_a_file(data: Path) -> Path:
    (data.parent / "file").write_bytes(b"not a folder\n")
    return data.parent / "file"


def _name_too_long(data: Path) -> Path:
    return data / ("x" * 300)


SETUPS: dict[str, Callable[[Path], Path]] = {
    "ENOTDIR": _sessions_a_file,
    "EEXIST": _data_dir_a_file,
    "ENAMETOOLONG": _name_too_long,
}


@pytest.mark.parametrize("errno_name", sorted(SETUPS))
async def test_any_other_os_error_at_start_is_one_line_and_a_documented_status(
    start_host: StartHost, data_dir: Path, errno_name: str
) -> None:
    """Issue 36, case 3: an ``OSError`` the start did not classify (seen: a file system
    whose ``ftruncate`` of ``host.lock`` gave ``ENOENT``) left a traceback and exit 1."""
    host = await start_host()
    assert host.client is not None
    await host.client.handshake()
    assert await host.stop() == 0
    data = SETUPS[errno_name](data_dir)
    before = _tree(data_dir.parent)
    host = await start_host(data)
    assert await host.wait() == OTHER, host.log
    lines = host.log.splitlines()
    assert len(lines) == 1 and " ERROR " in lines[0] and errno_name in lines[0], host.log
    assert f"cannot start on {data}" in lines[0], host.log
    assert _tree(data_dir.parent) == before


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder``, a file's bytes or ``None``: but the hosts' logs, the pid
    in ``host.lock`` and SQLite's own files (its WAL may be checkpointed at an open)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in folder.rglob("*")
        if not p.name.endswith(".stderr.log") and not p.name.startswith(("index.", "host.lock"))
    }
