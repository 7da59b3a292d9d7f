"""``python -m host inspect`` and ``python -m host export``: read-only looks at a data dir.

Both open the index read-only (``mode=ro``: SQLite's WAL lets a reader in beside a live
host) and read the files with plain ``open``; they take no lock and write nothing, so
they can run on the data dir of a running host without disturbing it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from host._archive import Archive
from host._fs import FileSystem, read_whole
from host._layout import Layout, check_id
from host._messages import parse_stored


class Inspector:
    """What a data dir holds, read without touching it."""

    def __init__(self, data_dir: str) -> None:
        self.layout = Layout(data_dir)
        if not os.path.isdir(self.layout.sessions):
            raise SystemExit(f"no hostcore data dir at {self.layout.root}")
        uri = f"file:{self.layout.index}?mode=ro"
        self.db = sqlite3.connect(uri, uri=True)
        self.archive = Archive(self.layout, FileSystem())

    def close(self) -> None:
        self.db.close()

    def sessions(self) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT s.session_id, s.title, s.line_count, s.byte_size, s.updated_at,"
            " (SELECT turn_id FROM turns t WHERE t.session_id = s.session_id"
            "  AND t.status = 'running') FROM sessions s ORDER BY s.updated_at DESC"
        ).fetchall()
        out = []
        for sid, title, count, size, updated, running in rows:
            out.append(
                {
                    "sessionId": sid,
                    "title": title,
                    "messages": count,
                    "bytes": size,
                    "runningTurn": running,
                    "checkpoint": os.path.exists(self.layout.inflight(sid)),
                    "revisions": sum(r for _, r in self.roots(sid)),
                    "lastWrite": updated,
                    "quarantined": _count_lines(self.layout.quarantine(sid)),
                }
            )
        return out

    def roots(self, sid: str) -> list[tuple[str, int]]:
        """``(rootId, archived revisions)`` of every pager root with an archive."""
        base = self.layout.revisions(sid)
        if not os.path.isdir(base):
            return []
        return [(root, len(self.archive.load(sid, root))) for root in sorted(os.listdir(base))]

    def turns(self, sid: str) -> list[tuple[str, str, str, str | None]]:
        return self.db.execute(
            "SELECT turn_id, status, started_at, ended_at FROM turns WHERE session_id = ?"
            " ORDER BY started_at",
            (sid,),
        ).fetchall()

    def messages(self, sid: str, start: int, end: int) -> Iterator[tuple[int, dict[str, Any], int]]:
        """Yield ``(line, message, bytes)`` for lines ``[start, end)``."""
        rows = self.db.execute(
            "SELECT line, offset, length FROM messages WHERE session_id = ? AND line >= ?"
            " AND line < ? ORDER BY line",
            (sid, start, end),
        ).fetchall()
        with open(self.layout.transcript(sid), "rb") as f:
            for line, offset, length in rows:
                f.seek(offset)
                raw = f.read(length)
                try:
                    yield line, json.loads(raw), length
                except ValueError:
                    yield line, {"id": "?", "role": "?", "content": "<unreadable line>"}, length

    def stored_lines(self, sid: str) -> tuple[list[bytes], int]:
        """The transcript's whole lines that are messages, and how many lines are not.

        A last line without its newline is a write in progress or torn by a crash: it is
        no message either.
        """
        lines: list[bytes] = []
        skipped = 0
        with open(self.layout.transcript(sid), "rb") as f:
            for raw in f:
                line = raw.removesuffix(b"\n")
                if line != raw and parse_stored(line) is not None:
                    lines.append(line)
                else:
                    skipped += 1
        return lines, skipped

    def count(self, sid: str) -> int:
        row = self.db.execute(
            "SELECT line_count FROM sessions WHERE session_id = ?", (sid,)
        ).fetchone()
        if row is None:
            raise SystemExit(f"no session {sid!r} in {self.layout.root}")
        return int(row[0])

    def checkpoint(self, sid: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(read_whole(self.layout.inflight(sid))))
        except FileNotFoundError:
            return None
        except ValueError:
            return {"error": "unreadable checkpoint file"}


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def text_of(message: dict[str, Any]) -> str:
    """The text a message shows: string content, or its text blocks joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                parts.append(str(block.get("text") or f"[{block.get('type', 'block')}]"))
        return " ".join(parts)
    return "" if content is None else json.dumps(content)


def _first_line(message: dict[str, Any], width: int = 60) -> str:
    text = text_of(message).strip().splitlines()
    first = text[0] if text else ""
    return first if len(first) <= width else first[: width - 1] + "…"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
        if n == 0:
            print("  ".join("-" * w for w in widths), file=out)


def inspect(
    data_dir: str,
    session_id: str | None,
    *,
    limit: int = 50,
    before: int | None = None,
    as_json: bool = False,
    out: TextIO = sys.stdout,
) -> int:
    """Print what the data dir holds (one session in detail when given)."""
    ins = Inspector(data_dir)
    try:
        if session_id is None:
            sessions = ins.sessions()
            if as_json:
                print(json.dumps(sessions, indent=2), file=out)
                return 0
            rows = [
                ["session", "title", "msgs", "bytes", "running turn", "ckpt", "revs", "last write"]
            ]
            for s in sessions:
                rows.append(
                    [
                        s["sessionId"],
                        (s["title"] or "")[:30],
                        str(s["messages"]),
                        str(s["bytes"]),
                        s["runningTurn"] or "-",
                        "yes" if s["checkpoint"] else "-",
                        str(s["revisions"]),
                        s["lastWrite"],
                    ]
                )
            _table(rows, out)
            print(f"\n{len(sessions)} session(s) in {ins.layout.root}", file=out)
            return 0
        sid = check_id(session_id, "sessionId")
        total = ins.count(sid)
        end = total if before is None else min(before, total)
        start = max(0, end - limit)
        detail: dict[str, Any] = {
            "sessionId": sid,
            "totalLines": total,
            "turns": [
                {"turnId": t, "status": st, "startedAt": a, "endedAt": b}
                for t, st, a, b in ins.turns(sid)
            ],
            "messages": [
                {
                    "line": line,
                    "id": m.get("id"),
                    "role": m.get("role"),
                    "turnId": m.get("turnId"),
                    "status": m.get("status", "complete"),
                    "bytes": size,
                    "text": _first_line(m),
                    **{k: m[k] for k in ("revisionCount", "activeRevision") if k in m},
                }
                for line, m, size in ins.messages(sid, start, end)
            ],
            "roots": [{"rootId": r, "revisions": n} for r, n in ins.roots(sid)],
            "checkpoint": ins.checkpoint(sid),
            "quarantinedLines": _count_lines(ins.layout.quarantine(sid)),
        }
        if as_json:
            print(json.dumps(detail, indent=2), file=out)
            return 0
        print(f"session {sid}: {total} message(s)\n\nturns", file=out)
        trows = [["turn", "status", "started", "ended"]]
        trows += [
            [t["turnId"], t["status"], t["startedAt"], t["endedAt"] or "-"] for t in detail["turns"]
        ]
        _table(trows, out)
        print(f"\nmessages {start}-{end} of {total} (--limit/--before to page)", file=out)
        mrows = [["line", "id", "role", "turn", "status", "bytes", "text"]]
        for m in detail["messages"]:
            mrows.append(
                [
                    str(m["line"]),
                    str(m["id"]),
                    str(m["role"]),
                    str(m["turnId"] or "-"),
                    str(m["status"]),
                    str(m["bytes"]),
                    str(m["text"]),
                ]
            )
        _table(mrows, out)
        if detail["roots"]:
            print("\npager roots", file=out)
            for r in detail["roots"]:
                print(f"  {r['rootId']}: {r['revisions']} archived revision(s)", file=out)
        cp = detail["checkpoint"]
        if cp:
            msg = cp.get("message") or {}
            print(
                f"\ncheckpoint: message {cp.get('messageId')} of turn {cp.get('turnId')},"
                f" saved {cp.get('savedAt')}, {len(text_of(msg))} chars: {_first_line(msg)}",
                file=out,
            )
        else:
            print("\ncheckpoint: none", file=out)
        if detail["quarantinedLines"]:
            print(
                f"quarantined: {detail['quarantinedLines']} line(s) in"
                f" {ins.layout.quarantine(sid)}",
                file=out,
            )
        return 0
    finally:
        ins.close()


def export(
    data_dir: str,
    session_id: str,
    *,
    fmt: str = "jsonl",
    with_revisions: bool = False,
    out: TextIO = sys.stdout,
) -> int:
    """Write a session's transcript (and archived branches) as JSONL or Markdown.

    It reads the transcript itself, the truth, not the index, which may lag it by a batch
    (a crash before the batch commit: the next start indexes those lines). JSONL is each
    stored line verbatim, numbers and key order as they were written. A line that is no
    message (the host quarantines it at its next start) and a torn last line are left out,
    and counted on stderr.
    """
    ins = Inspector(data_dir)
    try:
        sid = check_id(session_id, "sessionId")
        try:
            lines, skipped = ins.stored_lines(sid)
        except FileNotFoundError:
            raise SystemExit(f"no session {sid!r} in {ins.layout.root}") from None
        if skipped:
            print(f"export: {skipped} line(s) of {sid} are no message: left out", file=sys.stderr)
        revisions: dict[str, list[list[bytes]]] = {}
        if with_revisions:
            for root, _n in ins.roots(sid):
                revisions[root] = [
                    ins.archive.read(sid, root, r) for r in ins.archive.load(sid, root)
                ]
        if fmt == "jsonl":
            for line in lines:
                print(line.decode(), file=out)
            for root, revs in revisions.items():
                for n, branch in enumerate(revs):
                    for line in branch:
                        head = json.dumps({"revisionOf": root, "revision": n})[:-1]
                        print(f'{head}, "message": {line.decode()}}}', file=out)
            return 0
        exported = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        print(f"# Session {sid}\n\n_{len(lines)} message(s), exported {exported}_\n", file=out)
        for m in map(json.loads, lines):
            status = m.get("status", "complete")
            tag = "" if status == "complete" else f" ({status})"
            print(f"## {m.get('role')}{tag} · `{m.get('id')}`\n\n{text_of(m)}\n", file=out)
            for n, branch in enumerate(revisions.get(str(m.get("id")), [])):
                print(f"> **revision {n}** of the reply to `{m.get('id')}`\n>", file=out)
                for b in map(json.loads, branch):
                    for text in text_of(b).splitlines() or [""]:
                        print(f"> {text}", file=out)
                print(file=out)
        return 0
    finally:
        ins.close()


__all__ = ["export", "inspect"]
