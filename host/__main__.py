"""Command line: ``python -m host serve|verify|watch``.

The read-only looks at a data dir are a package of their own: ``python -m hostview
inspect|export``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from host._platform import EXIT_UNSUPPORTED, unsupported

MOVED = ("inspect", "export")
"""Commands that moved to ``python -m hostview``: named as such, not an invalid choice."""


def main(argv: list[str] | None = None) -> int:
    """Run the host command line; return the exit code."""
    if (reason := unsupported()) is not None:  # Windows: say so, not an ImportError
        print(f"python -m host: {reason}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    command = (sys.argv[1:] if argv is None else argv)[:1]
    if command and command[0] in MOVED:
        print(
            f"python -m host {command[0]}: moved to `python -m hostview {command[0]}`"
            " (same options)",
            file=sys.stderr,
        )
        return 2
    if command == ["watch"]:  # a client of a running host: outbox's (issue 34)
        from outbox._tail import main as watch

        return _printing(lambda: watch((sys.argv[1:] if argv is None else argv)[1:]))
    from host._index import BUSY_TIMEOUT
    from host._limits import HANDSHAKE_TIMEOUT

    parser = argparse.ArgumentParser(prog="python -m host", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the protocol on stdio or a Unix socket")
    serve.add_argument("--data-dir", required=True)
    serve.add_argument("--socket", help="serve any number of connections on this Unix socket")
    serve.add_argument(
        "--also-socket",
        metavar="PATH",
        help="serve stdio and, beside it, any number of connections on this Unix socket"
        " (for watchers: python -m host watch); the host exits when stdin ends",
    )
    serve.add_argument(
        "--handshake-timeout",
        type=float,
        default=HANDSHAKE_TIMEOUT,
        metavar="SECONDS",
        help="with --socket: close a connection that has not handshaken within this long",
    )
    serve.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "uvloop", "asyncio"],
        help="event loop: auto is uvloop when installed (make bench measures both)",
    )
    sub.add_parser("watch", help="follow a session live on a host's socket, like tail -f")
    verify = sub.add_parser("verify", help="check every transcript against the index")
    verify.add_argument("--data-dir", required=True)
    verify.add_argument(
        "--repair",
        action="store_true",
        help="first run the recovery a start runs, every transcript rescanned",
    )
    find = sub.add_parser("search", help="search every session's messages (issue 35)")
    find.add_argument("data_dir", metavar="DIR")
    find.add_argument("query", metavar="QUERY")
    find.add_argument("--limit", type=int, default=20, choices=range(1, 101), metavar="1-100")
    find.add_argument("--session", help="only this session's messages")
    find.add_argument("--all", action="store_true", help="archived revisions too")
    add_log_options(find)
    for p in (serve, verify):
        add_busy_timeout(p, BUSY_TIMEOUT)
        add_log_options(p)
    args = parser.parse_args(argv)
    log_to_stderr(args.log_level, args.log_format)
    os.umask(0o077)  # files 0600, folders 0700, whatever the caller's umask
    if args.command == "serve":
        from host._server import serve as run

        return run_loop(
            run(
                args.data_dir,
                args.socket,
                args.busy_timeout,
                args.handshake_timeout,
                also_socket=args.also_socket,
            ),
            args.loop,
        )
    if args.command == "search":
        from host._search import search_command

        return _printing(
            lambda: search_command(
                args.data_dir, args.query, limit=args.limit, session_id=args.session, scope=args.all
            )
        )
    from host._verify import verify as check

    return asyncio.run(check(args.data_dir, repair=args.repair, busy_timeout=args.busy_timeout))


def _printing(run: Callable[[], int]) -> int:
    """Run a command that prints for a person: a reader that stops early (``| head``) ends
    it quietly, as ``tail`` and ``grep`` end."""
    try:
        return run()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush
        return 1


def add_busy_timeout(parser: argparse.ArgumentParser, default: float) -> None:
    """``--busy-timeout``: how long to wait for another program's lock on the index."""
    parser.add_argument(
        "--busy-timeout",
        type=seconds,
        default=default,
        metavar="SECONDS",
        help="how long to wait for another program's lock on the index (default %(default)s)",
    )


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``: what goes to stderr, and how."""
    levels = ["debug", "info", "warning", "error"]
    parser.add_argument("--log-level", default="info", choices=levels)
    parser.add_argument("--log-format", default="text", choices=["text", "json"])


def log_to_stderr(level: str, fmt: str) -> None:
    """Send the log to stderr, as text lines or one JSON object a line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])


def seconds(text: str) -> float:
    """A command-line duration: a number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, not {text!r}")
    return value


def run_loop(main: Coroutine[Any, Any, int], loop: str = "auto") -> int:
    """Run ``main`` on uvloop (when installed, unless ``loop`` says asyncio) or asyncio.

    uvloop halves the cost of waking the loop from a thread (the fsync of every append
    group) and of pipe I/O; ``make bench`` prints append_one on both loops.
    """
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    return asyncio.run(main)


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message, and any extras."""

    _SKIP = set(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in self._SKIP})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


if __name__ == "__main__":
    sys.exit(main())
