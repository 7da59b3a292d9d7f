"""``python -m outbox drive``: a workload of conversations against a host it starts.

Streamed replies with tool calls, regenerates, Stops and runtime crashes, chosen by the
seed. ``DIR/host`` is the host's data dir, ``DIR/app/outbox.jsonl`` the outbox journal.
The connect sequence is handshake, drain the outbox, ``recoverInflightMessages``; only
then is anything read. Run again on the same DIR, it picks up where the last run ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from outbox._agent import SimAgent, plan_turn
from outbox._client import ClientError, HostClient
from outbox._driver import TurnDriver, text_of
from outbox._outbox import DrainTimeout, Outbox


@dataclass
class Options:
    data_dir: str
    sessions: int = 3
    turns: int = 4
    seed: int = 1
    reply_seconds: float = 2.0
    json: bool = False
    recover_only: bool = False


@dataclass
class Run:
    """What a run did, for the live view and the summary."""

    started: float = field(default_factory=time.monotonic)
    outcomes: dict[str, int] = field(default_factory=dict)
    recovered: int = 0
    streaming: dict[str, SimAgent] = field(default_factory=dict)
    turns_done: dict[str, int] = field(default_factory=dict)


def _next_run_number(app_dir: str) -> int:
    path = os.path.join(app_dir, "runs")
    n = 0
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        n = int(f.read().strip() or 0)
    n += 1
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(n))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return n


async def connect(opts: Options, box: Outbox, emit: Any) -> tuple[HostClient, list[Any]]:
    """Spawn the host and run the connect sequence; return the client and recoveries."""
    host_dir = os.path.join(opts.data_dir, "host")
    client = await HostClient.spawn(host_dir, log_path=os.path.join(opts.data_dir, "host.log"))
    await client.handshake()
    box.attach(client)
    await box.drain(60.0)  # rows a killed run left in the journal land first
    rec = await client.call("session.recoverInflightMessages")
    for row in rec["recovered"]:
        emit({"event": "recovered", **row})
    return client, rec["recovered"]


async def drive(opts: Options, out: TextIO = sys.stdout) -> int:
    """Run the workload; return the exit code."""
    app_dir = os.path.join(opts.data_dir, "app")
    os.makedirs(app_dir, mode=0o700, exist_ok=True)
    run = Run()

    def emit(ev: Mapping[str, Any]) -> None:
        if opts.json:
            out.write(json.dumps(ev) + "\n")
            out.flush()

    async with Outbox.open(os.path.join(app_dir, "outbox.jsonl")) as box:
        box.on_ack = None
        client, recovered = await connect(opts, box, emit)
        run.recovered = len(recovered)
        driver = TurnDriver(client, box, emit=emit)
        if opts.recover_only:
            await client.close()
            emit({"event": "done", "recovered": run.recovered})
            if not opts.json:
                print(f"connect sequence done: {run.recovered} checkpoint(s) recovered", file=out)
            return 0
        number = _next_run_number(app_dir)
        rng = random.Random(f"{opts.seed}:{number}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        view = None if opts.json else asyncio.create_task(_live_view(run, box, driver))
        work: asyncio.Future[list[None]] = asyncio.gather(
            *[
                _session(driver, run, f"s{i}", number, opts, random.Random(rng.random()), stop)
                for i in range(opts.sessions)
            ]
        )
        stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        await asyncio.wait([work, stopper], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():  # quit: flush, abort active turns, wait at most 2 s for their rows

            def stop_agents() -> None:
                for agent in run.streaming.values():
                    agent.stop()

            await driver.quit(stop_agents)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(work, 5.0)
        stopper.cancel()
        if view is not None:
            view.cancel()
        with contextlib.suppress(DrainTimeout):
            await box.drain(30.0)
        summary = {
            "event": "done",
            "run": number,
            "sessions": opts.sessions,
            "turns": sum(run.turns_done.values()),
            "outcomes": run.outcomes,
            "rows": driver.stats["rows"],
            "checkpoints": driver.stats["checkpoints"],
            "recovered": run.recovered,
            "skippedArchives": driver.stats["skipped_archives"],
            "outboxPending": box.depth,
            "outboxFsyncs": box.journal.fsyncs,
            "seconds": round(time.monotonic() - run.started, 2),
        }
        emit(summary)
        if not opts.json:
            await _print_summary(client, opts, summary, out)
        await client.close()
    return 0


async def _session(
    driver: TurnDriver,
    run: Run,
    sid: str,
    number: int,
    opts: Options,
    rng: random.Random,
    stop: asyncio.Event,
) -> None:
    await driver.client.call("session.create", {"sessionId": sid, "title": f"conversation {sid}"})
    for k in range(opts.turns):
        if stop.is_set():  # quit: the turn that streamed ends, no new one starts
            return
        tid = f"{sid}-r{number}-t{k}"
        action = rng.choices(["new", "regenerate", "stop"], weights=(70, 20, 10))[0]
        regenerate = False
        prompt: dict[str, Any] | None = {
            "id": f"{tid}-u",
            "role": "user",
            "content": f"question {k} of run {number}",
        }
        agent = SimAgent(tid, plan_turn(rng, opts.reply_seconds, 40.0), rng)
        try:
            if action == "regenerate" and await driver.truncate_last_reply(sid) is not None:
                prompt, regenerate = None, True
            st = await driver.begin(sid, tid, prompt)
        except (ClientError, DrainTimeout) as exc:
            run.outcomes["not started"] = run.outcomes.get("not started", 0) + 1
            print(f"{sid}: turn {tid} not started: {exc}", file=sys.stderr)
            continue
        run.streaming[sid] = agent
        if action == "stop":
            asyncio.get_running_loop().call_later(opts.reply_seconds * 0.4, agent.stop)
        outcome = await driver.run(st, agent.events(), regenerate=regenerate)
        run.streaming.pop(sid, None)
        key = ("regenerate " if regenerate else "") + outcome
        run.outcomes[key] = run.outcomes.get(key, 0) + 1
        run.turns_done[sid] = run.turns_done.get(sid, 0) + 1


async def _live_view(run: Run, box: Outbox, driver: TurnDriver) -> None:
    tty = sys.stderr.isatty()
    while True:
        streaming = " ".join(
            f"{sid}:{int(a.progress * 100):3d}%" for sid, a in sorted(run.streaming.items())
        )
        line = (
            f"[{time.monotonic() - run.started:6.1f}s] turns {sum(run.turns_done.values()):3d}"
            f" | streaming {streaming or '-':<30} | outbox depth {box.depth:4d}"
            f" | checkpoints {driver.stats['checkpoints']:4d} | recovered {run.recovered}"
        )
        sys.stderr.write(("\r" + line) if tty else line + "\n")
        sys.stderr.flush()
        await asyncio.sleep(0.2 if tty else 1.0)


async def _print_summary(
    client: HostClient, opts: Options, summary: dict[str, Any], out: TextIO
) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print("\nsummary", file=out)
    for key in ("run", "sessions", "turns", "rows", "checkpoints", "recovered", "seconds"):
        print(f"  {key:<16} {summary[key]}", file=out)
    for key, n in sorted(summary["outcomes"].items()):
        print(f"  turns {key:<10} {n}", file=out)
    print(f"\n  {'session':<8} {'messages':>8}  last message", file=out)
    for i in range(opts.sessions):
        page = await client.call("session.get", {"sessionId": f"s{i}", "limit": 1})
        last = page["messages"][-1] if page["messages"] else {}
        preview = text_of(last)[:50].replace("\n", " ")
        status = last.get("status", "complete")
        print(
            f"  s{i:<7} {page['totalLines']:>8}  [{last.get('role')}/{status}] {preview}", file=out
        )
