#!/usr/bin/env python3
"""The share of connection-cap refusals whose line a client reads (issue 36, case 8).

Past its connection cap the host answers one ``LIMIT_EXCEEDED`` line and closes. A
client that writes its handshake at once (every client does: Node's ``net.Socket`` on
``connect``) lost that line when the host closed without reading it: Node got ``EPIPE``
and dropped the connection unread, Python a reset instead of end of file.

This starts a real ``python -m host serve --socket`` on a fresh data dir in a temporary
folder, under a small descriptor limit (``--nofile``: a small cap), fills the cap with
handshaken connections, then makes ``--count`` connections past it, ``--parallel`` at a
time. Each writes a handshake line as soon as it is connected and reads until the end.
It prints, per client (``node`` when on the PATH, and ``python``), how many refusals the
host counted (``connections.refused``), the share whose line was read, the share that
then read a clean end of file, and how the others ended. ``--busy N`` runs N busy
processes beside it (killed at the end). ``--tree DIR`` runs the host from another
checkout (``git archive COMMIT | tar -x -C DIR``) to measure the code before a change.

Loopback only (a Unix socket in a temporary folder); every wait is bounded (``--timeout``
per connection, ``--deadline`` in all). Nothing is asserted: STYLE.md rule 10.
``tests/e2e/test_connections.py`` asserts that every refusal is read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.pressure import Client, Host  # noqa: E402

HANDSHAKE = b'{"jsonrpc":"2.0","id":1,"method":"handshake","params":{"protocolVersion":11}}\n'
MAX_COUNT = 100_000

NODE_CLIENT = r"""
// argv: socket path, count, parallel, timeout (ms). Prints {outcome: count} as JSON.
const net = require("net");
const [path, count, parallel, timeout] = process.argv.slice(1);
const hs = '{"jsonrpc":"2.0","id":1,"method":"handshake","params":{"protocolVersion":11}}\n';
const out = {};
let started = 0, done = 0;
function one() {
  if (started >= +count) return;
  started++;
  const s = net.createConnection(path);
  let data = "", err = null, eof = false;
  const timer = setTimeout(() => { err = err || "TIMEOUT"; s.destroy(); }, +timeout);
  s.on("connect", () => s.write(hs));
  s.on("data", (d) => { data += d; });
  s.on("end", () => { eof = true; });
  s.on("error", (e) => { err = err || e.code || String(e); });
  s.on("close", () => {
    clearTimeout(timer);
    const key = outcome(data.includes('"LIMIT_EXCEEDED"'), eof, err);
    out[key] = (out[key] || 0) + 1;
    if (++done === +count) console.log(JSON.stringify(out));
    else one();
  });
}
function outcome(line, eof, err) {
  const end = err ? err : eof ? "eof" : "closed";
  return (line ? "line+" : "noline+") + end;
}
for (let i = 0; i < +parallel; i++) one();
"""


def node_refusals(path: Path, count: int, parallel: int, timeout: float) -> Counter[str]:
    """Run ``count`` Node ``net.Socket`` clients; return how each ended."""
    node = shutil.which("node")
    assert node is not None, "node is not on the PATH"
    args = [node, "-e", NODE_CLIENT, str(path), str(count), str(parallel), str(int(timeout * 1e3))]
    done = subprocess.run(args, capture_output=True, timeout=timeout * count + 30, check=True)
    return Counter(json.loads(done.stdout))


def python_refusal(path: Path, timeout: float) -> str:
    """One blocking socket client: connect, write the handshake at once, read to the end."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    data, end = b"", "eof"
    try:
        s.connect(str(path))
        try:
            s.sendall(HANDSHAKE)
        except OSError as exc:  # EPIPE: the host closed first; what it sent may be there
            end = errno.errorcode.get(exc.errno or 0, "?")
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        end = "TIMEOUT"
    except OSError as exc:
        end = errno.errorcode.get(exc.errno or 0, "?") if end == "eof" else end
    finally:
        s.close()
    return ("line+" if b'"LIMIT_EXCEEDED"' in data else "noline+") + end


def python_refusals(path: Path, count: int, parallel: int, timeout: float) -> Counter[str]:
    """Run ``count`` Python socket clients, ``parallel`` at a time; return how each ended."""
    with ThreadPoolExecutor(parallel) as pool:
        return Counter(pool.map(lambda _: python_refusal(path, timeout), range(count)))


async def fill_cap(host: Host, bound: int = 4096) -> tuple[Client, list[Client]]:
    """Handshaken connections up to the host's cap: a worker (for ``host.stats``), the rest."""
    worker = await Client.connect(host.sock)
    await worker.handshake()
    held: list[Client] = []
    for _ in range(bound):
        c = await Client.connect(host.sock)
        try:
            await c.handshake()
        except Exception:  # the first refused: the cap is full
            c.writer.close()
            return worker, held
        held.append(c)
    raise RuntimeError(f"no refusal after {bound} connections")


async def refused(worker: Client) -> int:
    stats = await worker.call("host.stats")
    return int(stats["counters"].get("connections.refused", 0))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    tree = Path(args.tree).resolve() if args.tree else REPO
    folder = Path(tempfile.mkdtemp(prefix="cap-refusals-"))
    report: dict[str, Any] = {"count": args.count, "parallel": args.parallel, "busy": args.busy}
    try:
        async with asyncio.timeout(args.deadline):
            host = await Host.start(
                tree, folder, nofile=args.nofile, args=["--handshake-timeout", "3600"]
            )
            try:
                worker, held = await fill_cap(host)
                report["cap"] = len(held) + 1
                clients = ["python"] + (["node"] if shutil.which("node") else [])
                for name in [c for c in clients if c in args.clients]:
                    run = node_refusals if name == "node" else python_refusals
                    before = await refused(worker)
                    t0 = time.perf_counter()
                    ends = await asyncio.to_thread(
                        run, host.sock, args.count, args.parallel, args.timeout
                    )
                    took = time.perf_counter() - t0
                    n = await refused(worker) - before
                    read = sum(v for k, v in ends.items() if k.startswith("line+"))
                    report[name] = {
                        "refused": n,
                        "lineRead": read,
                        "share": round(read / n, 4) if n else None,
                        "lineThenEof": ends.get("line+eof", 0),
                        "ends": dict(sorted(ends.items())),
                        "seconds": round(took, 2),
                    }
            finally:
                await host.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    """Measure, print one JSON report; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500, help="refusals per client (<= 100000)")
    parser.add_argument("--parallel", type=int, default=8, help="connections at once")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per connection")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds in all")
    parser.add_argument(
        "--nofile", type=int, default=256, help="the host's descriptor limit (256: a cap of 96)"
    )
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside it")
    parser.add_argument("--clients", default="python,node", help="node, python or both")
    parser.add_argument("--tree", help="run the host from this checkout")
    args = parser.parse_args(argv)
    if not 1 <= args.count <= MAX_COUNT or not 1 <= args.parallel <= 64:
        parser.error(f"--count is 1 to {MAX_COUNT}, --parallel 1 to 64")
    args.clients = args.clients.split(",")
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    try:
        with contextlib.suppress(KeyboardInterrupt):
            print(json.dumps(asyncio.run(measure(args)), indent=2))
    finally:
        for p in busy:  # only the processes started here, by their own handle
            p.kill()
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
