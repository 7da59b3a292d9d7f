"""``python -m host inspect`` and ``python -m host export``: read-only looks at a data dir.

``inspect`` opens the index read-only (``mode=ro``: SQLite's WAL lets a reader in beside a
live host); ``export`` reads only the files. They take no lock and write nothing, not
even what they find damaged (the host sets that aside at its next start), so they can
run on the data dir of a running host without disturbing it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO, TextIO

from host._archive import Archive, ArchiveDamaged, ManifestDamaged, Revision
from host._fs import FileSystem, NotRegularFile, open_regular, read_whole
from host._index import BUSY_TIMEOUT, IndexBusy, connect_read_only, index_problem
from host._layout import Layout, check_id
from host._messages import parse_stored


def note(text: str) -> None:
    """Say something on stderr that the output leaves out."""
    print(text, file=sys.stderr)


def open_file(path: str) -> BinaryIO:
    """Open a file of the data dir to read, refusing a symlink, a folder or a FIFO."""
    try:
        return os.fdopen(open_regular(path), "rb")
    except NotRegularFile:
        raise SystemExit(f"{path} is not a regular file: left alone") from None


class Inspector:
    """What a data dir holds, read without touching it."""

    def __init__(self, data_dir: str, busy_timeout: float = BUSY_TIMEOUT) -> None:
        self.layout = Layout(data_dir)
        self.busy_timeout = busy_timeout
        if not os.path.isdir(self.layout.sessions):
            raise SystemExit(f"no hostcore data dir at {self.layout.root}")
        self._db: sqlite3.Connection | None = None
        self.archive = Archive(self.layout, FileSystem())

    @property
    def db(self) -> sqlite3.Connection:
        """The index, read-only, opened at first use (export never needs it)."""
        if self._db is None:
            path = self.layout.index
            if not os.path.exists(path):
                raise SystemExit(f"no index at {path}: start the host, or run verify --repair")
            try:
                problem = index_problem(path, self.busy_timeout)
            except IndexBusy as exc:
                raise SystemExit(str(exc)) from None
            if problem is not None:
                raise SystemExit(f"index {path} is {problem}: run verify --repair")
            self._db = connect_read_only(path, self.busy_timeout)
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def transcript(self, sid: str) -> BinaryIO:
        try:
            return open_file(self.layout.transcript(sid))
        except FileNotFoundError:
            raise SystemExit(f"no session {sid!r} in {self.layout.root}") from None

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
                    "revisions": sum(len(revs) for revs in self.roots(sid).values()),
                    "lastWrite": updated,
                    "quarantined": _count_lines(self.layout.quarantine(sid)),
                }
            )
        return out

    def roots(self, sid: str) -> dict[str, list[Revision]]:
        """Every pager root with an archive, and its revisions, in order of rootId.

        Read only: a damaged manifest, or an entry that is no root (logged), is said on
        stderr and left where it is (the host sets a damaged manifest aside at its next use).
        """
        roots: dict[str, list[Revision]] = {}
        for name in self.archive.root_ids(sid):
            try:
                roots[name] = self.archive.manifest(sid, name)
            except ManifestDamaged as exc:
                note(f"{exc}: its revisions are left out")
        return roots

    def branch(self, sid: str, root: str, rev: Revision) -> list[bytes]:
        """One archived revision's lines; none, said on stderr, when its payload is bad."""
        try:
            return self.archive.read(sid, root, rev)
        except (ArchiveDamaged, OSError) as exc:
            reason = exc.message if isinstance(exc, ArchiveDamaged) else str(exc)
            note(f"revision {rev.revision} of root {root!r} of {sid} left out: {reason}")
            return []

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
        with self.transcript(sid) as f:
            for line, offset, length in rows:
                f.seek(offset)
                yield line, _message(f.read(length)), length

    def count(self, sid: str) -> int:
        row = self.db.execute(
            "SELECT line_count FROM sessions WHERE session_id = ?", (sid,)
        ).fetchone()
        if row is None:
            raise SystemExit(f"no session {sid!r} in {self.layout.root}")
        return int(row[0])

    def checkpoint(self, sid: str) -> dict[str, Any] | None:
        try:
            data = json.loads(read_whole(self.layout.inflight(sid)))
        except FileNotFoundError:
            return None
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("message", {}), dict):
            return {"error": "unreadable checkpoint file"}
        data.setdefault("messageId", data.get("message", {}).get("id"))  # older files name it
        return data


class StoredLines:
    """The lines of a transcript that are messages, one at a time; ``skipped`` counts the rest.

    A last line without its newline is a write in progress or torn by a crash: it is no
    message either. A transcript of any size takes no more memory than its longest line.
    """

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.skipped = 0

    def __iter__(self) -> Iterator[bytes]:
        for raw in self.f:
            line = raw.removesuffix(b"\n")
            if line != raw and parse_stored(line) is not None:
                yield line
            else:
                self.skipped += 1


_UNREADABLE = {"id": "?", "role": "?", "content": "<unreadable line>"}


def _message(raw: bytes) -> dict[str, Any]:
    """A stored line as a dict to show (a placeholder when it is none: a copy of its own)."""
    try:
        value = json.loads(raw)  # not msgspec: a number past 64 bits is still shown
    except (ValueError, RecursionError):
        return dict(_UNREADABLE)
    return value if isinstance(value, dict) else dict(_UNREADABLE)


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def text_of(message: dict[str, Any]) -> str:
    """The text a message shows: string content, or its text blocks joined.

    Half a surrogate pair (a reply cut mid-emoji, stored as sent) shows as U+FFFD: a
    terminal or a file takes no lone surrogate.
    """
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                parts.append(str(block.get("text") or f"[{block.get('type', 'block')}]"))
        text = " ".join(parts)
    else:
        text = "" if content is None else json.dumps(content)
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


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
    busy_timeout: float = BUSY_TIMEOUT,
) -> int:
    """Print what the data dir holds (one session in detail when given)."""
    ins = Inspector(data_dir, busy_timeout)
    try:
        if session_id is None:
            _show_sessions(ins, as_json, out)
        else:
            sid = check_id(session_id, "sessionId")
            _show_session(ins, sid, limit, before, as_json, out)
        return 0
    finally:
        ins.close()


def _show_sessions(ins: Inspector, as_json: bool, out: TextIO) -> None:
    """Every session of the data dir: a table, or JSON."""
    sessions = ins.sessions()
    if as_json:
        print(json.dumps(sessions, indent=2), file=out)
        return
    header = ["session", "title", "msgs", "bytes", "running turn", "ckpt", "revs", "last write"]
    _table([header, *map(_session_row, sessions)], out)
    print(f"\n{len(sessions)} session(s) in {ins.layout.root}", file=out)


def _session_row(s: dict[str, Any]) -> list[str]:
    return [
        s["sessionId"],
        (s["title"] or "")[:30],
        str(s["messages"]),
        str(s["bytes"]),
        s["runningTurn"] or "-",
        "yes" if s["checkpoint"] else "-",
        str(s["revisions"]),
        s["lastWrite"],
    ]


def _page(total: int, limit: int, before: int | None) -> tuple[int, int]:
    """The lines ``[start, end)`` to show: ``limit`` of them, ending at ``before`` or the last."""
    end = total if before is None else min(before, total)
    return max(0, end - limit), end


def _show_session(
    ins: Inspector, sid: str, limit: int, before: int | None, as_json: bool, out: TextIO
) -> None:
    """One session in detail (a page of its messages): as text, or JSON."""
    total = ins.count(sid)
    start, end = _page(total, limit, before)
    detail = _session_detail(ins, sid, total, start, end)
    if as_json:
        print(json.dumps(detail, indent=2), file=out)
        return
    print(f"session {sid}: {total} message(s)\n\nturns", file=out)
    turns = [_turn_row(t) for t in detail["turns"]]
    _table([["turn", "status", "started", "ended"], *turns], out)
    print(f"\nmessages {start}-{end} of {total} (--limit/--before to page)", file=out)
    messages = [_message_row(m) for m in detail["messages"]]
    _table([["line", "id", "role", "turn", "status", "bytes", "text"], *messages], out)
    _show_roots(detail["roots"], out)
    print(_checkpoint_text(detail["checkpoint"], ins.layout.inflight(sid)), file=out)
    if detail["quarantinedLines"]:
        print(
            f"quarantined: {detail['quarantinedLines']} line(s) in {ins.layout.quarantine(sid)}",
            file=out,
        )


def _session_detail(ins: Inspector, sid: str, total: int, start: int, end: int) -> dict[str, Any]:
    """What ``inspect --json`` shows of one session, messages ``[start, end)`` of it."""
    return {
        "sessionId": sid,
        "totalLines": total,
        "turns": [
            {"turnId": t, "status": st, "startedAt": a, "endedAt": b}
            for t, st, a, b in ins.turns(sid)
        ],
        "messages": [
            _message_entry(line, m, size) for line, m, size in ins.messages(sid, start, end)
        ],
        "roots": [{"rootId": r, "revisions": len(revs)} for r, revs in ins.roots(sid).items()],
        "checkpoint": ins.checkpoint(sid),
        "quarantinedLines": _count_lines(ins.layout.quarantine(sid)),
    }


def _message_entry(line: int, m: dict[str, Any], size: int) -> dict[str, Any]:
    return {
        "line": line,
        "id": m.get("id"),
        "role": m.get("role"),
        "turnId": m.get("turnId"),
        "status": m.get("status", "complete"),
        "bytes": size,
        "text": _first_line(m),
        **{k: m[k] for k in ("revisionCount", "activeRevision") if k in m},
    }


def _turn_row(t: dict[str, Any]) -> list[str]:
    return [t["turnId"], t["status"], t["startedAt"], t["endedAt"] or "-"]


def _message_row(m: dict[str, Any]) -> list[str]:
    return [
        str(m["line"]),
        str(m["id"]),
        str(m["role"]),
        str(m["turnId"] or "-"),
        str(m["status"]),
        str(m["bytes"]),
        str(m["text"]),
    ]


def _show_roots(roots: list[dict[str, Any]], out: TextIO) -> None:
    if roots:
        print("\npager roots", file=out)
        for r in roots:
            print(f"  {r['rootId']}: {r['revisions']} archived revision(s)", file=out)


def _checkpoint_text(cp: dict[str, Any] | None, path: str) -> str:
    """The checkpoint line of ``inspect SESSION``: none, unreadable, or what it holds."""
    if cp and "error" in cp:
        return f"\ncheckpoint: {cp['error']} {path}"
    if cp:
        msg = cp.get("message") or {}
        return (
            f"\ncheckpoint: message {cp.get('messageId')} of turn {cp.get('turnId')},"
            f" saved {cp.get('savedAt')}, {len(text_of(msg))} chars: {_first_line(msg)}"
        )
    return "\ncheckpoint: none"


def export(
    data_dir: str,
    session_id: str,
    *,
    fmt: str = "jsonl",
    with_revisions: bool = False,
    out: BinaryIO | None = None,
) -> int:
    """Write a session's transcript (and archived branches) as JSONL or Markdown.

    It reads the transcript itself, the truth, not the index, which may lag it by a batch
    (a crash before the batch commit: the next start indexes those lines) or be missing.
    JSONL is each stored line verbatim, bytes as they were written. A line that is no
    message (the host quarantines it at its next start) and a torn last line are left
    out, and counted on stderr; so is an archived revision that cannot be read. One line
    at a time: memory does not grow with the transcript.
    """
    out = out or sys.stdout.buffer
    ins = Inspector(data_dir)
    try:
        sid = check_id(session_id, "sessionId")
        with ins.transcript(sid) as f:
            roots = ins.roots(sid) if with_revisions else {}
            lines = StoredLines(f)
            write = _export_jsonl if fmt == "jsonl" else _export_markdown
            write(ins, sid, lines, roots, out)
        out.flush()
        if lines.skipped:
            note(f"export: {lines.skipped} line(s) of {sid} are no message: left out")
        return 0
    finally:
        ins.close()


def _export_jsonl(
    ins: Inspector, sid: str, lines: StoredLines, roots: dict[str, list[Revision]], out: BinaryIO
) -> None:
    """The stored lines verbatim, then each archived revision's lines tagged with its root."""
    for line in lines:
        out.write(line + b"\n")
    for root, revs in roots.items():
        for rev in revs:
            head = json.dumps({"revisionOf": root, "revision": rev.revision})[:-1]
            for line in ins.branch(sid, root, rev):
                out.write(b'%s, "message": %s}\n' % (head.encode(), line))


def _export_markdown(
    ins: Inspector, sid: str, lines: StoredLines, roots: dict[str, list[Revision]], out: BinaryIO
) -> None:
    """A Markdown document: a section a message, its archived branches quoted under it."""
    exported = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    out.write(f"# Session {sid}\n\n_exported {exported}_\n\n".encode())
    count = 0
    for line in lines:
        count += 1
        m = _message(line)
        mid = str(m.get("id"))
        revs = roots.get(mid, [])
        out.write(_markdown(m, [(r.revision, ins.branch(sid, mid, r)) for r in revs]))
    out.write(f"_{count} message(s)_\n".encode())


def _markdown(m: dict[str, Any], branches: list[tuple[int, list[bytes]]]) -> bytes:
    """One message as a Markdown section, its archived branches quoted under it."""
    status = m.get("status", "complete")
    tag = "" if status == "complete" else f" ({status})"
    text = f"## {m.get('role')}{tag} · `{m.get('id')}`\n\n{text_of(m)}\n\n"
    for n, lines in branches:
        text += f"> **revision {n}** of the reply to `{m.get('id')}`\n>\n"
        for b in map(_message, lines):
            text += "".join(f"> {t}\n" for t in text_of(b).splitlines() or [""])
        text += "\n"
    return text.encode()


__all__ = ["export", "inspect"]
