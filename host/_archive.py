"""Archived regenerate branches (ADR 0060): ``DIR/revisions/<session>/<root>/``.

Each root has a small ``manifest.json`` listing its revisions and, per revision, one
payload file of stored lines copied verbatim from the transcript (``turnId`` kept). The
manifest is the commit point: a payload is written and fsynced first, then the manifest
is replaced atomically, then payloads it no longer names are removed. Listing revisions
reads only the manifest, however large the payloads are.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from host._errors import Conflict, StorageError
from host._fs import FileSystem, NotRegularFile, read_regular, temp_name
from host._layout import Layout, check_id, legal_id
from host._messages import parse_stored

log = logging.getLogger("host.archive")


@dataclass(slots=True)
class Revision:
    """One archived branch as its manifest lists it."""

    revision: int
    file: str
    messageCount: int
    createdAt: str


class ManifestDamaged(Exception):
    """Raised when a revision manifest cannot be read as one."""

    def __init__(self, path: str, exc: Exception) -> None:
        super().__init__(f"{path} is damaged ({exc})")
        self.path = path
        self.reason = exc


class AnotherRootsArchive(Conflict):
    """Raised when a root's folder holds the archive of a root whose id differs from it
    only in case: one folder on a case-insensitive file system (macOS's default)."""


class ArchiveDamaged(StorageError):
    """Raised when an archived revision's payload is not what its manifest says."""


def _lines(session_id: str, root_id: str, rev: Revision, data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    ok = data.endswith(b"\n") or not data
    lines = lines[:-1]
    if not ok or len(lines) != rev.messageCount or any(parse_stored(x) is None for x in lines):
        log.error(
            "session %s: revision %d of root %s is damaged (%s)",
            session_id,
            rev.revision,
            root_id,
            rev.file,
        )
        raise ArchiveDamaged(
            f"revision {rev.revision} of root {root_id!r} is damaged on disk",
            sessionId=session_id,
            rootId=root_id,
            revision=rev.revision,
        )
    return lines


def _manifest(root_id: str, revisions: Sequence[Revision]) -> bytes:
    return json.dumps({"rootId": root_id, "revisions": [asdict(r) for r in revisions]}).encode()


class Archive:
    """The revision archives of every session."""

    def __init__(self, layout: Layout, fs: FileSystem) -> None:
        self.layout = layout
        self.fs = fs
        self.on_change: Callable[[str], None] = lambda session_id: None
        """Told of every manifest committed (issue 35: the search index follows)."""

    def folder(self, session_id: str, root_id: str) -> str:
        """The root's archive folder, once no folder on its way is a link (``UnsafeFolder``)."""
        folder = os.path.join(self.layout.revisions(session_id), check_id(root_id, "rootId"))
        return self.layout.checked(folder)

    def manifest(self, session_id: str, root_id: str) -> list[Revision]:
        """The root's revisions in order, read only (``ManifestDamaged`` when unreadable).

        Raises :class:`AnotherRootsArchive` when the manifest names a root that differs
        from ``root_id`` only in case: the file system folds case, so the two roots' folders
        are one, and this archive is the other root's (``session.create`` keeps session ids
        apart; message ids are the caller's, so the archive calls refuse instead).
        """
        path = os.path.join(self.folder(session_id, root_id), "manifest.json")
        try:
            data = json.loads(read_regular(path))
            revisions = [Revision(**r) for r in data["revisions"]]
            owner = data.get("rootId", root_id)
        except FileNotFoundError:
            return []
        except (NotRegularFile, ValueError, TypeError, KeyError, RecursionError) as exc:
            raise ManifestDamaged(path, exc) from None
        if isinstance(owner, str) and owner != root_id and owner.lower() == root_id.lower():
            raise AnotherRootsArchive(
                f"the archive of root {root_id!r} would be root {owner!r}'s: their ids differ"
                " only in case, and this file system folds case",
                messageId=root_id,
            )
        return revisions

    def load(self, session_id: str, root_id: str) -> list[Revision]:
        """Return the root's revisions in order (empty when none were archived)."""
        try:
            return self.manifest(session_id, root_id)
        except ManifestDamaged as exc:
            path = exc.path
            # Damaged: move it aside with its bytes (never lose them), serve no archive.
            aside = f"{path}.damaged-{os.urandom(3).hex()}"
            os.replace(path, aside)
            log.error(
                "session %s: revision manifest of root %s is damaged (%s): moved to %s",
                session_id,
                root_id,
                exc.reason,
                aside,
            )
            return []

    @staticmethod
    def payload_name(revision: int) -> str:
        """A new payload file's name for ``revision``: never one already there."""
        return f"{revision:06d}-{os.urandom(4).hex()}.jsonl"

    def write_payload(
        self, session_id: str, root_id: str, name: str, lines: Sequence[bytes]
    ) -> None:
        """Write a branch's lines to the new payload file ``name``, fsynced."""
        folder = self.folder(session_id, root_id)
        self.fs.mkdir(folder)
        path = os.path.join(folder, name)
        self.fs.write_new(path, b"".join(line + b"\n" for line in lines))  # gone on a failure
        # its name is made durable by the folder fsync before its commit

    def commit(self, session_id: str, root_id: str, revisions: Sequence[Revision]) -> None:
        """Replace the manifest atomically (``saveRevision``'s commit; its folder fsync
        makes the new payload's name durable too). Payloads it no longer names stay until
        :meth:`prune`."""
        folder = self.folder(session_id, root_id)
        self.fs.mkdir(folder)
        self.fs.write_atomic(os.path.join(folder, "manifest.json"), _manifest(root_id, revisions))
        self.on_change(session_id)

    def prepare(self, session_id: str, root_id: str, revisions: Sequence[Revision]) -> str:
        """Write the manifest a change will commit into a temp file beside it; return it.

        Its space is taken now, before the change is recorded: :meth:`install` then needs
        none, so a disk that fills meanwhile cannot stop a change half made.
        """
        folder = self.folder(session_id, root_id)
        self.fs.mkdir(folder)
        tmp = temp_name(os.path.join(folder, "manifest.json"))
        self.fs.write_new(tmp, _manifest(root_id, revisions))
        return tmp

    def unnamed(self, session_id: str, root_id: str) -> list[str]:
        """The root's files its manifest does not name (payloads to remove).

        Nothing while a damaged manifest lies set aside in the folder: the payloads it named
        are the only copy of those branches, kept for a person to recover.
        """
        try:
            keep = {r.file for r in self.load(session_id, root_id)} | {"manifest.json"}
        except AnotherRootsArchive:
            return []  # the folder is another root's as well: nothing in it is this one's
        names = os.listdir(self.folder(session_id, root_id))
        if any(".damaged-" in name for name in names):
            return []
        return [name for name in names if name not in keep]

    def prune(self, session_id: str, root_id: str) -> int:
        """Remove the root's payloads its manifest does not name; return how many."""
        folder = self.folder(session_id, root_id)
        names = [n for n in self.unnamed(session_id, root_id) if not n.endswith(".tmp")]
        for name in names:
            self.fs.unlink(os.path.join(folder, name))
        return len(names)

    def read(self, session_id: str, root_id: str, rev: Revision) -> list[bytes]:
        """Return the stored lines of one archived revision (``ArchiveDamaged`` if bad)."""
        data = read_regular(os.path.join(self.folder(session_id, root_id), rev.file))
        return _lines(session_id, root_id, rev, data)

    def root_ids(self, session_id: str) -> list[str]:
        """The session's pager roots with an archive folder, in order; the rest logged.

        An entry that is no root's folder (a stray file, a link, a name no id can have) is
        left alone: never followed, never read as an archive.
        """
        base = self.layout.revisions(session_id)
        if os.path.islink(base) or not os.path.isdir(base):
            return []
        roots = []
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if legal_id(name) and not os.path.islink(path) and os.path.isdir(path):
                roots.append(name)
            else:
                log.warning("%s is not a pager root's folder: left alone", path)
        return roots

    def sweep(self, session_id: str) -> int:
        """Remove payload files no manifest names (a crash before a commit); return count."""
        return sum(self.prune(session_id, root_id) for root_id in self.root_ids(session_id))
