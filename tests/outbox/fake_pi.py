"""A stand-in for ``pi --mode rpc`` that prints a real capture of pi (tests/fixtures/pi-rpc).

    python tests/outbox/fake_pi.py --fixture tests/fixtures/pi-rpc/NAME [pi's args...]

It plays ``NAME.jsonl`` (pi's stdout, verbatim) in the order ``NAME.timeline.txt`` gives,
as fast as it can write, and behaves as pi did where the capture sent a command:

- before the lines a ``prompt`` or an ``abort`` caused, it waits until its caller sends
  one (the response carries the caller's id, as pi's does); commands the capture's own
  harness sent (``set_auto_retry``, ``get_messages``, ``get_state`` after the run) are not
  waited for, and their responses are printed as captured, under the capture's ids;
- where the capture sent SIGTERM, it exits 143 with nothing more printed: the stream
  simply stops, as pi's did;
- any other command gets pi's answer at once: ``get_state`` (a model, ``mock/mock-1``),
  ``get_messages`` (the session file it was started with, then the messages of the runs
  printed so far), ``abort`` (success), another ``prompt`` (refused: the capture is over);
- end of input makes it exit 0, as pi's ``shutdown()`` does, wherever it is.

``--session FILE`` is read as pi reads a session file; ``{session}`` in the fixture's path is
that file's name without ``.jsonl`` (``drive`` names it after the chat session), so one
``--pi-command`` can give each session of a run its own capture. When ``FAKE_PI_LOG`` names a file,
one JSON line is appended for its start (args and the history it loaded), each command it
read, and how it ended (``eof``, ``sigterm-capture`` or ``signal``), so a test can check
what pi was told.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

_STEP = re.compile(r"^\+\s*[\d.]+s ([<>]) (.*)$")


class FakePi:
    def __init__(self, fixture: Path, args: list[str]) -> None:
        self.args = args
        self.session = args[args.index("--session") + 1] if "--session" in args else None
        self.history = self._load(self.session)
        self.run_messages: list[Any] = []
        self.ids: dict[str, Any] = {}  # command type -> the id the caller sent it with
        lines = fixture.with_suffix(".jsonl").read_text().splitlines()
        self.steps: list[tuple[str, str]] = []
        for step in fixture.with_suffix(".timeline.txt").read_text().splitlines():
            m = _STEP.match(step)
            if m and m.group(1) == "<":
                self.steps.append(("out", lines.pop(0)))
            elif m:
                self.steps.append(("cmd", m.group(2)))
        assert not lines, "every captured line has its place in the timeline"

    @staticmethod
    def _load(path: str | None) -> list[Any]:
        if path is None or not os.path.exists(path):
            return []
        entries = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
        return [e["message"] for e in entries if e.get("type") == "message"]

    def log(self, **fact: Any) -> None:
        path = os.environ.get("FAKE_PI_LOG")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(fact) + "\n")

    def write(self, obj: Any, raw: str | None = None) -> None:
        sys.stdout.write((raw if raw is not None else json.dumps(obj)) + "\n")
        sys.stdout.flush()

    def read(self) -> dict[str, Any] | None:
        line = sys.stdin.readline()
        if not line:
            return None
        cmd: dict[str, Any] = json.loads(line)
        self.log(command=cmd)
        return cmd

    def end(self, how: str, code: int) -> None:
        self.log(end=how)
        sys.stdout.flush()
        os._exit(code)

    def answer(self, cmd: dict[str, Any]) -> None:
        kind, rid = cmd.get("type"), cmd.get("id")
        reply: dict[str, Any] = {"id": rid, "type": "response", "command": kind, "success": True}
        if kind == "get_state":
            model = {"id": "mock-1", "provider": "mock", "api": "openai-completions"}
            reply["data"] = {"model": model, "isStreaming": False, "sessionFile": self.session}
        elif kind == "get_messages":
            reply["data"] = {"messages": self.history + self.run_messages}
        elif kind == "prompt":
            reply.update(success=False, error="fake pi: the capture has no more runs")
        elif kind != "abort":
            reply.update(success=False, error=f"Unknown command: {kind}")
        self.write(reply)

    def wait_for(self, kind: str) -> None:
        while (cmd := self.read()) is not None:
            if cmd.get("type") == kind:
                self.ids[kind] = cmd.get("id")
                return
            self.answer(cmd)
        self.end("eof", 0)

    def play(self) -> None:
        self.log(start=self.args, history=self.history)
        for kind, text in self.steps:
            if kind == "out":
                try:
                    obj = json.loads(text)
                except RecursionError:  # deeper than Python's json goes (not Node's): as is
                    obj = {}
                if obj.get("type") == "response" and obj.get("command") in self.ids:
                    obj["id"] = self.ids.pop(obj["command"])
                    text = json.dumps(obj, separators=(",", ":"))
                if obj.get("type") == "agent_end":
                    self.run_messages += obj.get("messages", [])
                self.write(obj, text)
            elif text == "SIGTERM":
                self.end("sigterm-capture", 143)
            elif (cmd := json.loads(text)).get("type") in ("prompt", "abort"):
                self.wait_for(cmd["type"])
        while (cmd := self.read()) is not None:
            self.answer(cmd)
        self.end("eof", 0)


def main() -> None:
    args = sys.argv[1:]
    named = args[args.index("--fixture") + 1]
    rest = [a for a in args if a not in ("--fixture", named)]
    session = rest[rest.index("--session") + 1] if "--session" in rest else "none"
    fixture = Path(named.replace("{session}", Path(session).stem))
    fake = FakePi(fixture, rest)

    def on_signal(signum: int, _frame: Any) -> None:
        fake.end("signal", 128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    fake.play()


if __name__ == "__main__":
    main()
