#!/usr/bin/env python3
"""The CPU of a lone append, in-process, on tmpfs (docs/performance.md).

A real host on a fresh data dir under ``--dir`` (``/dev/shm``: an fsync costs nothing
there, so what is left is the host's own work), fed as a transport feeds it: each request
line handed to the connection's ``LineReader`` from a callback of the loop's, outside any
task, its answer awaited before the next is sent. Durable writes stay on the loop
(``FsyncPolicy.SLOW`` infinite), so no timing decides the path measured. Prints the loop
thread's CPU per append (``time.thread_time``): the median and the least of ``--rounds``.

To compare two trees, run each with ``PYTHONPATH=<tree>``, interleaved; for a count that
a busy machine does not blur, run it under ``valgrind --tool=callgrind`` with two
``--calls`` and take the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence

import msgspec

from host import Host
from host._framing import LineReader
from host._server import connect, tune_gc

_ENCODE = msgspec.json.Encoder().encode


class _Edge:
    """The writer edge: hands each whole answer line to the future waiting for it."""

    def __init__(self) -> None:
        self.waiting: asyncio.Future[bytes] | None = None
        self.buf = b""

    def write(self, data: bytes) -> None:
        self.buf += data
        if self.buf.endswith(b"\n") and self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(self.buf)
            self.buf = b""

    async def drain(self) -> None:
        pass


def _line(rid: int, method: str, params: dict[str, object]) -> bytes:
    return _ENCODE({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + b"\n"


async def measure(folder: str, rounds: int, calls: int, warm: int) -> list[float]:
    """Microseconds of loop-thread CPU per lone append, one figure per round."""
    async with Host.open(os.path.join(folder, "data")) as host:
        lines, edge = LineReader(), _Edge()
        connect(host, lines, edge)
        loop = asyncio.get_running_loop()

        async def call(data: bytes) -> bytes:
            edge.waiting = loop.create_future()
            loop.call_soon(lines.data_received, data)  # as a transport: from the loop
            return await edge.waiting

        await call(_line(0, "handshake", {"protocolVersion": 11}))
        await call(_line(0, "session.create", {"sessionId": "s"}))
        # the registry (the store before it: the same script measures an older tree)
        registry = host.registry if hasattr(host, "registry") else host.store
        registry.fsyncs.SLOW = math.inf
        tune_gc()
        n = 0

        def append() -> bytes:
            nonlocal n
            n += 1
            message = {"id": f"m{n}", "role": "user", "content": "x" * 1000}
            return _line(n, "session.appendMessage", {"sessionId": "s", "message": message})

        for _ in range(warm):
            answer = await call(append())
        if warm:
            assert b'"appended":true' in answer, answer
        figures = []
        for _ in range(rounds):
            batch = [append() for _ in range(calls)]
            t0 = time.thread_time()
            for data in batch:
                await call(data)
            figures.append((time.thread_time() - t0) / calls * 1e6)
        lines.eof_received()
        return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/dev/shm", help="where the data dir goes (tmpfs)")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=1000, help="appends per round")
    parser.add_argument("--warm", type=int, default=500, help="appends before the rounds")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(dir=args.dir, prefix="cpu-append-")
    try:
        run = measure(folder, args.rounds, args.calls, args.warm)
        if args.loop == "uvloop":
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                figures = runner.run(run)
        else:
            figures = asyncio.run(run)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"lone append, {args.loop}: {statistics.median(figures):.1f} us of loop CPU per call"
        f" (median of {len(figures)} rounds of {args.calls}; least {min(figures):.1f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
