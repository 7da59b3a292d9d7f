"""Command line: ``python -m hostview inspect|export``, read-only looks at a data dir."""

from __future__ import annotations

import argparse
import os
import sys

from host._platform import EXIT_UNSUPPORTED, unsupported


def main(argv: list[str] | None = None) -> int:
    """Run the read-only tools' command line; return the exit code."""
    if (reason := unsupported()) is not None:  # Windows: say so, not an ImportError
        print(f"python -m hostview: {reason}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    from host.__main__ import add_busy_timeout, add_log_options, log_to_stderr
    from host._errors import HostError
    from host._index import BUSY_TIMEOUT
    from hostview._export import export
    from hostview._inspect import inspect

    parser = argparse.ArgumentParser(prog="python -m hostview", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("inspect", help="show sessions, or one session's turns and messages")
    ins.add_argument("--data-dir", required=True)
    ins.add_argument("session", nargs="?")
    ins.add_argument("--limit", type=_count, default=50, help="messages per page")
    ins.add_argument("--before", type=_count, help="page of lines before this one")
    ins.add_argument("--json", action="store_true")
    add_busy_timeout(ins, BUSY_TIMEOUT)
    exp = sub.add_parser("export", help="write a session out as JSONL or Markdown")
    exp.add_argument("--data-dir", required=True)
    exp.add_argument("session")
    exp.add_argument("--format", choices=["jsonl", "markdown"], default="jsonl")
    exp.add_argument("--with-revisions", action="store_true")
    for p in (ins, exp):
        add_log_options(p)
    args = parser.parse_args(argv)
    log_to_stderr(args.log_level, args.log_format)
    try:
        if args.command == "inspect":
            return inspect(
                args.data_dir,
                args.session,
                limit=args.limit,
                before=args.before,
                as_json=args.json,
                busy_timeout=args.busy_timeout,
            )
        return export(
            args.data_dir, args.session, fmt=args.format, with_revisions=args.with_revisions
        )
    except HostError as exc:
        print(f"{parser.prog} {args.command}: {exc.message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
        return 1


def _count(text: str) -> int:
    """A command-line count: a whole number, 0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, not {text!r}")
    return int(text)


if __name__ == "__main__":
    sys.exit(main())
