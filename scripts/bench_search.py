"""Search and list benchmark (issue 35): a generated corpus, indexed by the host itself.

Writes transcripts of English, CJK and code messages into a data dir, opens a ``Host`` on
it (the start indexes every line; the search index is then built from nothing, as for a
data dir from before search), and prints: the build's time, the search index's size
against the text it indexes, search p95 for rare and common terms (limit 20), CJK
results against a brute-force scan on 20 queries, and the first ``session.list`` page
at ``--list-sessions`` sessions. Not a timed test (house rule 10): it prints figures.

    python scripts/bench_search.py                 # 10,000 sessions, 1,000,000 messages
    python scripts/bench_search.py --sessions 1000 --messages 100000   # a tenth
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from host._search import texts
from host._service import Host
from host._wire import ListParams, SearchParams

WORDS = (  # noqa: SIM905 (a paragraph reads better than 110 quoted words)
    "the of and to in is you that it he was for on are as with his they at be this have"
    " from or one had by word but not what all were we when your can said there use an"
    " each which she do how their if will up other about out many then them these so some"
    " her would make like him into time has look two more write go see number no way could"
    " people my than first water been call who oil its now find long down day did get come"
    " made may part harbour lighthouse algorithm database kernel syntax compiler orchard"
    " violin glacier"
).split()
WEIGHTS = [1 / (i + 1) for i in range(len(WORDS))]  # Zipf: "the" is the most common
CJK = (
    "東京都大阪日本語中文汉字学习电脑手机天气今天明天朋友工作时间问题我们你们他们"
    "的一是不了人在有这个上们来到时大地为子中你说生国年着就那和要她出也得里后自以会"
    "ひらがなカタカナの に は を た が で て と し れ さ 한국어텍스트 사 람 이 가"
).replace(" ", "")
CODE = [
    "def handler(request):\n    return Response(status=200)",
    "for (let i = 0; i < items.length; i++) { total += items[i].price; }",
    "SELECT id, name FROM users WHERE created_at > ? ORDER BY name;",
    'fn main() { println!("{}", args.len()); }',
]


def _text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.6:
        return " ".join(rng.choices(WORDS, weights=WEIGHTS, k=rng.randint(8, 60)))
    if r < 0.85:
        return "".join(rng.choices(CJK, k=rng.randint(8, 80)))
    return rng.choice(CODE) + f" # {rng.randint(0, 10**6)}"


def write_corpus(data: Path, sessions: int, messages: int, seed: int = 7) -> int:
    """Transcripts as the host stores them; return the bytes (UTF-8) of text they hold."""
    rng = random.Random(seed)
    (data / "sessions").mkdir(parents=True, exist_ok=True)
    per = max(1, messages // sessions)
    text_bytes = 0
    for s in range(sessions):
        lines = []
        for m in range(per):
            text = _text(rng)
            text_bytes += len(text.encode())
            role = "user" if m % 2 == 0 else "assistant"
            lines.append(json.dumps({"id": f"m{m}", "role": role, "content": text}))
        (data / "sessions" / f"s{s:06d}.jsonl").write_text("\n".join(lines) + "\n")
        meta = {"title": f"chat {s}", "createdAt": f"2026-01-01T00:00:00.{s % 1000:03d}Z"}
        (data / "sessions" / f"s{s:06d}.meta.json").write_text(json.dumps(meta))
    return text_bytes


def _p95(samples: list[float]) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * 0.95))] * 1000


async def _all_hits(host: Host, query: str, **params: object) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    cursor: object = None
    while True:
        extra = {"cursor": cursor} if isinstance(cursor, str) else {}
        r = await host.search.search(SearchParams(query=query, limit=100, **params, **extra))
        found |= {(h.session_id, h.message_id) for h in r.hits}
        cursor = r.cursor
        if not isinstance(cursor, str):
            return found


async def search_figures(args: argparse.Namespace, data: Path) -> None:
    t0 = time.perf_counter()
    text_bytes = write_corpus(data, args.sessions, args.messages)
    print(
        f"corpus: {args.sessions:,} sessions, {args.messages:,} messages,"
        f" {text_bytes / 1e6:.1f} MB of message text (UTF-8), written in"
        f" {time.perf_counter() - t0:.1f} s"
    )
    t0 = time.perf_counter()
    async with Host.open(str(data)) as host:
        t_rows = time.perf_counter() - t0
        t1 = time.perf_counter()
        while not await host.search.work():  # waits for the background build, then checks
            pass
        t_build = time.perf_counter() - t1
        print(
            f"start (rows indexed): {t_rows:.1f} s; search index built from nothing in"
            f" {t_build:.1f} s ({args.messages / t_build:,.0f} messages/s, 'optimize' included)"
        )
        con = sqlite3.connect(data / "index.sqlite3")
        size = dict(
            con.execute(
                "SELECT name, sum(pgsize) FROM dbstat WHERE name LIKE 'search%' GROUP BY name"
            ).fetchall()
        )
        con.close()
        fts = sum(v for k, v in size.items() if k.startswith(("search_text", "search_tools")))
        total = sum(size.values())
        print(
            f"search index: {total / 1e6:.1f} MB = {total / text_bytes:.2f}x the text"
            f" (full-text tables {fts / 1e6:.1f} MB = {fts / text_bytes:.2f}x, the rest"
            f" search_docs and its index); by table: "
            + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(size.items()))
        )

        lines: dict[tuple[str, str], str] = {}
        for path in sorted((data / "sessions").glob("*.jsonl")):
            for raw in path.read_bytes().splitlines():
                if got := texts(raw):
                    lines[(path.stem, got[0])] = got[2]
        rare = next(t for t in lines.values() if "println" in t).split()[-1]  # its number
        for label, q in (
            ("rare term", rare),
            ("rare words", "glacier violin"),
            ("rare term", "println"),
            ("rare CJK", "東京都"),
            ("most common term", "the"),
            ("most common CJK", "的"),
            ("common words", "of the"),
        ):
            took = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                r = await host.search.search(SearchParams(query=q, limit=20))
                took.append(time.perf_counter() - t)
            print(
                f"search p95, {label} {q!r}: {_p95(took):.1f} ms ({len(r.hits)} hits,"
                f" {r.candidates} candidates ranked, limit 20)"
            )

        rng = random.Random(3)
        cjk_texts = [(k, t) for k, t in lines.items() if t and t[0] in CJK]
        agree, notes = 0, []
        for i in range(20):
            (sid, _), t = rng.choice(cjk_texts)
            if i < 10:  # 3 or 4 characters, across every session
                n = 3 + i % 2
                at = rng.randrange(max(1, len(t) - n))
                q, scope = t[at : at + n], {}
            else:  # 1 or 2 characters, within one session (its most recent 2,000 matches)
                q, scope = t[: 1 + i % 2], {"session_id": sid}
            want = {k for k, v in lines.items() if q in v and k[0] == scope.get("session_id", k[0])}
            found = await _all_hits(host, q, **scope)
            agree += found == want
            notes.append(f"{q}:{len(want)}{'' if found == want else '!=' + str(len(found))}")
        print(f"CJK: {agree}/20 queries equal to a brute-force scan ({' '.join(notes)})")

        t0, during = time.perf_counter(), []  # a compaction, searched all along
        compacting = asyncio.create_task(host.search.compact())
        while not compacting.done():
            t = time.perf_counter()
            r = await host.search.search(SearchParams(query="the", limit=20))
            during.append(time.perf_counter() - t)
            assert not r.partial and len(r.hits) == 20, r
            await asyncio.sleep(0.05)
        await compacting
        print(
            f"compaction (the full-text tables made again beside the searched ones, then"
            f" swapped in): {time.perf_counter() - t0:.1f} s; {len(during)} searches for"
            f" 'the' meanwhile, all whole, p95 {_p95(during):.1f} ms"
        )


async def list_figures(args: argparse.Namespace, data: Path) -> None:
    (data / "sessions").mkdir(parents=True)
    for s in range(args.list_sessions):
        line = json.dumps({"id": "m0", "role": "user", "content": "hello"})
        (data / "sessions" / f"l{s:06d}.jsonl").write_text(line + "\n")
        meta = {"title": "t" * 100, "createdAt": f"2026-01-01T00:00:{s % 60:02d}.000Z"}
        (data / "sessions" / f"l{s:06d}.meta.json").write_text(json.dumps(meta))
    t0 = time.perf_counter()
    async with Host.open(str(data)) as host:
        print(f"list: {args.list_sessions:,} sessions started in {time.perf_counter() - t0:.1f} s")
        for order in ("updated", "created"):
            for pinned_first in (False, True):
                took = []
                for _ in range(50):
                    t = time.perf_counter()
                    page = await host.organise.list_sessions(
                        ListParams(limit=30, order=order, pinned_first=pinned_first)
                    )
                    took.append(time.perf_counter() - t)
                assert len(page.sessions) == 30
                print(
                    f"session.list first page (30), order {order}, pinnedFirst {pinned_first}:"
                    f" p95 {_p95(took):.2f} ms"
                )


async def run(args: argparse.Namespace) -> None:
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-search-"))
    try:
        if args.sessions:
            await search_figures(args, root / "search")
        if args.list_sessions:
            await list_figures(args, root / "list")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--list-sessions", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=40, help="searches timed per query")
    p.add_argument("--keep", help="make the data dirs in this new folder, and keep them")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
