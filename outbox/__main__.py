"""Command line: ``python -m outbox drive|watch``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from outbox._drive import Options, drive


def main(argv: list[str] | None = None) -> int:
    """Run the outbox command line; return the exit code."""
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["watch"]:
        from outbox._tail import main as watch

        return watch(args_in[1:], prog="python -m outbox watch")
    parser = argparse.ArgumentParser(prog="python -m outbox")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("watch", help="follow a session live on a host's socket, like tail -f")
    d = sub.add_parser("drive", help="run a workload of conversations against a host")
    d.add_argument("--data-dir", required=True)
    d.add_argument("--sessions", type=int, default=3)
    d.add_argument("--turns", type=int, help="per session (default: 4; 7 with --agent pi)")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--reply-seconds", type=float, default=2.0)
    d.add_argument("--json", action="store_true", help="one JSON fact per line on stdout")
    d.add_argument("--recover-only", action="store_true", help="connect sequence, then exit")
    d.add_argument("--log-level", default="warning")
    d.add_argument(
        "--watch-socket",
        metavar="PATH",
        help="the host also serves this socket, for watchers (default: DIR/host.sock;"
        " 'none' for none)",
    )
    d.add_argument(
        "--agent", choices=("sim", "pi"), default="sim", help="the simulated agent, or pi"
    )
    d.add_argument(
        "--pi-command",
        default="pi --mode rpc",
        help="how to start pi (split like a shell line); your pi settings pick the model",
    )
    a = parser.parse_args(argv)
    turns = a.turns if a.turns is not None else (7 if a.agent == "pi" else 4)
    logging.basicConfig(stream=sys.stderr, level=a.log_level.upper())
    os.umask(0o077)
    opts = Options(
        a.data_dir,
        a.sessions,
        turns,
        a.seed,
        a.reply_seconds,
        a.json,
        a.recover_only,
        agent=a.agent,
        pi_command=a.pi_command,
        watch_socket=a.watch_socket,
    )
    return asyncio.run(drive(opts))


if __name__ == "__main__":
    sys.exit(main())
