"""The ``make demo`` job: drive a real host through a short scripted conversation.

It plays the app's part by hand, one request at a time, so that every exchange can be
seen (``make run`` drives the real producer side, ``outbox/``): it starts
``python -m host serve --data-dir DIR`` as a real subprocess on real pipes, handshakes,
writes a two-turn conversation, updates a reply, replays an append the way an at-least-once
outbox would, pages through the transcript, sends a bad request, shuts the host down,
starts it again to show that everything persisted, runs ``python -m host verify`` and
prints what was stored. Each run uses a fresh session id, so running it twice on the same
data dir is fine (the second run lists the first one's session too). Exit status 0 when
every step answered as the protocol says, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

PROTOCOL_VERSION = 11
TIMEOUT = 30.0  # seconds to wait for any one answer
WIDTH = 48  # column of the "<-" answers


class DemoError(Exception):
    """Raised when the host answers something other than what the protocol says."""


class RpcError(Exception):
    """An error object answered by the host."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.code: int = error.get("code", 0)
        self.name: str = (error.get("data") or {}).get("code", "?")


def expect(ok: bool, what: str) -> None:
    """Fail the demo with ``what`` unless ``ok``."""
    if not ok:
        raise DemoError(what)


class Host:
    """One ``python -m host serve`` subprocess on stdin/stdout pipes."""

    def __init__(self, data_dir: Path, log: IO[bytes], verbose: bool) -> None:
        self.verbose = verbose
        self.next_id = 0
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "host", "serve", "--data-dir", str(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, line: bytes) -> None:
        """Write one protocol line to the host."""
        assert self.proc.stdin is not None
        if self.verbose:
            print(f"      wire -> {line.decode(errors='replace')[:200]}")
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        """Read the next answer line."""
        try:
            line = self.lines.get(timeout=TIMEOUT)
        except queue.Empty:
            raise DemoError(f"no answer from the host within {TIMEOUT:.0f} s") from None
        if line is None:
            raise DemoError(f"the host closed its stdout (exit status {self.proc.wait()})")
        if self.verbose:
            print(f"      wire <- {line.decode(errors='replace').rstrip()[:200]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send one request and return its result, or raise ``RpcError``."""
        self.next_id += 1
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            request["params"] = params
        self.send(json.dumps(request, separators=(",", ":"), ensure_ascii=False).encode())
        answer = self.receive()
        expect(answer.get("id") == self.next_id, f"answer for id {answer.get('id')!r}")
        if "error" in answer:
            raise RpcError(answer["error"])
        return answer["result"]

    def refused(self, method: str, params: dict[str, Any] | None, name: str) -> RpcError:
        """Send a request that must fail with the error ``name``; return that error."""
        try:
            result = self.call(method, params)
        except RpcError as exc:
            expect(exc.name == name, f"{method}: expected {name}, got {exc.name}")
            return exc
        raise DemoError(f"{method}: expected {name}, got result {result!r}")

    def wait(self) -> int:
        """Close stdin and wait for the process to exit; return its status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise DemoError("the host did not exit after host.shutdown") from None

    def kill(self) -> None:
        """Stop the process if it is still running (after a failure)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def show(request: str, answer: str) -> None:
    """Print one exchange as ``-> request   <- answer``."""
    print(f"   -> {request:<{WIDTH}} <- {answer}")


def message(mid: str, role: str, content: str) -> dict[str, Any]:
    """Return a chat message as the app would send it."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"id": mid, "role": role, "content": content, "createdAt": now}


def preview(value: Any, width: int = 60) -> str:
    """Return a one-line preview of a message's content."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def handshake(host: Host) -> None:
    result = host.call(
        "handshake", {"protocolVersion": PROTOCOL_VERSION, "client": {"name": "demo"}}
    )
    expect(result["protocolVersion"] == PROTOCOL_VERSION, "handshake: wrong protocol version")
    show(
        f"handshake protocolVersion={PROTOCOL_VERSION}",
        f"host {result['hostVersion']}, {len(result['methods'])} methods",
    )


def shutdown(host: Host) -> None:
    result = host.call("host.shutdown", {})
    expect(result == {"shuttingDown": True}, f"host.shutdown answered {result!r}")
    status = host.wait()
    expect(status == 0, f"the host exited with status {status}")
    show("host.shutdown", "shuttingDown, exit status 0")


def first_run(host: Host, sid: str) -> None:
    """Write the conversation, then show dedup, paging, a display cap and an error."""
    err = host.refused("session.list", None, "NOT_HANDSHAKEN")
    show("session.list (before the handshake)", f"{err.name} ({err.code}), as it must")
    handshake(host)

    result = host.call("session.create", {"sessionId": sid, "title": "hostcore demo"})
    expect(result == {"sessionId": sid, "created": True}, f"session.create answered {result!r}")
    show(f"session.create {sid}", "created")

    u1 = message("u1", "user", "What is hostcore for?")
    a1 = message(
        "a1",
        "assistant",
        "It keeps the transcripts of a desktop AI-agent chat app: every message it has"
        " acknowledged is on disk, whatever instant the app dies.",
    )
    for msg, turn, line in ((u1, "turn-1", 0), (a1, "turn-1", 1)):
        params = {"sessionId": sid, "message": msg, "turnId": turn}
        result = host.call("session.appendMessage", params)
        expect(result == {"line": line, "appended": True}, f"append {msg['id']}: {result!r}")
        show(f"appendMessage {msg['id']} {msg['role']:<9} turnId={turn}", f"line {line}, fsynced")

    u2 = message("u2", "user", "How can I tell that it is durable?")
    result = host.call("session.beginTurn", {"sessionId": sid, "turnId": "turn-2", "prompt": u2})
    expect(result == {"turnId": "turn-2", "line": 2}, f"session.beginTurn answered {result!r}")
    show("beginTurn turn-2 with prompt u2", "turn running, prompt at line 2")
    a2 = message("a2", "assistant", "Every answer to a write comes after an fsync.")
    params = {"sessionId": sid, "message": a2, "turnId": "turn-2"}
    result = host.call("session.appendMessage", params)
    expect(result == {"line": 3, "appended": True}, f"append a2: {result!r}")
    show("appendMessage a2 assistant turnId=turn-2", "line 3, fsynced")
    params = {"sessionId": sid, "turnId": "turn-2", "status": "completed"}
    result = host.call("session.endTurn", params)
    expect(result == {"status": "completed", "recovered": False}, f"endTurn: {result!r}")
    show("endTurn turn-2 completed", "completed")

    a2["content"] += " This demo restarts the host to show it."
    result = host.call("session.updateMessage", {"sessionId": sid, "message": a2})
    expect(result == {"line": 3}, f"session.updateMessage answered {result!r}")
    show("updateMessage a2 (longer reply)", "line 3 rewritten, others copied")

    params = {"sessionId": sid, "message": a1, "turnId": "turn-1"}
    result = host.call("session.appendMessage", params)
    expect(result == {"line": 1, "appended": False}, f"replayed append a1: {result!r}")
    show("appendMessage a1 again (outbox replay)", "appended: false, still line 1")

    page = host.call("session.get", {"sessionId": sid, "limit": 2})
    ids = [m["id"] for m in page["messages"]]
    expect(ids == ["u2", "a2"] and page["totalLines"] == 4, f"session.get limit 2: {page!r}")
    span = f"lines {page['startLine']}-{page['endLine']} of {page['totalLines']}"
    show("session.get limit=2", f"{span}: {', '.join(ids)}")
    page = host.call(
        "session.get", {"sessionId": sid, "limit": 2, "beforeLine": 2, "displayCap": 150}
    )
    ids = [m["id"] for m in page["messages"]]
    expect(ids == ["u1", "a1"], f"session.get beforeLine 2: {page!r}")
    capped = page["messages"][1]
    expect(capped.get("capped") is True, "session.get displayCap: a1 was not capped")
    show("session.get beforeLine=2 limit=2 displayCap=150", "lines 0-2, a1 capped to:")
    print(f"   {'':<{WIDTH + 3}}    {preview(capped['content'], 60)}")
    err = host.refused("session.updateMessage", {"sessionId": sid, "message": capped}, "CONFLICT")
    show("updateMessage with that capped copy", f"{err.name} ({err.code}), nothing written")

    err = host.refused("session.get", {"sessionId": "../etc"}, "INVALID_PARAMS")
    show('session.get sessionId="../etc"', f"{err.name} ({err.code}), no file touched")
    err = host.refused("session.rename", {"sessionId": sid}, "METHOD_NOT_FOUND")
    show("session.rename (no such method)", f"{err.name} ({err.code})")
    shutdown(host)


def second_run(host: Host, sid: str) -> list[dict[str, Any]]:
    """Check that everything persisted; return the stored messages."""
    handshake(host)
    sessions = host.call("session.list", {})["sessions"]
    mine = [s for s in sessions if s["sessionId"] == sid]
    expect(len(mine) == 1 and mine[0]["messageCount"] == 4, f"session.list: {sessions!r}")
    others = len(sessions) - 1
    more = f" (+{others} from earlier runs)" if others else ""
    show("session.list", f"{sid}: 4 messages{more}")
    page = host.call("session.get", {"sessionId": sid})
    stored: list[dict[str, Any]] = page["messages"]
    ids = [m["id"] for m in stored]
    expect(ids == ["u1", "a1", "u2", "a2"], f"session.get after restart: {ids!r}")
    expect(stored[3]["content"].endswith("to show it."), "the update of a2 did not persist")
    turns = [m.get("turnId") for m in stored]
    expect(turns == ["turn-1", "turn-1", "turn-2", "turn-2"], f"turnIds: {turns!r}")
    show("session.get", "4 messages, the update and every turnId kept")
    shutdown(host)
    return stored


def verify(data_dir: Path) -> None:
    """Run ``python -m host verify`` and show what it printed."""
    cmd = [sys.executable, "-m", "host", "verify", "--data-dir", str(data_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    for line in done.stdout.splitlines():
        print(f"   {line}")
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
    expect(done.returncode == 0, f"python -m host verify exited {done.returncode}")


def table(stored: list[dict[str, Any]]) -> None:
    """Print the stored messages as a small table."""
    rows = [("line", "id", "role", "turnId", "content")]
    for line, m in enumerate(stored):
        rows.append((str(line), m["id"], m["role"], m.get("turnId") or "", preview(m["content"])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for i, r in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(r[:4], widths, strict=True)]
        print("   " + "  ".join([*cells, r[4]]))
        if i == 0:
            print("   " + "  ".join("-" * w for w in [*widths, 7]))


def run(data_dir: Path, log: IO[bytes], verbose: bool) -> None:
    """Run every step of the demo; raise ``DemoError`` at the first surprise."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S-%f")
    sid = f"demo-{stamp}"
    serve = f"python -m host serve --data-dir {data_dir}"

    host = Host(data_dir, log, verbose)
    print(f"1. Start the host: {serve}  (pid {host.proc.pid}, stdin/stdout pipes)")
    try:
        first_run(host, sid)
    finally:
        host.kill()

    host = Host(data_dir, log, verbose)
    print(f"\n2. Start it again on the same data dir  (pid {host.proc.pid})")
    try:
        stored = second_run(host, sid)
    finally:
        host.kill()

    print(f"\n3. python -m host verify --data-dir {data_dir}")
    verify(data_dir)

    transcript = data_dir / "sessions" / f"{sid}.jsonl"
    size = transcript.stat().st_size
    print(f"\n4. What was stored in {transcript} ({size} bytes, one message a line):\n")
    table(stored)


def main(argv: list[str] | None = None) -> int:
    """Run the demo against ``--data-dir``; return 0 when every step behaved."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="the host's data dir")
    parser.add_argument("--verbose", action="store_true", help="show wire lines and host logs")
    args = parser.parse_args(argv)
    data_dir: Path = args.data_dir
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    print(f"hostcore demo: protocol v{PROTOCOL_VERSION}, data dir {data_dir}\n")
    with tempfile.TemporaryFile() as log:
        try:
            run(data_dir, log, args.verbose)
        except (DemoError, RpcError, OSError, ValueError, KeyError) as exc:
            print(f"\ndemo FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            log.seek(0)
            tail = log.read().decode(errors="replace").splitlines()[-20:]
            if tail:
                print("last lines of the host's log:", file=sys.stderr)
                for line in tail:
                    print(f"  {line}", file=sys.stderr)
            return 1
        if args.verbose:
            log.seek(0)
            print("\nhost log (stderr):")
            sys.stdout.write(log.read().decode(errors="replace"))
    print("\nOK: every step answered as docs/protocol.md says.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
