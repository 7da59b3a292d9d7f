"""A host's data dir, read without touching it: what ``inspect`` and ``export`` look at.

The index is opened read-only (``host._index.connect_read_only``: ``mode=ro`` beside a
live host, whose WAL lets a reader in; ``immutable`` when no program has it open, so that
not even a ``-wal`` or ``-shm`` is made), every file ``O_RDONLY``. Nothing is locked but a
checkpoint, under a shared ``flock`` for the instant of its read, and nothing is written,
not even what is found damaged (the host sets that aside at its next start): a look can
run on the data dir of a running host without disturbing it. A host that starts in the
middle of a look at a stopped one is not waited for: the look may then fail; look again.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from host._archive import Archive, ArchiveDamaged, ManifestDamaged, Revision
from host._fs import FileSystem, NotRegularFile, open_regular, read_whole
from host._index import BUSY_TIMEOUT, IndexBusy, connect_read_only, index_problem
from host._layout import Layout
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
                raise SystemExit(
                    f"no index at {path}: start the host, or run python -m host verify --repair"
                )
            try:
                problem = index_problem(path, self.busy_timeout)
            except IndexBusy as exc:
                raise SystemExit(str(exc)) from None
            if problem is not None:
                raise SystemExit(f"index {path} is {problem}: run python -m host verify --repair")
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
                    "quarantined": count_lines(self.layout.quarantine(sid)),
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
                yield line, to_dict(f.read(length)), length

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


def to_dict(raw: bytes) -> dict[str, Any]:
    """A stored line as a dict to show (a placeholder when it is none: a copy of its own)."""
    try:
        value = json.loads(raw)  # not msgspec: a number past 64 bits is still shown
    except (ValueError, RecursionError):
        return dict(_UNREADABLE)
    return value if isinstance(value, dict) else dict(_UNREADABLE)


def count_lines(path: str) -> int:
    """The lines of the file at ``path`` (0 when there is none, or it is no regular file)."""
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            return sum(1 for _ in f)
    except (FileNotFoundError, NotRegularFile):
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


def first_line(message: dict[str, Any], width: int = 60) -> str:
    """The first line of a message's text, cut to ``width`` characters."""
    text = text_of(message).strip().splitlines()
    first = text[0] if text else ""
    return first if len(first) <= width else first[: width - 1] + "…"
