"""``python -m outbox drive``: a workload of conversations against a host it starts.

Streamed replies with tool calls, regenerates, Stops and runtime crashes: chosen by the
seed for the simulated agent (``--agent sim``), a fixed round for pi (``--agent pi``,
:data:`PI_ROUND`: a reply, a tool call, a Stop, a regenerate, a SIGKILL of pi mid-reply).
``DIR/host`` is the host's data dir, ``DIR/app/outbox.jsonl`` the outbox journal; pi's
session files are ``DIR/app/pi/<session>.jsonl``, its tools run in ``DIR/app/pi-work`` and
its stderr goes to ``DIR/pi.log``. The connect sequence is handshake, drain the outbox,
``recoverInflightMessages``; only then is anything read. Run again on the same DIR, it
picks up where the last run ended.

It exits 0 when every turn ended as its runtime said; 1 when a row was refused (the host
could never store it: its turn ended ``error``, the other sessions went on), when a session
failed, or when the journal is not a regular file (a symlink or FIFO: refused, one line);
2 when pi would not start or answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from outbox._agent import SimAgent, plan_turn
from outbox._client import ClientError, HostClient
from outbox._driver import TurnDriver, text_of
from outbox._events import AgentEvent
from outbox._files import NotRegularFile, read_regular, replace
from outbox._outbox import DrainTimeout, Outbox
from outbox._pi import PiAgent, PiError
from outbox._rows import RowRefused

log = logging.getLogger("outbox.drive")


@dataclass
class Options:
    data_dir: str
    sessions: int = 3
    turns: int = 4
    seed: int = 1
    reply_seconds: float = 2.0
    json: bool = False
    recover_only: bool = False
    agent: str = "sim"  # or "pi"
    pi_command: str = "pi --mode rpc"
    watch_socket: str | None = None  # default DIR/host.sock; "none": no socket


class Streaming(Protocol):
    """An agent runtime with a turn streaming: what quit and the live view need."""

    def stop(self) -> None: ...
    def view(self) -> str: ...


@dataclass
class Run:
    """What a run did, for the live view and the summary."""

    started: float = field(default_factory=time.monotonic)
    outcomes: dict[str, int] = field(default_factory=dict)
    recovered: int = 0
    streaming: dict[str, Streaming] = field(default_factory=dict)
    turns_done: dict[str, int] = field(default_factory=dict)
    pis: dict[str, PiAgent] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)
    refused: list[str] = field(default_factory=list)  # the turns a refused row ended

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def not_started(self, sid: str, tid: str, exc: Exception) -> None:
        self.count("not started")
        print(f"{sid}: turn {tid} not started: {exc}", file=sys.stderr)

    def row_refused(self, sid: str, tid: str, exc: RowRefused) -> None:
        """A row of turn ``tid`` was refused: the driver ended the turn ``error``."""
        self.ended(sid, "error")
        self.refused.append(tid)
        print(f"{sid}: turn {tid} ended as an error: {exc}", file=sys.stderr)

    def ended(self, sid: str, outcome: str) -> None:
        """A turn of ``sid`` ended as ``outcome``."""
        self.streaming.pop(sid, None)
        self.count(outcome)
        self.turns_done[sid] = self.turns_done.get(sid, 0) + 1


# pi's round of turns (``--agent pi``): (what the turn does, the prompt). The tags in
# brackets drive tests/live/mock_llm.py; a real model reads them as part of the prompt.
PI_ROUND: list[tuple[str, str]] = [
    ("new", "[text] Say something short about durable stores."),
    ("new", "[tool] Run `echo hi` with the bash tool, then say what it printed."),
    ("stop", "[slow] Write a long answer about crash safety."),
    ("new", "[text] Say one thing about checkpoints."),
    ("regenerate", ""),
    ("kill", "[slow] Write a long answer about power cuts."),
    ("new", "[text] Sum up what we said so far, in one sentence."),
]
STOP_AFTER = 8  # snapshots streamed before the Stop
KILL_AFTER = 20  # snapshots streamed before pi is killed


def _next_run_number(app_dir: str) -> int:
    path = os.path.join(app_dir, "runs")
    n = 0
    with contextlib.suppress(OSError, ValueError):  # never a link's or a FIFO's
        n = int(read_regular(path).strip() or 0)
    n += 1
    replace(path, b"%d" % n)  # a new file renamed over whatever is there
    return n


def watch_socket(opts: Options) -> str | None:
    """Where the host serves watchers beside the drive (issue 34), or ``None``."""
    if opts.watch_socket == "none":
        return None
    return opts.watch_socket or os.path.join(opts.data_dir, "host.sock")


async def connect(opts: Options, box: Outbox, emit: Any) -> tuple[HostClient, list[Any]]:
    """Spawn the host and run the connect sequence; return the client and recoveries."""
    host_dir = os.path.join(opts.data_dir, "host")
    sock = watch_socket(opts)
    client = await HostClient.spawn(
        host_dir,
        log_path=os.path.join(opts.data_dir, "host.log"),
        args=("--also-socket", sock) if sock else (),
    )
    recovered = await box.connect(client, timeout=60.0)  # a killed run's rows land first
    for row in recovered:
        emit({"event": "recovered", **row})
    return client, recovered


async def drive(opts: Options, out: TextIO = sys.stdout) -> int:
    """Run the workload; return the exit code."""
    app_dir = os.path.join(opts.data_dir, "app")
    os.makedirs(app_dir, mode=0o700, exist_ok=True)
    run = Run()

    def emit(ev: Mapping[str, Any]) -> None:
        if opts.json:
            out.write(json.dumps(ev) + "\n")
            out.flush()

    async with contextlib.AsyncExitStack() as opened:
        try:
            box = await opened.enter_async_context(
                Outbox.open(os.path.join(app_dir, "outbox.jsonl"))
            )
        except NotRegularFile as exc:  # the rows it may hold are a person's to look at
            print(f"drive: {exc.strerror}: {exc.filename}", file=sys.stderr)
            return 1
        box.on_ack = None
        box.on_set_aside = lambda e, why: emit(
            {"event": "setAside", "sessionId": e.session_id, "seq": e.seq, "reason": why}
        )
        client, recovered = await connect(opts, box, emit)
        run.recovered = len(recovered)
        driver = TurnDriver(client, box, emit=emit, publish=True)
        if opts.recover_only:
            await client.close()
            emit({"event": "done", "recovered": run.recovered})
            if not opts.json:
                print(f"connect sequence done: {run.recovered} checkpoint(s) recovered", file=out)
            return 0
        number = _next_run_number(app_dir)
        if (sock := watch_socket(opts)) is not None and not opts.json:
            print(
                "watch a session live from a second terminal:\n"
                f"  {sys.executable} -m host watch --socket {sock} s0",
                file=sys.stderr,
            )
        stopped, failed = await _run_sessions(opts, run, driver, box, number)
        if failed is not None:
            if isinstance(failed, PiError):
                print(f"drive: pi: {failed}", file=sys.stderr)
            else:
                log.error("a session failed", exc_info=failed)
                print(f"drive: a session failed: {failed!r}", file=sys.stderr)
            await client.close()
            return 2 if isinstance(failed, PiError) else 1
        if not stopped:  # after a quit, what did not land waits for the next start
            with contextlib.suppress(DrainTimeout):
                await box.drain(30.0)
        summary = {
            "event": "done",
            "agent": opts.agent,
            "model": ", ".join(sorted(run.models)) or None,
            "run": number,
            "sessions": opts.sessions,
            "turns": sum(run.turns_done.values()),
            "outcomes": run.outcomes,
            "rows": driver.stats["rows"],
            "checkpoints": driver.stats["checkpoints"],
            "recovered": run.recovered,
            "skippedArchives": driver.stats["skipped_archives"],
            "outboxPending": box.depth,
            "outboxSetAside": box.stats["dropped"],
            "rowsRefused": len(run.refused),
            "outboxFsyncs": box.journal.fsyncs,
            "seconds": round(time.monotonic() - run.started, 2),
        }
        emit(summary)
        if not opts.json:
            await _print_summary(client, opts, summary, out)
        await client.close()
    if run.refused:
        print(
            f"drive: {len(run.refused)} row(s) refused, the host could never store them:"
            f" their turns ({', '.join(run.refused)}) ended as errors",
            file=sys.stderr,
        )
        return 1
    return 0


async def _run_sessions(
    opts: Options, run: Run, driver: TurnDriver, box: Outbox, number: int
) -> tuple[bool, BaseException | None]:
    """Run every session's turns until they are done or a quit; return whether it was a
    quit, and the failure that ended a session, if any."""
    rng = random.Random(f"{opts.seed}:{number}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    view = None if opts.json else asyncio.create_task(_live_view(run, box, driver))
    sessions = [
        _pi_session(driver, run, f"s{i}", number, opts, stop)
        if opts.agent == "pi"
        else _session(driver, run, f"s{i}", number, opts, random.Random(rng.random()), stop)
        for i in range(opts.sessions)
    ]
    tasks = [asyncio.ensure_future(c) for c in sessions]
    work: asyncio.Future[list[None]] = asyncio.gather(*tasks)
    stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    await asyncio.wait([work, stopper], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():  # quit: flush, abort active turns, wait at most 2 s for their rows

        def stop_agents() -> None:
            for agent in run.streaming.values():
                agent.stop()

        await driver.quit(stop_agents)  # within its 2 s: the turns it could end
    stopper.cancel()
    if view is not None:
        view.cancel()
    failed = work.exception() if work.done() and not work.cancelled() else None
    # Every session ends before any pi closes (one aborted by a close would go on to
    # its next turn and start a new pi): on a quit, whatever still runs stops here, its
    # rows kept in the outbox (and its checkpoint in the host) for the next start;
    # when pi would not start (PiError), the other sessions end too.
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(pi.close() for pi in run.pis.values()))
    return stop.is_set(), failed


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
            run.not_started(sid, tid, exc)
            continue
        run.streaming[sid] = agent
        if action == "stop":
            asyncio.get_running_loop().call_later(opts.reply_seconds * 0.4, agent.stop)
        try:
            outcome = await driver.run(st, agent.events(), regenerate=regenerate)
        except RowRefused as exc:  # its turn ended error; the session goes on
            run.row_refused(sid, tid, exc)
            continue
        run.ended(sid, ("regenerate " if regenerate else "") + outcome)


async def _pi_session(
    driver: TurnDriver, run: Run, sid: str, number: int, opts: Options, stop: asyncio.Event
) -> None:
    """Turns of :data:`PI_ROUND` in session ``sid``, through one pi at a time."""
    client = driver.client
    await client.call("session.create", {"sessionId": sid, "title": f"conversation {sid}"})
    app = os.path.join(opts.data_dir, "app")
    agent = run.pis[sid] = PiAgent(
        os.path.join(app, "pi", f"{sid}.jsonl"),
        command=shlex.split(opts.pi_command),
        workdir=os.path.join(app, "pi-work"),
        stderr_path=os.path.join(opts.data_dir, "pi.log"),
    )
    for k in range(opts.turns):
        if stop.is_set():  # quit: the turn that streamed ends, no new one starts
            return
        tid = f"{sid}-r{number}-t{k}"
        action, words = PI_ROUND[k % len(PI_ROUND)]
        try:
            regenerate, words = await _pi_ready(driver, agent, run, sid, action, words)
            prompt = None if regenerate else _pi_prompt(tid, words)
            st = await driver.begin(sid, tid, prompt)
        except (ClientError, DrainTimeout) as exc:
            run.not_started(sid, tid, exc)
            continue
        run.streaming[sid] = agent
        events = _drill(agent.events(tid, words), action, agent)
        try:
            outcome = await driver.run(st, events, regenerate=regenerate)
        except RowRefused as exc:  # its turn ended error; the session goes on (a new pi)
            run.row_refused(sid, tid, exc)
            continue
        run.ended(sid, ("regenerate " if regenerate else "") + outcome)
        if agent.refused is not None:  # no model, no key: every turn would fail alike
            raise PiError(f"pi refused the prompt of turn {tid}: {agent.refused}")


async def _pi_ready(
    driver: TurnDriver, agent: PiAgent, run: Run, sid: str, action: str, words: str
) -> tuple[bool, str]:
    """Cut for a regenerate, start pi if it needs it; return (regenerate, prompt text)."""
    cut = action == "regenerate" and await driver.truncate_last_reply(sid) is not None
    if action == "regenerate" and not cut:  # nothing to regenerate yet
        words = PI_ROUND[0][1]
    if cut:
        agent.forget()  # pi must not keep the branch the host cut (ADR 0216)
    rows = await _stored_rows(driver.client, sid) if agent.needs_start else []  # a cut forgot it
    if cut:  # the root is the last row now: sent again, as the prompt
        words, rows = text_of(rows[-1]), rows[:-1]
    if agent.needs_start:
        await agent.start(rows)
        run.models.add(agent.model or "?")
    return cut, words


def _pi_prompt(turn_id: str, words: str) -> dict[str, Any]:
    """The user row of a turn, in pi's own shape (what pi echoes, but with an id)."""
    content = [{"type": "text", "text": words}]
    return {"id": f"{turn_id}:u", "role": "user", "content": content, "timestamp": _now_ms()}


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _drill(
    events: AsyncIterator[AgentEvent], action: str, agent: PiAgent
) -> AsyncIterator[AgentEvent]:
    """Pass a turn's events on; press Stop, or SIGKILL pi, once the reply has streamed.

    Closed early (a refused row ends the turn), it closes pi's stream too, at once.
    """
    snapshots = 0
    try:
        async for ev in events:
            yield ev
            if ev["type"] != "message_update":
                continue
            snapshots += 1
            if action == "stop" and snapshots == STOP_AFTER:
                agent.stop()
            elif action == "kill" and snapshots == KILL_AFTER:
                agent.kill()
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def _stored_rows(client: HostClient, sid: str) -> list[dict[str, Any]]:
    """Every stored row of a session, oldest first, a page at a time."""
    rows: list[dict[str, Any]] = []
    before: int | None = None
    while before != 0:
        params: dict[str, Any] = {"sessionId": sid, "limit": 256}
        if before is not None:
            params["beforeLine"] = before
        page = await client.call("session.get", params)
        rows[:0] = page["messages"]
        before = page["startLine"]
    return rows


async def _live_view(run: Run, box: Outbox, driver: TurnDriver) -> None:
    tty = sys.stderr.isatty()
    while True:
        streaming = " ".join(f"{sid}:{a.view()}" for sid, a in sorted(run.streaming.items()))
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
    keys = ("agent", "model", "run", "sessions", "turns", "rows", "checkpoints", "recovered")
    for key in (*keys, "seconds"):
        if summary.get(key) is None:
            continue
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
