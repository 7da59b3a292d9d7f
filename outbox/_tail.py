"""``python -m host watch --socket PATH SESSION``: follow a session in a terminal, like ``tail -f``.

It connects to a host serving a Unix socket (``serve --socket``, or ``--also-socket`` beside
stdio, as ``make run`` does), prints the session's last lines, then every change as the
host applies it: lines as they are stored, turns beginning and ending, the reply in flight
token by token (``live`` data) and at each checkpoint. When the host goes away it waits for
it to come back and resumes from where it was (a cursor: nothing shown twice, nothing
missed); after a rewrite (a regenerate, an edit) it says so and shows the lines again.
Ctrl-C prints the cursor to resume from (``--after``). ``--json`` prints each event as
one JSON object a line instead, with its cursor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from typing import Any, TextIO

from outbox._client import ClientError, HostClient
from outbox._driver import text_of
from outbox._watch import reconnect_to

LAST = 10  # lines of a snapshot shown, as tail shows 10


class Printer:
    """Events as lines of text; ``live`` text runs on one line until something else comes."""

    def __init__(self, out: TextIO, *, as_json: bool, width: int = 100) -> None:
        self.out = out
        self.as_json = as_json
        self.width = width
        self.streaming = False

    def _line(self, text: str) -> None:
        if self.streaming:
            self.out.write("\n")
            self.streaming = False
        self.out.write(text + "\n")
        self.out.flush()

    def _short(self, text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= self.width else text[: self.width - 1] + "…"

    def show(self, ev: dict[str, Any]) -> None:
        if self.as_json:
            self._line(json.dumps(ev))
            return
        kind = ev["kind"]
        if kind == "snapshot":
            lines = ev["messages"]
            if len(lines) > LAST:
                self._line(f"… {len(lines) - LAST} earlier line(s)")
            for n, m in enumerate(lines[-LAST:], max(0, len(lines) - LAST)):
                self._line(self._message(n, m))
        elif kind == "appended":
            self._line(self._message(ev["line"], ev["message"]))
        elif kind == "turn":
            state = "begins" if ev["status"] == "running" else ev["status"]
            self._line(f"-- turn {ev['turnId']} {state}")
        elif kind == "checkpoint":
            words = text_of(ev["message"])
            self._line(f"   (in flight, saved) {self._short(words)}")
        elif kind == "live":
            self._live(ev["data"])
        elif kind == "deleted":
            self._line("-- the session was deleted")

    def _live(self, data: Any) -> None:
        text = data.get("delta") if isinstance(data, dict) else data
        if not isinstance(text, str):
            return
        if not self.streaming:
            self.out.write("   > ")
            self.streaming = True
        self.out.write(text.replace("\n", " "))
        self.out.flush()

    def _message(self, n: int, m: dict[str, Any]) -> str:
        status = m.get("status", "complete")
        return f"[{n}] {m.get('role')}/{status}: {self._short(text_of(m))}"

    def resets(self, n: int) -> None:
        if not self.as_json:
            self._line(f"-- the transcript was rewritten ({n}): its lines again")


async def tail(
    socket_path: str, session_id: str, after: str | None, out: TextIO, *, as_json: bool
) -> int:
    """Follow ``session_id`` until Ctrl-C or its deletion; return the exit code."""
    try:
        client = await HostClient.connect(socket_path)
        await client.handshake()
    except (OSError, ClientError) as exc:
        print(f"watch: no host on {socket_path}: {exc}", file=sys.stderr)
        return 2
    printer = Printer(out, as_json=as_json)
    watch = client.watch(
        session_id, after=after, reconnect=reconnect_to(socket_path, client.deadline, None)
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopping = loop.create_task(stop.wait())
    resets = 0
    code = 0
    shown = after  # the cursor after the last event shown: a reset's re-read may be half done
    try:
        while True:
            step = loop.create_task(anext(watch))
            await asyncio.wait({step, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, ClientError):
                    await step
                break
            try:
                ev = step.result()
            except StopAsyncIteration:
                break
            except ClientError as exc:  # refused, or the host not back within a deadline
                print(f"watch: {exc}", file=sys.stderr)
                code = 2
                break
            if watch.resets != resets:
                resets = watch.resets
                printer.resets(resets)
            printer.show(ev)
            shown = ev.get("cursor", shown)
    finally:
        stopping.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(ClientError):
            await watch.aclose()
        await client.close()
    if shown is not None and not as_json:
        print(f"\nresume with: --after {shown}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None, prog: str = "python -m host watch") -> int:
    """Run ``watch``; return the exit code."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the host's Unix socket")
    parser.add_argument("session", help="the session to follow")
    parser.add_argument("--after", help="resume after this cursor (printed at Ctrl-C)")
    parser.add_argument("--json", action="store_true", help="one JSON event a line")
    a = parser.parse_args(argv)
    return asyncio.run(tail(a.socket, a.session, a.after, sys.stdout, as_json=a.json))
