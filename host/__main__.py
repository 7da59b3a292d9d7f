"""Command line: ``python -m host serve|verify``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the host command line; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m host", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the protocol on stdio or a Unix socket")
    serve.add_argument("--data-dir", required=True)
    serve.add_argument("--socket", help="serve any number of connections on this Unix socket")
    verify = sub.add_parser("verify", help="check every transcript against the index")
    verify.add_argument("--data-dir", required=True)
    verify.add_argument("--repair", action="store_true", help="rebuild the index from files")
    for p in (serve, verify):
        p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.umask(0o077)  # files 0600, folders 0700, whatever the caller's umask
    if args.command == "serve":
        from host._server import serve as run

        return asyncio.run(run(args.data_dir, args.socket))
    from host._verify import verify as check

    return asyncio.run(check(args.data_dir, repair=args.repair))


if __name__ == "__main__":
    sys.exit(main())
