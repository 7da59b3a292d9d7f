"""``python -m hostview inspect``: the sessions of a data dir, or one session in detail."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from host._index import BUSY_TIMEOUT
from host._layout import check_id
from hostview._data import Inspector, count_lines, first_line, text_of


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
        "quarantinedLines": count_lines(ins.layout.quarantine(sid)),
    }


def _message_entry(line: int, m: dict[str, Any], size: int) -> dict[str, Any]:
    return {
        "line": line,
        "id": m.get("id"),
        "role": m.get("role"),
        "turnId": m.get("turnId"),
        "status": m.get("status", "complete"),
        "bytes": size,
        "text": first_line(m),
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
            f" saved {cp.get('savedAt')}, {len(text_of(msg))} chars: {first_line(msg)}"
        )
    return "\ncheckpoint: none"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
        if n == 0:
            print("  ".join("-" * w for w in widths), file=out)
