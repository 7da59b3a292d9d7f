"""Command line: ``python -m outbox drive``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from outbox._drive import Options, drive


def main(argv: list[str] | None = None) -> int:
    """Run the outbox command line; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m outbox")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("drive", help="run a workload of conversations against a host")
    d.add_argument("--data-dir", required=True)
    d.add_argument("--sessions", type=int, default=3)
    d.add_argument("--turns", type=int, default=4)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--reply-seconds", type=float, default=2.0)
    d.add_argument("--json", action="store_true", help="one JSON fact per line on stdout")
    d.add_argument("--recover-only", action="store_true", help="connect sequence, then exit")
    d.add_argument("--log-level", default="warning")
    a = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=a.log_level.upper())
    os.umask(0o077)
    opts = Options(a.data_dir, a.sessions, a.turns, a.seed, a.reply_seconds, a.json, a.recover_only)
    return asyncio.run(drive(opts))


if __name__ == "__main__":
    sys.exit(main())
