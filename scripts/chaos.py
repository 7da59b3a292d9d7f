#!/usr/bin/env python3
"""``make chaos``: SIGKILL the host, the producer or both at random instants, then prove
that nothing acknowledged was lost.

Every iteration runs one kind of load, drawn from the seed, and ends in a real SIGKILL:

=============  ==========================================================================
kind           what is killed, under what load
=============  ==========================================================================
host-direct    ``python -m host serve`` under this script's own pipelined load (appends,
               updates, truncations, ``saveActiveRevision``, checkpoints, on several
               sessions at once); sometimes the restarted host is killed again during
               its start-up (counted as a second kill)
host           the host child of ``python -m outbox drive --json``; the producer runs on
               for up to half a second (its outbox keeps rows durable while the host is
               gone), then it is killed too
producer       the ``drive`` process alone; its host sees end of input and must finish
               what is in flight and exit by itself
both           the whole process group of ``drive`` at once
=============  ==========================================================================

After every kill the data dir is started again (a fresh host, handshake; for the
producer kinds first ``drive --recover-only``, the app's connect sequence) and checked:

- every acknowledged row is present exactly once, in acknowledged order, with the bytes
  it was acknowledged with (direct load: the transcript equals a model replayed over
  every acknowledged call plus some prefix of the calls in flight at the kill, and every
  answer agrees with that model; producer load: every row ``drive`` reported
  ``durable`` or ``recovered``, minus the rows it reported ``cut``, with the content its
  outbox journal holds for it);
- a row reported cut is never back, and is in its root's revision archive;
- every line of every transcript parses; ``python -m host verify`` exits 0;
- no ``*.tmp``, intent or checkpoint file is left after a start, and nothing but torn
  tails of unacknowledged writes was quarantined;
- no message id appears twice (a checkpoint is promoted at most once).

The seed fixes every choice (kinds, instants, operations); the host's progress at a given
instant still varies from run to run, so a replay reproduces the scenario, not always the
exact interleaving. Exit 0 when every check passed, 1 otherwise (the seed and the kill
number to replay are printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as ``python scripts/chaos.py`` from anywhere
    sys.path.insert(0, str(REPO))

from outbox._client import ClientError, HostClient, HostGone, RemoteError  # noqa: E402

PAGER_KEYS = ("revisionRootId", "revisionCount", "activeRevision")
DIRECT_SESSIONS = ("d0", "d1", "d2", "d3")
DIRECT_EPOCH = 50  # direct iterations per data dir (transcripts stay small enough to read)
PRODUCER_EPOCH = 25  # producer iterations per data dir
WAIT = 60.0  # bound of every wait on a child process
KINDS = ("host-direct", "host", "producer", "both")
KIND_WEIGHTS = (46, 18, 18, 18)
Row = dict[str, Any]


class Failure(Exception):
    """Raised when the harness itself cannot go on (a child that never starts, a hang)."""


# -- the model of the direct load --------------------------------------------------------


@dataclass
class Checkpoint:
    """A session's streaming checkpoint as the host holds it."""

    turn_id: str
    message: Row


@dataclass
class SessionState:
    """What one session holds: its rows, its checkpoint, its revision archives."""

    rows: list[Row] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    archive: dict[str, list[list[Row]]] = field(default_factory=dict)

    def copy(self) -> SessionState:
        """Return a copy that can change without changing this one (rows are immutable)."""
        return SessionState(
            list(self.rows), self.checkpoint, {k: list(v) for k, v in self.archive.items()}
        )

    def find(self, message_id: str) -> int | None:
        """Return the line of ``message_id``, if stored."""
        for i, row in enumerate(self.rows):
            if row["id"] == message_id:
                return i
        return None


@dataclass
class Op:
    """One call of the direct load, in the order its line was sent."""

    method: str
    params: dict[str, Any]
    outcome: str = "inflight"  # "inflight" | "ok" | "error"
    answer: Any = None  # the result, or the error's stable name


def stored_row(message: Row, turn_id: str | None, pager: Row) -> Row:
    """The row the host stores for ``message``: caller fields, ``turnId``, pager fields."""
    out = {k: v for k, v in message.items() if k not in PAGER_KEYS}
    if turn_id is not None:
        out["turnId"] = turn_id
    out.update(pager)
    return out


def pager_of(row: Row) -> Row:
    return {k: row[k] for k in PAGER_KEYS if k in row}


def stamp_of(row: Row) -> tuple[int, int | None]:
    count, active = row.get("revisionCount"), row.get("activeRevision")
    return (count if isinstance(count, int) else 0, active if isinstance(active, int) else None)


def make_pager(root_id: str, count: int, active: int) -> Row:
    return {"revisionRootId": root_id, "revisionCount": count, "activeRevision": active}


def has_content(message: Row) -> bool:
    content = message.get("content")
    if isinstance(content, str):
        return content != ""
    if isinstance(content, list):
        return bool(content)
    return content is not None


def next_user(rows: Sequence[Row], after: int) -> int:
    """The line of the first user row after line ``after``, else the end."""
    for i in range(after + 1, len(rows)):
        if rows[i]["role"] == "user":
            return i
    return len(rows)


def plan(revs: list[list[Row]], active: int | None, branch: list[Row]) -> list[list[Row]]:
    """Archive ``branch`` as the host does: replace the active revision or add one."""
    slot = active if active is not None and 0 <= active < len(revs) else len(revs)
    if slot < len(revs) and revs[slot] == branch:
        return revs
    return [*revs[:slot], branch, *revs[slot + 1 :]]


def _slot(revs: list[list[Row]], active: int | None) -> int:
    return active if active is not None and 0 <= active < len(revs) else len(revs)


def promote(st: SessionState, status: str) -> None:
    """Settle the checkpoint: append it with ``status`` unless stored already or empty."""
    cp = st.checkpoint
    if cp is None:
        return
    st.checkpoint = None
    if st.find(cp.message["id"]) is not None or not has_content(cp.message):
        return
    st.rows.append(stored_row({**cp.message, "status": status}, cp.turn_id, {}))


def startup(st: SessionState) -> None:
    """A start plus ``recoverInflightMessages``, with no turns: the checkpoint goes aborted."""
    promote(st, "aborted")


def apply(st: SessionState, op: Op) -> Any:
    """Apply ``op`` to ``st`` as the host would; return its answer (or error name)."""
    p = op.params
    if op.method == "session.appendMessage":
        m = p["message"]
        line = st.find(m["id"])
        appended = line is None
        if line is None:
            st.rows.append(stored_row(m, p.get("turnId"), {}))
            line = len(st.rows) - 1
        if st.checkpoint is not None and st.checkpoint.message["id"] == m["id"]:
            st.checkpoint = None
        return {"line": line, "appended": appended}
    if op.method == "session.updateMessage":
        m = p["message"]
        line = st.find(m["id"])
        if line is None:
            return "NOT_FOUND"
        old = st.rows[line]
        st.rows[line] = stored_row(m, old.get("turnId"), pager_of(old))
        return {"line": line}
    if op.method == "session.saveInflightMessage":
        m = p["message"]
        if st.find(m["id"]) is not None:
            return {"saved": False}
        st.checkpoint = Checkpoint(p["turnId"], m)
        return {"saved": True}
    if op.method == "session.saveActiveRevision":
        return _save_active(st, p.get("rootId"))
    if op.method == "session.truncateFrom":
        return _truncate(st, p["fromMessageId"])
    raise AssertionError(op.method)


def _save_active(st: SessionState, root_id: str | None) -> Any:
    if root_id is None:
        users = [i for i, r in enumerate(st.rows) if r["role"] == "user"]
        if not users:
            return "NOT_FOUND"
        line: int | None = users[-1]
    else:
        line = st.find(root_id)
    if line is None:
        return "NOT_FOUND"
    root = st.rows[line]
    count, active = stamp_of(root)
    branch = st.rows[line + 1 : next_user(st.rows, line)]
    if not branch:
        return {
            "rootId": root["id"],
            "revisionCount": count,
            "activeRevision": active,
            "archived": 0,
            "stamped": False,
        }
    old = st.archive.get(root["id"], [])
    slot = _slot(old, active)
    revs = plan(old, active, branch)
    st.archive[root["id"]] = revs
    pager = make_pager(root["id"], len(revs), slot)
    stamped = pager != pager_of(root)
    if stamped:
        st.rows[line] = stored_row(root, root.get("turnId"), pager)
    return {
        "rootId": root["id"],
        "revisionCount": len(revs),
        "activeRevision": slot,
        "archived": len(branch),
        "stamped": stamped,
    }


def _truncate(st: SessionState, from_id: str) -> Any:
    cp = st.checkpoint
    if st.find(from_id) is None and not (cp is not None and cp.message["id"] == from_id):
        return "NOT_FOUND"
    promote(st, "aborted")  # no running turn: the leftover is settled before the cut
    cut = st.find(from_id)
    if cut is None:
        return "NOT_FOUND"  # the checkpoint named was empty: dropped, nothing to cut
    total = len(st.rows)
    first = st.rows[cut]
    before = st.rows[cut - 1] if cut > 0 else None
    result: Row = {"kept": cut, "removed": total - cut, "archived": 0}
    if before is not None and before["role"] == "user" and first["role"] != "user":
        branch = st.rows[cut : next_user(st.rows, cut - 1)]
        _, active = stamp_of(before)
        revs = plan(st.archive.get(before["id"], []), active, branch)
        st.archive[before["id"]] = revs
        n = len(revs)
        root = stored_row(before, before.get("turnId"), make_pager(before["id"], n + 1, n))
        st.rows[cut - 1 :] = [root]
        result["archived"] = len(branch)
        result["pager"] = {"rootId": before["id"], "revisionCount": n + 1, "activeRevision": n}
    else:
        del st.rows[cut:]
    return result


# -- the direct load ---------------------------------------------------------------------


class DirectLoad:
    """Sessions d0..d3 of one data dir: the acknowledged model and the calls since."""

    def __init__(self, data_dir: Path, quick: bool, stats: Counter[str]) -> None:
        self.data_dir = data_dir
        self.quick = quick
        self.base = {sid: SessionState() for sid in DIRECT_SESSIONS}
        self.opt = {sid: SessionState() for sid in DIRECT_SESSIONS}
        self.log: dict[str, list[Op]] = {sid: [] for sid in DIRECT_SESSIONS}
        self.streaming: dict[str, tuple[str, str, int]] = {}  # sid -> (turn, id, words)
        self.counter = 0
        self.client: HostClient | None = None
        self.stats = stats  # the run's counters, across data dirs

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def send(self, sid: str, method: str, params: dict[str, Any]) -> Op:
        """Log a call in send order and apply it to the optimistic state."""
        op = Op(method, {"sessionId": sid, **params})
        self.log[sid].append(op)
        apply(self.opt[sid], op)
        return op

    def text(self, rng: random.Random, tag: str) -> str:
        roll = rng.random()
        if self.quick or roll < 0.85:
            size = rng.randint(8, 200)
        elif roll < 0.97:
            size = rng.randint(4_000, 64_000)
        else:
            size = rng.randint(256_000, 1_000_000)
        return (tag + " " + "lorem ipsum " * (size // 12 + 1))[:size]

    def choose(self, sid: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """Pick the next call for ``sid`` from what the session will hold by then."""
        st = self.opt[sid]
        rows = st.rows
        if len(rows) > 60 and rng.random() < 0.3:
            users = [r["id"] for r in rows[: len(rows) // 3] if r["role"] == "user"]
            if users:
                return "session.truncateFrom", {"fromMessageId": rng.choice(users)}
        kind = rng.choices(
            ["append", "update", "truncate", "active", "stream", "finish", "dup", "late"],
            weights=(40, 12, 8, 8, 16, 8, 3, 2),
        )[0]
        if kind == "update" and rows:
            old = rng.choice(rows)
            msg = {"id": old["id"], "role": old["role"], "content": self.text(rng, "upd")}
            return "session.updateMessage", {"message": msg}
        if kind == "truncate" and rows:
            users = [i for i, r in enumerate(rows) if r["role"] == "user"]
            roll = rng.random()
            if roll < 0.55 and users and users[-1] < len(rows) - 1:
                target = rows[users[-1] + 1]["id"]
            elif roll < 0.75 and users:
                target = rows[rng.choice(users)]["id"]
            elif roll < 0.85 and st.checkpoint is not None:
                target = st.checkpoint.message["id"]
            else:
                target = rng.choice(rows)["id"]
            return "session.truncateFrom", {"fromMessageId": target}
        if kind == "active":
            users = [r["id"] for r in rows if r["role"] == "user"]
            if users and rng.random() < 0.2:
                return "session.saveActiveRevision", {"rootId": rng.choice(users)}
            return "session.saveActiveRevision", {}
        if kind == "stream":
            turn, mid, words = self.streaming.get(sid) or (self.fresh("t"), self.fresh("a"), 0)
            words += rng.randint(1, 30)
            if not self.quick and rng.random() < 0.03:  # a long reply: snapshots of 64 KiB+,
                words += rng.randint(15_000, 120_000)  # big snapshots of a streaming reply
            self.streaming[sid] = (turn, mid, words)
            content = "" if rng.random() < 0.05 else " ".join(["word"] * words)
            msg = {"id": mid, "role": "assistant", "content": content}
            if len(content) > 1 << 16:
                self.stats["big snapshots sent"] += 1
            return "session.saveInflightMessage", {"turnId": turn, "message": msg}
        if kind == "finish" and sid in self.streaming:
            turn, mid, words = self.streaming.pop(sid)
            status = rng.choice(["complete", "complete", "error", "aborted"])
            content = " ".join(["word"] * (words + 3))
            msg = {"id": mid, "role": "assistant", "content": content, "status": status}
            return "session.appendMessage", {"message": msg, "turnId": turn}
        if kind == "dup" and rows:
            old = rng.choice(rows)
            msg = {k: v for k, v in old.items() if k not in (*PAGER_KEYS, "turnId")}
            return "session.appendMessage", {"message": msg}
        if kind == "late":
            done = [r for r in rows if r["role"] == "assistant"]
            if done:
                msg = {"id": rng.choice(done)["id"], "role": "assistant", "content": "late"}
                return "session.saveInflightMessage", {"turnId": self.fresh("t"), "message": msg}
        role = rng.choices(["user", "assistant", "tool", "system"], weights=(30, 45, 20, 5))[0]
        mid = self.fresh("m")
        msg = {"id": mid, "role": role, "content": self.text(rng, mid)}
        params: dict[str, Any] = {"message": msg}
        if rng.random() < 0.5:
            params["turnId"] = self.fresh("t")
        return "session.appendMessage", params

    async def load(self, client: HostClient, rng: random.Random, seconds: float) -> bool:
        """Pipeline calls from several workers for ``seconds``, then SIGKILL the host.

        Return whether the kill hit a live host (``False``: it had died by itself).
        """

        async def worker(wrng: random.Random) -> None:
            while not client.gone.is_set():
                sid = wrng.choice(DIRECT_SESSIONS)
                method, params = self.choose(sid, wrng)
                op = self.send(sid, method, params)  # logged in the order lines are sent
                try:
                    op.answer = await client.call(method, op.params, timeout=WAIT)
                    op.outcome = "ok"
                except RemoteError as exc:
                    op.outcome, op.answer = "error", exc.name
                except ClientError:
                    return
                self.stats[f"acked {method.removeprefix('session.')}"] += 1

        tasks = [
            asyncio.create_task(worker(random.Random(rng.random())))
            for _ in range(rng.randint(1, 8))
        ]
        hit = False
        try:
            await asyncio.sleep(seconds)
        finally:
            assert client.proc is not None
            hit = sigkill(client.proc.pid)
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()
        return hit

    def forget_streams(self) -> None:
        """After a start every checkpoint is settled: streaming replies start afresh."""
        self.streaming.clear()


# -- shared helpers ----------------------------------------------------------------------


@dataclass
class Report:
    """What the checks found over the whole run."""

    losses: int = 0
    violations: int = 0
    messages: list[str] = field(default_factory=list)
    first_failure: int | None = None
    kinds: dict[int, str] = field(default_factory=dict)  # kill number -> what was killed

    def loss(self, kill: int, n: int, what: str) -> None:
        self.losses += n
        self._note(kill, f"LOSS ({n}): {what}")

    def violation(self, kill: int, what: str) -> None:
        self.violations += 1
        self._note(kill, f"VIOLATION: {what}")

    def _note(self, kill: int, text: str) -> None:
        if self.first_failure is None:
            self.first_failure = kill
        self.messages.append(f"kill #{kill} ({self.kinds.get(kill, '-')}): {text}")

    @property
    def failed(self) -> bool:
        return bool(self.losses or self.violations)


async def read_all(client: HostClient, sid: str) -> list[Row] | None:
    """Every row of a session over ``session.get``, paged; ``None`` when it does not exist."""
    try:
        head = await client.call("session.get", {"sessionId": sid, "limit": 0}, timeout=WAIT)
    except RemoteError as exc:
        if exc.name == "NOT_FOUND":
            return None
        raise
    total = int(head["totalLines"])
    out: list[Row] = []
    page = 64
    while len(out) < total:
        end = min(total, len(out) + page)
        try:
            res = await client.call(
                "session.get",
                {"sessionId": sid, "beforeLine": end, "limit": end - len(out)},
                timeout=WAIT,
            )
        except RemoteError as exc:
            if exc.name == "LIMIT_EXCEEDED" and page > 1:
                page //= 2
                continue
            raise
        out.extend(res["messages"])
    return out


async def archives(client: HostClient, sid: str, rows: Sequence[Row]) -> dict[str, Row]:
    """``listRevisions`` (with messages) of every user row of a session."""
    out: dict[str, Row] = {}
    for row in rows:
        if row["role"] == "user":
            out[row["id"]] = await client.call(
                "session.listRevisions",
                {"sessionId": sid, "rootId": row["id"], "includeMessages": True},
                timeout=WAIT,
            )
    return out


async def spawn_host(data_dir: Path, log: Path) -> HostClient:
    """Start a host on ``data_dir`` and handshake it (start-up recovery is done then)."""
    client = await HostClient.spawn(str(data_dir), log_path=str(log), deadline=WAIT)
    try:
        async with asyncio.timeout(WAIT):
            await client.handshake()
    except BaseException:
        client.kill()
        await client.close()
        raise
    return client


async def run_verify(data_dir: Path) -> tuple[int, str]:
    """``python -m host verify``: exit code and output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "host",
        "verify",
        "--data-dir",
        str(data_dir),
        "--log-level",
        "warning",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(WAIT):
            out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode(errors="replace")


class FileChecks:
    """Checks on the files of a host data dir, right after a start."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.quarantine_seen: dict[str, int] = {}
        self.torn_tails = 0

    def run(self, report: Report, kill: int, *, checkpoints_settled: bool) -> None:
        sessions = self.data_dir / "sessions"
        for path in sorted(self.data_dir.rglob("*.tmp")):
            report.violation(kill, f"temp file left after a start: {path}")
        for path in sorted(sessions.glob("*.intent.json")):
            report.violation(kill, f"intent file left after a start: {path}")
        if checkpoints_settled:
            for path in sorted(sessions.glob("*.inflight.json")):
                report.violation(kill, f"checkpoint left unsettled after recovery: {path}")
        for path in sorted(sessions.glob("*.jsonl")):
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                report.violation(kill, f"{path.name}: last line has no newline")
            for n, line in enumerate(data.split(b"\n")[:-1] if data else []):
                try:
                    value = json.loads(line)
                    ok = isinstance(value, dict) and isinstance(value.get("id"), str)
                    ok = ok and isinstance(value.get("role"), str)
                except ValueError:
                    ok = False
                if not ok:
                    report.violation(kill, f"{path.name} line {n} does not parse: {line[:80]!r}")
        for path in sorted(sessions.glob("*.jsonl.quarantine")):
            lines = path.read_bytes().split(b"\n")[:-1]
            seen = self.quarantine_seen.get(path.name, 0)
            for line in lines[seen:]:
                reason = json.loads(line).get("reason", "")
                if reason == "torn last line":
                    self.torn_tails += 1  # an append the kill interrupted: never answered
                else:
                    report.violation(kill, f"{path.name}: a line was quarantined: {reason}")
            self.quarantine_seen[path.name] = len(lines)


# -- the producer load ---------------------------------------------------------------------


@dataclass
class ProducerTrack:
    """What ``drive`` reported for one data dir, over all its runs."""

    durable: dict[str, list[str]] = field(default_factory=dict)
    cut: set[str] = field(default_factory=set)
    reported_cut: dict[str, set[str]] = field(default_factory=dict)
    recovered: set[tuple[str, str]] = field(default_factory=set)
    journal: dict[str, tuple[str, str | None, Row]] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)  # already reported: counted once
    checkpoints: int = 0

    def event(self, ev: Row) -> None:
        kind = ev.get("event")
        if kind == "durable":
            self.durable.setdefault(ev["sessionId"], []).append(ev["messageId"])
        elif kind == "cut":
            self.cut.update(ev["messageIds"])
            self.reported_cut.setdefault(ev["sessionId"], set()).update(ev["messageIds"])
        elif kind == "recovered":
            self.recovered.add((ev["sessionId"], ev["messageId"]))
        elif kind == "checkpoint":
            self.checkpoints += 1

    def read_journal(self, path: Path) -> None:
        """Remember every row the outbox journal holds (acknowledged or not) by id."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        for line in data.split(b"\n")[:-1]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a torn entry: enqueue never returned for it
            if "seq" in entry and isinstance(entry.get("message"), dict):
                msg = entry["message"]
                self.journal[msg["id"]] = (entry["sessionId"], entry.get("turnId"), msg)


PROMPT_ID = re.compile(r"^(?P<sid>[^-]+)-r(?P<run>\d+)-t(?P<k>\d+)-u$")


def unreported_cut(rows: Sequence[Row], revs: dict[str, Row], missing: set[str]) -> bool:
    """Whether ``missing`` is one branch cut by a truncation the kill kept unreported.

    ``drive`` reports a cut right after ``truncateFrom`` returns, so a kill in between (or
    after the host recorded the cut's intent, which its next start finishes) leaves the
    session ending at its last user row, stamped for a branch to come, with the cut branch
    in that row's archive. ``revs``: ``listRevisions`` (with messages) by root id.
    """
    if not rows or rows[-1]["role"] != "user":
        return False
    root = rows[-1]
    res = revs.get(root["id"])
    if res is None or root.get("activeRevision") != len(res["revisions"]):
        return False
    return missing <= {m["id"] for r in res["revisions"] for m in r.get("messages", [])}


def caller_fields(row: Row) -> Row:
    return {k: v for k, v in row.items() if k not in (*PAGER_KEYS, "turnId")}


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) pids of process group ``pgid``, from ``/proc``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != b"Z":
            out.append(int(name))
    return out


def live(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: killing it kills nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :].split()[0] != b"Z"


def sigkill(pid: int, *, group: bool = False) -> bool:
    """SIGKILL a live process (or its whole group); ``False`` when there was none to kill."""
    if not (group_members(pid) if group else live(pid)):
        return False
    try:
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def is_host(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
    except OSError:
        return False
    return b"host" in cmd and b"serve" in cmd


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Options:
    kills: int
    seed: int
    root: Path
    quick: bool


class Chaos:
    """The whole run: the kill loop, the checks and the progress bar."""

    def __init__(self, opts: Options, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.opts = opts
        self.out = out
        self.err = err
        self.report = Report()
        self.kills: Counter[str] = Counter()
        self.instants: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.done = 0
        self.survived = 0
        self.started = time.monotonic()
        self.last_kind = "-"
        self.direct: DirectLoad | None = None
        self.direct_files: FileChecks | None = None
        self.direct_iterations = 0
        self.producer_dir: Path | None = None
        self.producer_track = ProducerTrack()
        self.producer_files: FileChecks | None = None
        self.producer_iterations = 0
        self.torn_tails = 0
        self.drives: list[asyncio.subprocess.Process] = []
        self.tty = err.isatty()
        self.last_drawn = -1

    # -- progress -------------------------------------------------------------------

    def elapsed(self) -> str:
        s = int(time.monotonic() - self.started)
        return f"{s // 60}m{s % 60:02d}s"

    def draw(self, final: bool = False) -> None:
        total = self.opts.kills
        width = 30
        filled = width * self.done // max(1, total)
        line = (
            f"chaos [{'#' * filled}{'.' * (width - filled)}] {self.done}/{total} kills"
            f" | losses {self.report.losses} | violations {self.report.violations}"
            f" | {self.elapsed()} | last {self.last_kind:<11}"
        )
        if self.tty:
            self.err.write("\r" + line + ("\n" if final else ""))
        elif final or self.done // max(1, total // 20) != self.last_drawn:
            self.last_drawn = self.done // max(1, total // 20)
            self.err.write(line + "\n")
        self.err.flush()

    async def ticker(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            if self.tty:
                self.draw()

    def killed(self, kind: str, instant: str) -> None:
        self.done += 1
        self.report.kinds[self.done] = f"{kind}, {instant}"
        self.kills[kind] += 1
        self.instants[instant] += 1
        self.last_kind = kind
        self.draw()

    # -- the loop -------------------------------------------------------------------

    async def run(self) -> int:
        asyncio.get_running_loop().set_exception_handler(_quiet_host_gone)
        ticker = asyncio.create_task(self.ticker())
        iteration = 0
        try:
            while self.done < self.opts.kills:
                rng = random.Random(f"{self.opts.seed}:{iteration}")
                kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
                before, failures = self.done, len(self.report.messages)
                try:
                    if kind == "host-direct":
                        await self.direct_iteration(rng)
                    else:
                        await self.producer_iteration(rng, kind)
                except (Failure, ClientError, OSError, TimeoutError) as exc:
                    # A host that will not start or answer after a kill is a finding too.
                    self.report.violation(self.done, f"the harness could not go on: {exc!r}")
                    break
                if len(self.report.messages) == failures:
                    self.survived += self.done - before
                iteration += 1
            if self.direct is not None and self.direct.client is not None:
                await self.direct.client.close()
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            for proc in self.drives:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
            if self.direct is not None and self.direct.client is not None:
                self.direct.client.kill()
        self.draw(final=True)
        self.summary()
        return 1 if self.report.failed else 0

    # -- direct iterations ----------------------------------------------------------

    async def direct_iteration(self, rng: random.Random) -> None:
        if self.direct is None or self.direct_iterations % DIRECT_EPOCH == 0:
            await self.new_direct_dir()
        d = self.direct
        assert d is not None and d.client is not None
        self.direct_iterations += 1
        seconds = rng.uniform(0.05, 0.4 if self.opts.quick else 1.2)
        assert d.client.proc is not None
        if not await d.load(d.client, rng, seconds):
            code = d.client.proc.returncode
            raise Failure(f"the direct-load host exited by itself (exit {code}) under load")
        d.client = None
        self.killed("host-direct", "under load")
        log = self.opts.root / "host-direct.log"
        if self.done < self.opts.kills and rng.random() < 0.15:
            # Kill the next host again at a random instant of its start-up.
            client = await HostClient.spawn(str(d.data_dir), log_path=str(log), deadline=WAIT)
            await asyncio.sleep(rng.uniform(0.0, 0.7))
            assert client.proc is not None
            hit = sigkill(client.proc.pid)
            await client.close()
            if not hit:
                code = client.proc.returncode
                raise Failure(f"a starting host exited by itself (exit {code})")
            self.killed("host-direct", "start-up")
        d.client = await spawn_host(d.data_dir, log)
        # The connect sequence (no outbox here to drain): settle every leftover checkpoint.
        await d.client.call("session.recoverInflightMessages", {}, timeout=WAIT)
        d.forget_streams()
        await self.check_direct(d)

    async def new_direct_dir(self) -> None:
        if self.direct is not None and self.direct.client is not None:
            await self.direct.client.close()
            if not self.report.failed:
                shutil.rmtree(self.direct.data_dir, ignore_errors=True)
        n = self.direct_iterations // DIRECT_EPOCH
        data = self.opts.root / f"direct-{n}"
        shutil.rmtree(data, ignore_errors=True)
        self.direct = DirectLoad(data, self.opts.quick, self.stats)
        self.direct_files = FileChecks(data)
        client = await spawn_host(data, self.opts.root / "host-direct.log")
        for sid in DIRECT_SESSIONS:
            await client.call("session.create", {"sessionId": sid}, timeout=WAIT)
        self.direct.client = client

    async def check_direct(self, d: DirectLoad) -> None:
        assert d.client is not None and self.direct_files is not None
        kill = self.done
        client = d.client
        verify = asyncio.create_task(run_verify(d.data_dir))
        self.direct_files.run(self.report, kill, checkpoints_settled=True)
        for sid in DIRECT_SESSIONS:
            actual = await read_all(client, sid)
            if actual is None:
                self.report.loss(kill, 1, f"direct session {sid} is gone")
                actual = []
            revs = await archives(client, sid, actual)
            self.match_session(d, sid, actual, revs, kill)
        code, text = await verify
        if code != 0:
            self.report.violation(kill, f"host verify exit {code} on {d.data_dir}:\n{text}")
        self.torn_tails = self.direct_files.torn_tails + (
            self.producer_files.torn_tails if self.producer_files else 0
        )

    def match_session(
        self, d: DirectLoad, sid: str, actual: list[Row], revs: dict[str, Row], kill: int
    ) -> None:
        """Find the prefix of calls in flight that explains ``actual``; report if none does."""
        ops = d.log[sid]
        kmin = max((i + 1 for i, op in enumerate(ops) if op.outcome != "inflight"), default=0)
        st = d.base[sid].copy()
        answers: list[Any] = [apply(st, op) for op in ops[:kmin]]
        candidates: list[tuple[int, SessionState]] = []
        k = kmin
        while True:
            cand = st.copy()
            startup(cand)
            candidates.append((k, cand))
            if k == len(ops):
                break
            answers.append(apply(st, ops[k]))
            k += 1
        matches = [(k, c) for k, c in candidates if c.rows == actual]
        archived_ok = [(k, c) for k, c in matches if self.archives_agree(c, revs)]
        self.stats["direct calls checked"] += len(ops)
        self.stats["direct calls in flight at a kill"] += len(ops) - kmin
        self.stats["direct rows checked"] += len(actual)
        if archived_ok:
            k, chosen = archived_ok[0]
            for i, op in enumerate(ops[:k]):
                if op.outcome != "inflight" and answers[i] != op.answer:
                    self.report.violation(
                        kill,
                        f"{sid}: {op.method} {_short(op.params)} answered {_short(op.answer)},"
                        f" the model says {_short(answers[i])}",
                    )
        else:
            self.diagnose(sid, actual, candidates, bool(matches), kill)
            chosen = SessionState(list(actual), None, {})
            for root, res in revs.items():
                chosen.archive[root] = [list(r.get("messages", [])) for r in res["revisions"]]
        d.base[sid] = chosen
        d.opt[sid] = chosen.copy()
        d.log[sid] = []

    def archives_agree(self, st: SessionState, revs: dict[str, Row]) -> bool:
        for root_id, res in revs.items():
            want = st.archive.get(root_id, [])
            got = [list(r.get("messages", [])) for r in res["revisions"]]
            if got != want:
                return False
        return True

    def diagnose(
        self,
        sid: str,
        actual: list[Row],
        candidates: list[tuple[int, SessionState]],
        rows_matched: bool,
        kill: int,
    ) -> None:
        kmin = candidates[0][0]
        span = f"{len(candidates) - 1} call(s) in flight, {kmin} answered"
        if rows_matched:
            self.report.violation(kill, f"{sid}: revision archives differ from the model ({span})")
            return
        ids = [r["id"] for r in actual]
        dupes = [i for i, n in Counter(ids).items() if n > 1]
        required = set.intersection(*({r["id"] for r in c.rows} for _, c in candidates))
        possible = set.union(*({r["id"] for r in c.rows} for _, c in candidates))
        missing = sorted(required - set(ids))
        extra = sorted(set(ids) - possible)
        if dupes:
            self.report.loss(kill, len(dupes), f"{sid}: ids stored twice: {dupes[:10]}")
        if missing:
            self.report.loss(
                kill, len(missing), f"{sid}: acknowledged rows missing: {missing[:10]}"
            )
        if extra:
            self.report.violation(kill, f"{sid}: rows nobody sent: {extra[:10]}")
        if not (dupes or missing or extra):
            best = max(candidates, key=lambda kc: _common_prefix(kc[1].rows, actual))[1]
            at = _common_prefix(best.rows, actual)
            want = best.rows[at] if at < len(best.rows) else None
            got = actual[at] if at < len(actual) else None
            self.report.loss(
                kill,
                1,
                f"{sid}: transcript differs from every admissible state ({span}) at line {at}:"
                f" {_diff(want, got)}",
            )

    # -- producer iterations ----------------------------------------------------------

    async def producer_iteration(self, rng: random.Random, kind: str) -> None:
        if self.producer_dir is None or self.producer_iterations % PRODUCER_EPOCH == 0:
            if self.producer_dir is not None and not self.report.failed:
                shutil.rmtree(self.producer_dir, ignore_errors=True)
            n = self.producer_iterations // PRODUCER_EPOCH
            self.producer_dir = self.opts.root / f"producer-{n}"
            shutil.rmtree(self.producer_dir, ignore_errors=True)
            self.stats["producer checkpoints reported"] += self.producer_track.checkpoints
            self.producer_track = ProducerTrack()
            self.producer_files = FileChecks(self.producer_dir / "host")
        self.producer_iterations += 1
        root = self.producer_dir
        track = self.producer_track
        reply = rng.uniform(0.2, 0.4) if self.opts.quick else rng.uniform(0.3, 0.9)
        args = ["--sessions", "3", "--turns", "40", "--reply-seconds", f"{reply:.2f}"]
        args += ["--seed", str(rng.randrange(1 << 30))]
        with open(self.opts.root / "drive.log", "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "outbox",
                "drive",
                "--json",
                "--data-dir",
                str(root),
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                limit=1 << 24,
            )
        self.drives.append(proc)
        events: list[Row] = []
        progress = asyncio.Event()

        async def reader() -> None:
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                if line.endswith(b"\n"):
                    events.append(json.loads(line))
                    progress.set()

        reading = asyncio.create_task(reader())
        by_events = rng.random() < 0.5
        target = rng.randint(1, 50)
        delay = rng.uniform(0.2, 1.5 if self.opts.quick else 2.5)
        deadline = time.monotonic() + (WAIT if by_events else delay)
        instant = "after events" if by_events else "after a delay"
        while (not by_events or len(events) < target) and time.monotonic() < deadline:
            if reading.done():
                break
            progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progress.wait(), max(0.0, deadline - time.monotonic()))
        if reading.done():  # drive ended on its own before the kill: no kill this time
            await proc.wait()
            self.stats["drive runs that ended before their kill"] += 1
            for ev in events:
                track.event(ev)
            return
        host_pid = await self.host_of(proc.pid) if kind == "host" else None
        if kind == "both" or (kind == "host" and host_pid is None):
            hit = sigkill(proc.pid, group=True)
            kind = "both"  # (a host kill with no host spawned yet is a kill of both)
        elif kind == "producer":
            hit = sigkill(proc.pid)
        else:
            assert host_pid is not None
            hit = sigkill(host_pid)
            await asyncio.sleep(rng.uniform(0.05, 0.5))  # the outbox carries on alone
            sigkill(proc.pid, group=True)  # (it may have ended by itself meanwhile)
        async with asyncio.timeout(WAIT):
            await reading
            await proc.wait()
        self.drives.remove(proc)
        if not hit:  # what was to be killed had ended already: not a kill
            await self.await_group_exit(proc.pid)
            self.stats["drive runs that ended before their kill"] += 1
            for ev in events:
                track.event(ev)
            return
        self.killed(kind, instant)
        # The producer's host (if it had one) sees end of input: it must finish and exit.
        await self.await_group_exit(proc.pid)
        for ev in events:
            track.event(ev)
        self.stats["producer events read"] += len(events)
        track.read_journal(root / "app" / "outbox.jsonl")
        await self.recover_only(root, track)
        await self.check_producer(root, track)

    async def host_of(self, pgid: int) -> int | None:
        """The pid of ``drive``'s host, waiting a little for it to be spawned."""
        for _ in range(100):
            for pid in group_members(pgid):
                if pid != pgid and is_host(pid):
                    return pid
            await asyncio.sleep(0.02)
        return None

    async def await_group_exit(self, pgid: int) -> None:
        """Wait (15 s at most) until nothing of ``drive``'s process group is left."""
        limit = time.monotonic() + 15.0
        while group_members(pgid):
            if time.monotonic() > limit:
                self.report.violation(
                    self.done, "a host whose producer was killed did not exit within 15 s"
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                return
            await asyncio.sleep(0.02)

    async def recover_only(self, root: Path, track: ProducerTrack) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "outbox",
            "drive",
            "--json",
            "--data-dir",
            str(root),
            "--recover-only",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(WAIT):
                out, err = await proc.communicate()
        except TimeoutError:
            sigkill(proc.pid, group=True)
            await proc.wait()
            raise Failure(f"drive --recover-only on {root} hung for {WAIT:.0f} s") from None
        for line in out.splitlines():
            track.event(json.loads(line))
        if proc.returncode != 0:
            self.report.violation(
                self.done,
                f"drive --recover-only exit {proc.returncode}:"
                f" {err.decode(errors='replace')[-2000:]}",
            )

    async def check_producer(self, root: Path, track: ProducerTrack) -> None:
        assert self.producer_files is not None
        kill = self.done
        host_dir = root / "host"
        client = await spawn_host(host_dir, root / "host.log")
        try:
            verify = asyncio.create_task(run_verify(host_dir))
            self.producer_files.run(self.report, kill, checkpoints_settled=True)
            listed = [s["sessionId"] async for s in client.list_sessions(timeout=WAIT)]
            sids = sorted({*listed, *track.durable})
            for sid in sids:
                rows = await read_all(client, sid) or []
                revs = await archives(client, sid, rows)
                self.check_producer_session(track, sid, rows, revs, kill)
            code, text = await verify
            if code != 0:
                self.report.violation(kill, f"host verify exit {code} on {host_dir}:\n{text}")
        finally:
            await client.close()
        self.torn_tails = self.producer_files.torn_tails + (
            self.direct_files.torn_tails if self.direct_files else 0
        )

    def check_producer_session(
        self, track: ProducerTrack, sid: str, rows: list[Row], revs: dict[str, Row], kill: int
    ) -> None:
        ids = [r["id"] for r in rows]
        present = set(ids)
        self.stats["producer rows checked"] += len(rows)
        dupes = [i for i, n in Counter(ids).items() if n > 1]
        if dupes:
            self.report.loss(kill, len(dupes), f"{sid}: ids stored twice: {dupes[:10]}")
        archived: dict[str, set[str]] = {
            root: {m["id"] for r in res["revisions"] for m in r.get("messages", [])}
            for root, res in revs.items()
        }
        all_archived = set().union(*archived.values()) if archived else set()
        durable = [i for i in track.durable.get(sid, []) if i not in track.cut | track.lost]
        missing = [i for i in durable if i not in present]
        if missing and unreported_cut(rows, revs, set(missing)):
            track.cut.update(missing)
            self.stats["cuts applied but killed before reported"] += 1
            missing = []
        if missing:
            track.lost.update(missing)
            where = [(i, "archived" if i in all_archived else "nowhere") for i in missing]
            self.report.loss(
                kill,
                len(missing),
                f"{sid}: rows reported durable are missing: {where[:10]}",
            )
        want = [i for i in durable if i in present]
        wanted = set(want)
        order = [i for i in ids if i in wanted]
        if order != want:
            at = _common_prefix(order, want)
            self.report.loss(
                kill,
                1,
                f"{sid}: durable rows out of order at {at}: stored {order[at : at + 4]},"
                f" reported {want[at : at + 4]}",
            )
        for s, mid in sorted(track.recovered):
            if s == sid and mid not in present and mid not in track.cut | track.lost:
                track.lost.add(mid)
                self.report.loss(kill, 1, f"{sid}: recovered row {mid} is missing")
        back = sorted(present & track.cut)
        if back:
            self.report.violation(kill, f"{sid}: rows reported cut are back: {back[:10]}")
        unarchived = sorted(track.reported_cut.get(sid, set()) - all_archived)
        if unarchived:
            self.report.violation(kill, f"{sid}: cut rows not in any archive: {unarchived[:10]}")
        for row in rows:
            self.check_content(track, sid, row, kill)

    def check_content(self, track: ProducerTrack, sid: str, row: Row, kill: int) -> None:
        mid = row["id"]
        entry = track.journal.get(mid)
        if mid in track.lost:
            return
        if entry is not None:
            esid, turn_id, msg = entry
            want, got = caller_fields(msg), caller_fields(row)
            if esid != sid or (turn_id is not None and row.get("turnId") != turn_id):
                self.report.loss(kill, 1, f"{sid}: {mid} stored in the wrong place or turn")
            elif want != got:
                if {k: v for k, v in want.items() if k != "status"} == {
                    k: v for k, v in got.items() if k != "status"
                }:
                    what = f"status {want.get('status', 'complete')!r} became"
                    what += f" {got.get('status', 'complete')!r}"
                else:
                    what = (
                        f"content {len(str(want.get('content', '')))} chars became"
                        f" {len(str(got.get('content', '')))} chars"
                        f" ({got.get('status', 'complete')})"
                    )
                durable = mid in track.durable.get(sid, [])
                track.lost.add(mid)
                self.report.loss(
                    kill,
                    1,
                    f"{sid}: {mid} ({'reported durable' if durable else 'in the outbox'})"
                    f" was stored differently: {what}",
                )
            self.stats["producer rows checked against the journal"] += 1
            return
        m = PROMPT_ID.match(mid)
        if m and row.get("role") == "user":
            want_text = f"question {m['k']} of run {m['run']}"
            if row.get("content") != want_text:
                track.lost.add(mid)
                self.report.loss(kill, 1, f"{sid}: prompt {mid} content changed")

    # -- the summary ------------------------------------------------------------------

    def summary(self) -> None:
        p = self.out
        r = self.report
        print(f"\nchaos summary (seed {self.opts.seed}, data under {self.opts.root})", file=p)
        print(f"  kills            {self.done}", file=p)
        print(f"  survived         {self.survived}", file=p)
        print(f"  losses           {r.losses}", file=p)
        print(f"  violations       {r.violations}", file=p)
        print(f"  elapsed          {self.elapsed()}", file=p)
        for kind in KINDS:
            print(f"  killed {kind:<11} {self.kills[kind]}", file=p)
        for instant, n in sorted(self.instants.items()):
            print(f"  instant: {instant:<14} {n}", file=p)
        print(f"  torn tails cut   {self.torn_tails}", file=p)
        stats = Counter(self.stats)
        stats["producer checkpoints reported"] += self.producer_track.checkpoints
        for key, n in sorted(stats.items()):
            print(f"  {key:<44} {n}", file=p)
        if r.failed:
            print("\nFAILED", file=p)
            for msg in r.messages[:50]:
                print(f"  {msg}", file=p)
            if len(r.messages) > 50:
                print(f"  ... and {len(r.messages) - 50} more", file=p)
            quick = " --quick" if self.opts.quick else ""
            print(
                f"\nreplay: python scripts/chaos.py --seed {self.opts.seed}"
                f" --kills {r.first_failure}{quick}  (first failure at kill #{r.first_failure})",
                file=p,
            )
        else:
            print("\nOK: nothing acknowledged was lost", file=p)


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def _quiet_host_gone(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Drop the "never retrieved" notes of calls a kill failed; report everything else.

    ``HostClient.call`` leaves one when the host dies while the request is being
    drained: its read loop fails the future, then ``drain`` raises and nobody awaits it.
    """
    if isinstance(context.get("exception"), HostGone) and "never retrieved" in str(
        context.get("message")
    ):
        return
    loop.default_exception_handler(context)


def _diff(want: Row | None, got: Row | None) -> str:
    """Say how a stored row differs from the expected one."""
    if want is None or got is None:
        return f"expected {_short(want)}, stored {_short(got)}"
    out = []
    for key in sorted(set(want) | set(got)):
        a, b = want.get(key), got.get(key)
        if a == b:
            continue
        if isinstance(a, str) and isinstance(b, str):
            at = _common_prefix(a, b)
            out.append(f"{key} ({len(a)} vs {len(b)} chars, first difference at {at})")
        else:
            out.append(f"{key} expected {_short(a, 80)}, stored {_short(b, 80)}")
    return f"{want.get('id')}: " + "; ".join(out)


def _short(value: Any, limit: int = 300) -> str:
    def clip(v: Any) -> Any:
        if isinstance(v, str) and len(v) > 40:
            return v[:37] + "..."
        if isinstance(v, dict):
            return {k: clip(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clip(x) for x in v]
        return v

    text = json.dumps(clip(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/chaos.py", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--kills", type=int, default=200, help="SIGKILLs to survive (200)")
    parser.add_argument("--seed", type=int, help="seed of every choice (default: random)")
    parser.add_argument("--dir", help="where the data dirs go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="shorter loads, small rows")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chaos test; return 0 when nothing acknowledged was lost, else 1."""
    a = parse_args(argv)
    if a.kills < 1:
        print("--kills must be at least 1", file=sys.stderr)
        return 2
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    own_dir = a.dir is None
    root = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="hostcore-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    os.umask(0o077)
    # Every child (host, drive, verify) runs the code of this script's own tree.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    chaos = Chaos(Options(a.kills, seed, root.resolve(), a.quick))
    print(f"chaos: {a.kills} kills, seed {seed}, data under {root}", file=sys.stderr)
    code = asyncio.run(chaos.run())
    if code == 0 and own_dir:
        shutil.rmtree(root, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
