"""pi as the agent runtime: one ``pi --mode rpc`` process per chat session (issue 29).

pi (npm ``@mariozechner/pi-coding-agent``) reads JSON commands on stdin and writes JSON
events and command responses on stdout, one a line. What it prints is not what the turn
driver and the host take (``../shared/fixtures/pi-rpc/README.md`` describes real captures
of pi 0.73.1); :class:`PiTurn` maps one turn's events to the driver's:

- **ids.** No pi message has one. The n-th assistant message of a turn is
  ``<turnId>:a<n>``, from its ``message_start`` to its ``message_end``, so its snapshots,
  checkpoints and final row share it; a tool result is ``<turnId>:tool:<toolCallId>``,
  characters outside the id pattern mapped (:func:`tool_name`). Nothing depends on time
  or chance: the same events for the same turn give the same ids, so a replay is
  deduplicated by the host.
- **echoes and scratch.** The echoed prompt (a ``user`` message) is dropped: ``beginTurn``
  stored it. ``message_update`` is checkpointed from its ``message``; the copy in
  ``assistantMessageEvent.partial`` is ignored. Mid-stream scratch is dropped from
  snapshots: ``partialArgs`` and ``streamIndex`` of tool calls, and ``stopReason``, which
  is pi's initial ``"stop"`` until the stream ends.
- **statuses.** A final row's ``stopReason`` ``stop``, ``length`` or ``toolUse`` is a
  ``complete`` row; ``aborted`` and ``error`` rows keep that status (and pi's fields, such
  as ``errorMessage``). ``toolResult`` rows are role ``tool``.
- **outcomes.** The turn ends at ``agent_end``: ``stopped`` after an aborted reply,
  ``error`` after a failed one, else ``completed``. A stream that ends without it (pi
  killed, or gone) ends the driver's turn as a crash (``recoverInflight``).
- **lines read as the host reads them** (``outbox._read``): pi is Node, and its grep tool
  cuts long lines inside an emoji, which ``JSON.stringify`` writes as ``\ud83d``; the half
  pair is read as U+FFFD (the row is rebuilt from pi's message, so it is kept as text). An
  event that cannot be read even so (a line that opens a JSON object, as every event of
  pi's does, nested past any decoder, cut, or over 256 MiB) is logged and ends the turn
  ``error`` at once, pi aborted and marked stale: it may have been a row or the
  ``agent_end`` itself, and waiting for one would wait for good. Other output (not an
  object: some library's warning on stdout) is logged and passed over, as it cannot be one.
- **retries.** After a failed reply pi may retry by itself: ``agent_end``, then
  ``auto_retry_start``, then a second ``agent_start`` with no prompt. Nothing in
  ``agent_end`` says which, so the runtime sends a ``get_state`` and waits for its answer:
  pi emits ``auto_retry_start`` in the same synchronous step as ``agent_end``
  (``agent-session.js`` ``_processAgentEvent``), and reads the next command only after
  it, so an answer that comes first means no retry. A retry stays in the same turn: the
  failed attempt is kept as an ``error`` row (the user saw it) and the next reply follows
  it with the next id. The same holds for a context overflow that pi compacts and retries.
- **Stop and quit** send pi's ``abort`` command, never a signal, so that pi writes its
  final rows (an ``aborted`` reply). End of input makes pi exit without them, so
  :meth:`PiAgent.close` aborts and waits for the turn first. pi runs in a session of its
  own, so a terminal's Ctrl-C reaches the app, whose quit aborts, and not pi.
- **pi's own copy of the conversation.** pi keeps the conversation in memory and in a
  session file. The runtime starts pi with ``--session FILE``, a session file it writes
  from the host's transcript (:func:`session_lines`), so pi knows exactly what the host
  stored. After a host-side cut (a regenerate, ADR 0216) :meth:`PiAgent.forget` marks the
  process stale and the next turn starts a new pi from the kept history; a pi that died
  is started the same way. pi's ``switch_session`` command could load the file into the
  running process instead, but an extension may cancel it, and the restart is the path a
  killed pi needs anyway: one way to give pi its history.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import itertools
import logging
import os
import re
import signal
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import msgspec

from outbox._driver import text_of
from outbox._events import AgentEvent
from outbox._files import open_append, open_regular, replace
from outbox._read import deep, read

log = logging.getLogger("outbox.pi")

PI_COMMAND = ("pi", "--mode", "rpc")
LINE_LIMIT = 256 * 1024 * 1024  # a longer line from pi is skipped and logged
START_TIMEOUT = 60.0  # pi's first answer (get_state) after it is started
CLOSE_WAIT = 5.0  # for pi to exit at end of input before it is killed
ABORT_WAIT = 2.0  # for an aborted turn's final events before end of input (quit)
# pi's own session choices (its -c and -r too, left out: a wrapper's "bash -c" is not one)
_SESSION_FLAGS = {"--session", "--no-session", "--continue", "--resume", "--fork"}
_ID_CHARS = re.compile(r"[^A-Za-z0-9._:-]")
_HOST_OWNED = ("id", "role", "turnId", "status", "capped")
_PAGER = ("revisionRootId", "revisionCount", "activeRevision")
_SCRATCH = ("partialArgs", "streamIndex")  # on tool call blocks mid-stream
_COMPLETE = ("stop", "length", "toolUse")
_ENC = msgspec.json.Encoder()
_DEC = msgspec.json.Decoder()


class PiError(Exception):
    """Raised when pi cannot be started or does not answer."""


class Unreadable:
    """A line pi printed that cannot be read (``why``, with its start), in its place."""

    def __init__(self, why: str) -> None:
        self.why = why


# -- ids --------------------------------------------------------------------------------


def message_id(turn_id: str, name: str) -> str:
    """``<turn_id>:<name>`` as a host id; a longer one keeps its start and a digest."""
    raw = f"{turn_id}:{name}"
    if len(raw) <= 128:
        return raw
    return f"{raw[:95]}.{hashlib.sha256(raw.encode()).hexdigest()[:32]}"


def tool_name(call_id: object) -> str:
    """A tool call id as part of a host id: characters outside the pattern mapped to ``_``.

    A mapped id gets a digest of the original, so two ids that map alike stay apart.
    """
    text = call_id if isinstance(call_id, str) else ""
    mapped = _ID_CHARS.sub("_", text)
    if mapped == text and text:
        return text
    return f"{mapped[:64]}.{hashlib.sha256(text.encode()).hexdigest()[:12]}"


# -- one turn's events -------------------------------------------------------------------


def _blocks(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    return [
        {k: v for k, v in b.items() if k not in _SCRATCH} if isinstance(b, dict) else b
        for b in content
    ]


def _fields(message: Mapping[str, Any]) -> dict[str, Any]:
    """pi's fields of a message, host-owned ones left out, scratch dropped from content."""
    out = {k: v for k, v in message.items() if k not in _HOST_OWNED and k not in _PAGER}
    if "content" in out:
        out["content"] = _blocks(out["content"])
    return out


def status_of(stop_reason: object) -> str:
    """The row status for pi's ``stopReason``."""
    if stop_reason in ("aborted", "error"):
        return str(stop_reason)
    return "complete"


class PiTurn:
    """One turn's pi events in, the driver's events out; no I/O (see the module docstring).

    ``feed`` takes each line pi prints and returns the driver events it makes. When it
    sets ``barrier`` the caller sends a ``get_state`` and stores its id in ``barrier_id``.
    ``outcome`` is set once the turn has ended.
    """

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.prompt_id: str | None = None
        self.barrier_id: str | None = None
        self.barrier = False
        self.stop_requested = False
        self.outcome: str | None = None
        self.error: str | None = None  # pi's own words when it refused the prompt
        self._assistants = 0
        self._current: str | None = None  # the assistant message streaming
        self._used: set[str] = set()
        self._last_stop: object = None  # stopReason of the last assistant row
        self._after_error = False  # agent_end after a failed reply: a retry may follow
        self._retrying = False  # pi retries (or compacts and retries) in this turn

    def feed(self, ev: Mapping[str, Any]) -> list[AgentEvent]:
        """The driver's events for one line pi printed."""
        if self.outcome is not None:
            return []
        kind = ev.get("type")
        if kind == "message_start":
            self._started(ev.get("message"))
        elif kind == "message_update":
            return self._update(ev.get("message"))
        elif kind == "message_end":
            return self._ended(ev.get("message"))
        elif kind == "agent_end":
            return self._agent_end()
        elif kind == "response":
            return self._response(ev)
        return self._lifecycle(kind, ev)

    def end(self, outcome: Literal["completed", "stopped", "error"]) -> list[AgentEvent]:
        """End the turn as ``outcome``; the driver's ``agent_end``."""
        self.outcome = outcome
        return [{"type": "agent_end", "reason": outcome}]

    def _new_id(self, name: str) -> str:
        mid, n = message_id(self.turn_id, name), 1
        while mid in self._used:  # a model that reuses a tool call id in one turn
            n += 1
            mid = message_id(self.turn_id, f"{name}:{n}")
        self._used.add(mid)
        return mid

    def _started(self, m: Any) -> None:
        if isinstance(m, dict) and m.get("role") == "assistant":
            self._current = self._new_id(f"a{self._assistants}")
            self._assistants += 1

    def _update(self, m: Any) -> list[AgentEvent]:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            return []
        if self._current is None:  # no message_start seen: name it now
            self._started(m)
        assert self._current is not None
        fields = _fields(m)
        fields.pop("stopReason", None)  # pi's initial "stop" until the stream ends
        snapshot = {"id": self._current, "role": "assistant", **fields}
        return [{"type": "message_update", "message": snapshot}]

    def _ended(self, m: Any) -> list[AgentEvent]:
        if not isinstance(m, dict):
            return []
        role = m.get("role")
        if role == "assistant":
            if self._current is None:
                self._started(m)
            assert self._current is not None
            mid, self._current = self._current, None
            self._last_stop = m.get("stopReason")
            row = {"id": mid, "role": "assistant", **_fields(m)}
            row["status"] = status_of(self._last_stop)
        elif role == "toolResult":
            mid = self._new_id(f"tool:{tool_name(m.get('toolCallId'))}")
            row = {"id": mid, "role": "tool", **_fields(m), "status": "complete"}
        else:  # the echoed prompt (beginTurn stored it), or a role the host has no place for
            if role != "user":
                log.warning("pi: a %r message of turn %s is not stored", role, self.turn_id)
            return []
        return [{"type": "message_end", "message": row}]

    def _agent_end(self) -> list[AgentEvent]:
        self._retrying = False
        if self._last_stop == "error":  # pi may retry: ask, and wait for its answer
            self._after_error = True
            self.barrier = True
            return []
        if self._last_stop == "aborted" or (
            self.stop_requested and self._last_stop not in ("stop", "length")
        ):
            return self.end("stopped")
        return self.end("completed" if self._last_stop in _COMPLETE else "error")

    def _failed(self) -> list[AgentEvent]:
        return self.end("stopped" if self.stop_requested else "error")

    def _response(self, ev: Mapping[str, Any]) -> list[AgentEvent]:
        rid = ev.get("id")
        if rid is not None and rid == self.prompt_id and ev.get("success") is False:
            self.error = str(ev.get("error"))
            log.error("pi refused the prompt of turn %s: %s", self.turn_id, self.error)
            return self.end("error")
        if rid is not None and rid == self.barrier_id and self._after_error:
            return self._failed()  # no retry came before the answer
        return []

    def _lifecycle(self, kind: object, ev: Mapping[str, Any]) -> list[AgentEvent]:
        """Retries: pi's ``auto_retry_*``, and ``compaction_*`` after a context overflow."""
        if kind == "auto_retry_start" or (
            kind == "compaction_start" and ev.get("reason") == "overflow"
        ):
            if self._after_error:
                self._after_error, self._retrying = False, True
        elif kind == "agent_start":
            self._after_error = self._retrying = False
        gave_up = (kind == "auto_retry_end" and ev.get("success") is False) or (
            kind == "compaction_end" and not ev.get("willRetry")
        )
        if gave_up and (self._retrying or self._after_error):  # or it was aborted meanwhile
            return self._failed()
        return []


# -- pi's session file -------------------------------------------------------------------


def to_pi_message(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """A stored row as a pi ``AgentMessage``; ``None`` for one pi has no place for."""
    role = row.get("role")
    m = _fields(row)
    m.setdefault("timestamp", 0)
    if role == "user":
        return {"role": "user", **m}
    if role == "tool":
        if not isinstance(row.get("toolCallId"), str):
            return None
        m.setdefault("toolName", "")
        m.setdefault("isError", False)
        return {"role": "toolResult", **m}
    if role != "assistant":
        return None
    if isinstance(m.get("content"), str):
        m["content"] = [{"type": "text", "text": m["content"]}]
    status = row.get("status", "complete")
    m.setdefault("stopReason", status if status in ("aborted", "error") else "stop")
    m.setdefault("api", "")
    m.setdefault("provider", "")
    m.setdefault("model", "")
    zero = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}
    m.setdefault("usage", {**zero, "totalTokens": 0, "cost": {**zero, "total": 0}})
    return {"role": "assistant", **m}


def session_lines(rows: Sequence[Mapping[str, Any]], cwd: str) -> bytes:
    """A pi session file (format version 3) holding ``rows`` as its one branch."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    header = {"type": "session", "version": 3, "id": str(uuid.uuid4()), "timestamp": now}
    lines = [_ENC.encode({**header, "cwd": cwd})]
    parent: str | None = None
    for n, message in enumerate(filter(None, map(to_pi_message, rows))):
        entry_id = f"{n:08x}"
        entry = {"type": "message", "id": entry_id, "parentId": parent, "timestamp": now}
        lines.append(_ENC.encode({**entry, "message": message}))
        parent = entry_id
    return b"".join(line + b"\n" for line in lines)


def _write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data`` (0600): a new file renamed over it, never opened."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    replace(path, data)


# -- the process -------------------------------------------------------------------------


class PiProcess:
    """One running pi: commands written to its stdin, every line it prints in a queue."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: asyncio.Queue[dict[str, Any] | Unreadable | None] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], stderr_path: str | None
    ) -> PiProcess:
        """Start ``argv`` with pipes; its stderr appended to ``stderr_path`` (a file: a link
        or FIFO planted there is moved aside)."""
        err = open_append(stderr_path) if stderr_path else None
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err if err else asyncio.subprocess.DEVNULL,
                cwd=cwd,
                env=dict(env),
                limit=LINE_LIMIT,
                start_new_session=True,  # Ctrl-C reaches the app, which aborts; not pi
            )
        except OSError as exc:
            raise PiError(f"cannot start pi ({' '.join(argv[:1])}): {exc}") from None
        finally:
            if err is not None:
                os.close(err)
        return cls(proc)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self._reader.done()

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        try:
            while True:
                try:
                    line = await stdout.readuntil(b"\n")
                except asyncio.IncompleteReadError as exc:
                    if exc.partial.strip():
                        log.warning("pi: a last line without its newline ignored")
                    break
                except asyncio.LimitOverrunError:
                    await _skip_line(stdout)
                    self._unreadable(f"a line over {LINE_LIMIT} bytes")
                    continue
                self._parse(line)
        except (ConnectionError, OSError) as exc:
            log.warning("pi: its output could not be read: %s", exc)
        finally:
            self.lines.put_nowait(None)

    def _parse(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            ev = deep(read, _DEC, line)
        except (msgspec.DecodeError, RecursionError) as exc:
            if line.lstrip().startswith(b"{"):  # one of pi's events, lost
                self._unreadable(f"{exc}: {len(line)} bytes, {line[:200]!r}")
                return
            ev = None
        if not isinstance(ev, dict):  # not an event of pi's: stray output
            log.warning("pi printed a line that is not one of its events: %r", line[:200])
            return
        self.lines.put_nowait(ev)

    def _unreadable(self, why: str) -> None:
        log.error("pi printed a line that cannot be read (%s)", why)  # an event of pi's
        self.lines.put_nowait(Unreadable(why))

    async def next(self) -> dict[str, Any] | Unreadable | None:
        """The next line pi printed (:class:`Unreadable` in the place of one that cannot be
        read); ``None`` once its output has ended."""
        ev = await self.lines.get()
        if ev is None:
            self.lines.put_nowait(None)  # every later call sees the end too
        return ev

    def send(self, command: dict[str, Any]) -> None:
        """Write one command line (a pi that is gone shows as the end of its output)."""
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            stdin.write(_ENC.encode(command) + b"\n")

    async def close(self, wait: float = CLOSE_WAIT) -> int:
        """End its input (pi exits 0), wait; SIGKILL only if it has not exited in time."""
        if self.proc.stdin is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.proc.stdin.close()
        try:
            async with asyncio.timeout(wait):
                code = await self.proc.wait()
        except TimeoutError:
            log.error(
                "pi (pid %d) did not exit within %.0f s of end of input: killed",
                self.proc.pid,
                wait,
            )
            self.kill()
            code = await self.proc.wait()
        try:  # a child of pi that kept its stdout open must not hold the app
            async with asyncio.timeout(1.0):
                await asyncio.shield(self._reader)
        except TimeoutError:
            self._reader.cancel()
        return code

    def kill(self) -> None:
        """SIGKILL pi (a crash drill, or one that would not exit)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)


async def _skip_line(stdout: asyncio.StreamReader) -> None:
    """Read past a line longer than LINE_LIMIT, holding at most LINE_LIMIT of it."""
    log.error("pi printed a line over %d bytes: skipped", LINE_LIMIT)
    while True:
        try:
            await stdout.readuntil(b"\n")  # the rest of the line: dropped
            return
        except asyncio.LimitOverrunError as exc:
            await stdout.readexactly(exc.consumed)  # what is buffered of it: dropped
        except asyncio.IncompleteReadError:
            return


# -- the runtime for one chat session ----------------------------------------------------


class PiAgent:
    """The agent runtime of one chat session: its pi process, started with its history.

    ``start(history)`` (whenever ``needs_start``), then ``events(turn_id, text)`` for each
    turn, whose events go to ``TurnDriver.run``. ``stop()`` is the user's Stop, ``forget()``
    follows a host-side cut, ``close()`` is quit, ``kill()`` a crash drill.
    """

    def __init__(
        self,
        session_file: str,
        *,
        command: Sequence[str] = PI_COMMAND,
        workdir: str,
        env: Mapping[str, str] | None = None,
        stderr_path: str | None = None,
    ) -> None:
        if _SESSION_FLAGS.intersection(command):
            raise PiError(
                "the pi command must not choose pi's session (--session, --no-session,"
                " --continue, --resume, --fork): the runtime gives pi the host's history"
            )
        self.command = list(command)
        self.session_file = session_file
        self.workdir = workdir
        self.env = dict(os.environ if env is None else env)
        self.stderr_path = stderr_path
        self.model: str | None = None  # what pi said it runs, once started
        self.refused: str | None = None  # pi's words when it refused the last prompt
        self.streaming: dict[str, Any] = {}  # the reply streaming, for a live view
        self._proc: PiProcess | None = None
        self._stale = False
        self._turn: PiTurn | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._ids = itertools.count(1)

    @property
    def needs_start(self) -> bool:
        """Whether the next turn needs ``start``: never started, gone, or cut (stale)."""
        return self._stale or self._proc is None or not self._proc.alive

    async def start(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Start a new pi holding ``history`` (stored rows, oldest first), closing the old.

        Raises :class:`PiError` when pi does not start, answer, or has no model.
        """
        await self._close_process()
        data = session_lines(history, self.workdir)
        await asyncio.to_thread(_write_atomic, self.session_file, data)
        os.makedirs(self.workdir, mode=0o700, exist_ok=True)
        argv = [*self.command, "--session", self.session_file]
        self._proc = await PiProcess.start(
            argv, cwd=self.workdir, env=self.env, stderr_path=self.stderr_path
        )
        self._stale = False
        try:
            state = await self._request("get_state", START_TIMEOUT)
            model = state.get("model") if isinstance(state, dict) else None
            if not isinstance(model, dict):
                raise PiError("pi has no model to run: configure one (README: pi as the agent)")
        except BaseException:
            await self._close_process()
            raise
        self.model = f"{model.get('provider')}/{model.get('id')}"

    def forget(self) -> None:
        """The host cut this session's transcript: the next turn starts pi from the kept."""
        self._stale = True

    async def events(self, turn_id: str, text: str) -> AsyncIterator[AgentEvent]:
        """Send ``text`` as the prompt of ``turn_id``; yield the driver's events."""
        proc = self._proc
        if proc is None or self._stale:  # (one that died since shows as a crash)
            raise PiError("pi is not started for this turn: call start() first")
        turn = self._turn = PiTurn(turn_id)
        self._idle.clear()
        self.streaming = {}
        self.refused = None
        try:
            turn.prompt_id = self._send("prompt", message=text)
            while turn.outcome is None:
                ev = await proc.next()
                if ev is None:  # pi is gone mid-turn: no agent_end, the driver's crash
                    log.warning("pi's output ended in turn %s: crashed", turn_id)
                    return
                out = self._lost(turn, ev) if isinstance(ev, Unreadable) else self._feed(turn, ev)
                if turn.outcome is not None:
                    self._finish(turn)
                for e in out:
                    yield e
        finally:
            self._finish(turn)

    def _feed(self, turn: PiTurn, ev: dict[str, Any]) -> list[AgentEvent]:
        out = turn.feed(ev)
        if turn.barrier:
            turn.barrier = False
            turn.barrier_id = self._send("get_state")
        kind = ev.get("type")
        if turn.stop_requested and turn.outcome is None and kind in _ABORT_AGAIN:
            self._send("abort")  # a Stop that raced pi's start of a run, or a retry's
        for e in out:
            if e["type"] == "message_update":
                self.streaming = e["message"]  # its text is counted when the view asks
        return out

    def _lost(self, turn: PiTurn, ev: Unreadable) -> list[AgentEvent]:
        """End the turn ``error`` at a line that cannot be read (a row, or agent_end)."""
        log.error(
            "pi: turn %s ends as an error: a line of it cannot be read, so a row of it may be"
            " lost (%s); pi is aborted, and the next turn starts a new one from the host's"
            " transcript",
            turn.turn_id,
            ev.why,
        )
        self._send("abort")
        self._stale = True  # pi holds what the host does not
        return turn.end("error")

    def _finish(self, turn: PiTurn) -> None:
        if self._turn is turn:
            self.refused = turn.error
            self._turn = None
            self._idle.set()
            if turn.outcome is None:  # left mid-run (or pi died): pi's state is unknown
                self._stale = True

    def stop(self) -> None:
        """The user's Stop: pi's ``abort``; pi ends the reply ``aborted`` and the turn."""
        turn = self._turn
        if turn is None or turn.outcome is not None:
            return
        turn.stop_requested = True
        self._send("abort")

    def view(self) -> str:
        """How much text the reply streaming has, for a live view."""
        return f"{len(text_of(self.streaming)):5d}ch"

    def kill(self) -> None:
        """SIGKILL pi (a crash drill); its turn ends as a crash, the next starts a new pi."""
        if self._proc is not None:
            self._proc.kill()

    async def messages(self) -> list[dict[str, Any]]:
        """pi's own copy of the conversation (``get_messages``), between turns."""
        data = await self._request("get_messages", START_TIMEOUT)
        msgs = data.get("messages") if isinstance(data, dict) else None
        return list(msgs) if isinstance(msgs, list) else []

    async def close(self, wait: float = ABORT_WAIT) -> None:
        """Quit: abort a running turn and wait (bounded) for it, then end pi's input."""
        if self._turn is not None:
            self.stop()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._idle.wait()
        await self._close_process()

    async def _close_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            code = await proc.close()
            log.info("pi (pid %d) exited with status %s", proc.proc.pid, code)

    def _send(self, kind: str, **fields: Any) -> str:
        rid = f"hostcore-{next(self._ids)}"
        if self._proc is not None:
            self._proc.send({"id": rid, "type": kind, **fields})
        return rid

    async def _request(self, kind: str, timeout: float) -> Any:
        """Send a command and return its ``data``; only while no turn is running."""
        proc = self._proc
        if proc is None or self._turn is not None:
            raise PiError(f"pi cannot answer {kind} now")
        rid = self._send(kind)
        try:
            async with asyncio.timeout(timeout):
                while (ev := await proc.next()) is not None:
                    if isinstance(ev, Unreadable):  # (logged) not its answer: that is a dict
                        continue
                    if ev.get("type") == "response" and ev.get("id") == rid:
                        if ev.get("success") is False:
                            raise PiError(f"pi refused {kind}: {ev.get('error')}")
                        return ev.get("data")
        except TimeoutError:
            raise PiError(f"pi did not answer {kind} within {timeout:.0f} s") from None
        raise PiError(f"pi exited before it answered {kind}{_tail(self.stderr_path)}")


_ABORT_AGAIN = ("agent_start", "auto_retry_start", "message_start")


def _tail(path: str | None, size: int = 600) -> str:
    """The end of pi's stderr log, for an error message."""
    if not path:
        return ""
    try:
        fd = open_regular(path)  # never blocked by a FIFO (NotRegularFile: an OSError)
    except OSError:
        return ""
    try:
        end = os.fstat(fd).st_size
        text = os.pread(fd, size, max(0, end - size)).decode(errors="replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)
    return f"; its stderr ends: {text}" if text else ""
