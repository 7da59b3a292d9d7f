"""``python -m outbox drive`` end to end: killed with SIGKILL at random moments, recovered.

Every row reported ``durable`` is stored exactly once; every checkpointed reply keeps at
least the text of its last checkpoint; unless a later ``cut`` removed it (reported, or made
on disk by a regenerate the kill kept from being reported: :func:`unreported_cuts`).
``python -m host verify`` finds nothing wrong.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from scripts.chaos import unreported_cut
from tests.conftest import HostProcess, StartHost, get_messages, run_cli
from tests.outbox.kit import WAIT, host_lock_free, kill_group, python, reap, text, until

WORKLOAD = ("--sessions", "2", "--turns", "3", "--reply-seconds", "0.5")


async def drive(data: Path, *args: str) -> asyncio.subprocess.Process:
    return await python(
        "-m", "outbox", "drive", "--json", "--data-dir", str(data), *args, start_new_session=True
    )


def parse(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


async def drive_and_kill(data: Path, seed: int, rng: random.Random) -> list[dict[str, Any]]:
    """Run the workload and SIGKILL it (and its host) after a random number of facts."""
    proc = await drive(data, *WORKLOAD, "--seed", str(seed))
    assert proc.stdout is not None
    kill_at = rng.randrange(2, 22)  # a run of this workload reports 25 to 35 facts
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT):
        while True:
            line = await proc.stdout.readline()
            if not line:  # the run ended before its kill point
                err = await reap(proc)
                assert proc.returncode == 0, err
                return events
            events.append(json.loads(line))
            durable = any(e["event"] == "durable" for e in events)
            if durable and len(events) >= kill_at:
                break
    return events + parse(await kill_group(proc, data / "host"))


# Found at 86ff206 (issue 37): a kill while a regenerate's truncateFrom was in flight, once
# the host had recorded the cut (its next start finishes it) or made it, but before drive
# wrote its "cut" notice, left the cut rows reported durable and unreported cut: "rows
# reported durable are not stored: s1-r2-t0-c0, s1-r2-t0-c1, s1-r2-t0-a". The cut is on
# disk as chaos.py knows it (``unreported_cut``); later runs bury that evidence, so it is
# read after every kill.
async def unreported_cuts(
    start_host: StartHost, data: Path, events: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A ``cut`` event for each cut a kill made but kept drive from reporting."""
    cut = {mid for e in events if e["event"] == "cut" for mid in e["messageIds"]}
    host: HostProcess = await start_host(data / "host")
    assert host.client is not None
    await host.client.handshake()
    found = []
    for s in (await host.client.call("session.list"))["sessions"]:
        sid = s["sessionId"]
        rows = await get_messages(host.client, sid)
        stored = {m["id"] for m in rows}
        missing = {
            e["messageId"]
            for e in events
            if e["event"] == "durable" and e["sessionId"] == sid and e["messageId"] not in cut
        } - stored
        if not missing or not rows or rows[-1]["role"] != "user":
            continue  # nothing missing, or no cut can explain it: check_store judges
        root = rows[-1]["id"]
        revs = {
            root: await host.client.call(
                "session.listRevisions", sessionId=sid, rootId=root, includeMessages=True
            )
        }
        if unreported_cut(rows, revs, missing):
            found.append({"event": "cut", "sessionId": sid, "messageIds": sorted(missing)})
    assert await host.stop() == 0, host.log
    return found


async def check_store(start_host: StartHost, data: Path, events: list[dict[str, Any]]) -> None:
    """Every reported fact holds in the data dir, as a fresh host serves it."""
    host: HostProcess = await start_host(data / "host")
    assert host.client is not None
    await host.client.handshake()
    sessions = (await host.client.call("session.list"))["sessions"]
    stored = {s["sessionId"]: await get_messages(host.client, s["sessionId"]) for s in sessions}
    assert await host.stop() == 0, host.log

    cut = {mid for e in events if e["event"] == "cut" for mid in e["messageIds"]}
    counts = defaultdict(Counter, {sid: Counter(m["id"] for m in ms) for sid, ms in stored.items()})
    for sid, count in counts.items():
        dups = [mid for mid, n in count.items() if n > 1]
        assert not dups, f"{sid}: stored more than once: {dups}"
    lost = [
        (e["sessionId"], e["messageId"])
        for e in events
        if e["event"] == "durable"
        and e["messageId"] not in cut
        and counts[e["sessionId"]][e["messageId"]] != 1
    ]
    assert not lost, f"rows reported durable are not stored: {lost}"

    last_checkpoint = {
        (e["sessionId"], e["messageId"]): e["chars"] for e in events if e["event"] == "checkpoint"
    }
    by_id = {(sid, m["id"]): m for sid, msgs in stored.items() for m in msgs}
    for (sid, mid), chars in last_checkpoint.items():
        if mid in cut:
            continue
        row = by_id.get((sid, mid))
        assert row is not None, f"{sid}/{mid} was checkpointed ({chars} chars) and is gone"
        assert len(text(row)) >= chars, f"{sid}/{mid}: {len(text(row))} chars, checkpoint {chars}"

    for e in events:
        if e["event"] == "recovered" and e["messageId"] not in cut:
            assert counts[e["sessionId"]][e["messageId"]] == 1, f"recovered and gone: {e}"

    code, out, err = await run_cli("verify", "--data-dir", str(data / "host"))
    assert code == 0, out + err


@pytest.mark.slow
@pytest.mark.parametrize("seed", [20260906, 327])
async def test_drive_killed_at_random_moments_then_recovered_loses_nothing(
    tmp_path: Path, start_host: StartHost, seed: int
) -> None:
    data = tmp_path / "data"
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    for run in range(3):
        events += await drive_and_kill(data, seed=run + 1, rng=rng)
        events += await unreported_cuts(start_host, data, events)

    proc = await drive(data, "--recover-only")
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()
    recovery = parse(out.decode())
    assert recovery[-1]["event"] == "done"
    events += recovery

    assert any(e["event"] == "durable" for e in events)
    await check_store(start_host, data, events)


async def test_a_full_run_ends_with_done_and_its_rows_stored(
    tmp_path: Path, start_host: StartHost
) -> None:
    data = tmp_path / "data"
    proc = await drive(data, *WORKLOAD, "--seed", "7")
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()
    events = parse(out.decode())
    done = events[-1]
    assert done["event"] == "done"
    assert done["sessions"] == 2 and done["turns"] == 6 and done["outboxPending"] == 0
    assert sum(done["outcomes"].values()) == 6
    assert {e["sessionId"] for e in events if e["event"] == "durable"} == {"s0", "s1"}
    assert sum(1 for e in events if e["event"] == "checkpoint") == done["checkpoints"]
    await check_store(start_host, data, events)


async def test_without_json_a_person_gets_a_summary_table(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ("--sessions", "1", "--turns", "1", "--reply-seconds", "0.2", "--seed", "3")
    proc = await python("-m", "outbox", "drive", "--data-dir", str(data), *args)
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()
    assert "summary" in out.decode() and "s0" in out.decode()
    assert "outbox depth" in err.decode(), "the live view goes to stderr"


async def streaming(data: Path) -> tuple[asyncio.subprocess.Process, list[dict[str, Any]]]:
    """A long workload, once its replies are streaming (a checkpoint was saved)."""
    proc = await drive(data, "--sessions", "3", "--turns", "30", "--reply-seconds", "3")
    assert proc.stdout is not None
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT):
        while not any(e["event"] == "checkpoint" for e in events):
            events.append(json.loads(await proc.stdout.readline()))
    return proc, events


# Found at 0a904eb: a quit stopped only the replies streaming at that moment; every session
# then began its next turn and was cancelled in it, leaving turns running for the next start.
async def test_a_quit_ends_every_turn_and_begins_no_new_one(
    tmp_path: Path, start_host: StartHost
) -> None:
    data = tmp_path / "data"
    proc, events = await streaming(data)
    async with asyncio.timeout(WAIT):
        proc.send_signal(signal.SIGINT)
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    events += parse(out.decode())
    done = events[-1]
    assert done["event"] == "done"
    assert sum(done["outcomes"].values()) == done["turns"], done
    host = await start_host(data / "host")
    assert host.client is not None
    await host.client.handshake()
    assert "was running at start" not in host.log, host.log
    await host.stop()
    await check_store(start_host, data, events)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_to_the_whole_group_quits_within_the_bound(
    tmp_path: Path, start_host: StartHost, sig: signal.Signals
) -> None:
    """Ctrl-C in a terminal signals the whole process group, the host's too (ADR 0153 §3).

    The producer still quits within its 2 s (plus a margin for the interpreter's exit):
    turns flushed and aborted, rows that could not land kept in the outbox for the next
    start, nothing acknowledged lost.
    """
    data = tmp_path / "data"
    proc, events = await streaming(data)
    async with asyncio.timeout(WAIT):
        loop = asyncio.get_running_loop()
        signalled = loop.time()
        os.killpg(proc.pid, sig)
        out, err = await proc.communicate()
        took = loop.time() - signalled
    assert proc.returncode == 0, err.decode()
    print(f"{sig.name} to the group: drive exited {took:.2f} s later")
    assert took < 2.0 + 1.0, f"quit took {took:.2f} s"
    events += parse(out.decode())
    assert events[-1]["event"] == "done"
    await until(lambda: host_lock_free(data / "host"), "the host to exit after its producer")
    # The next start drains what the quit left in the outbox; nothing acknowledged is lost.
    again = await drive(data, "--recover-only")
    more, err = await again.communicate()
    assert again.returncode == 0, err.decode()
    await check_store(start_host, data, events + parse(more.decode()))
