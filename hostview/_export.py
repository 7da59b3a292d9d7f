"""``python -m hostview export``: a session's transcript out as JSONL or Markdown."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any, BinaryIO

from host._archive import Revision
from host._layout import check_id
from hostview._data import Inspector, StoredLines, note, text_of, to_dict


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
        m = to_dict(line)
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
        for b in map(to_dict, lines):
            text += "".join(f"> {t}\n" for t in text_of(b).splitlines() or [""])
        text += "\n"
    return text.encode()
