"""The files the producer writes, opened as the host opens the files of its data dir.

No link is followed (``O_NOFOLLOW``), no FIFO waited on (``O_NONBLOCK`` at the open, then
only a regular file is kept), and every write is written whole (:func:`write_all`): a
link planted beside the journal would otherwise get set-aside rows, message bytes
included, appended to whatever it points to, and a FIFO would stall the drain for good
(issue 36). What happens to something planted depends on the file:

- a file the producer only appends to (``outbox.jsonl.rejected`` and ``.quarantine``, the
  host's and pi's logs): the planted thing is moved aside to ``<name>.odd-<hex>`` (the link
  itself, never what it points to), logged, and a file made in its place, as the host does
  with its sidecars (:func:`open_append`);
- the journal, the only copy of the rows not yet delivered: refused, with
  :class:`NotRegularFile` (:func:`open_regular`), for a person to look at;
- a file replaced whole (pi's session file, ``drive``'s run count): a new file, made with
  ``O_EXCL``, renamed over the name (:func:`write_new`), which replaces a link or FIFO and
  never opens it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

log = logging.getLogger("outbox.files")
_NOT_A_FILE = (errno.ELOOP, errno.EISDIR, errno.ENXIO)  # a link; a folder; a FIFO or socket


class NotRegularFile(OSError):
    """Raised where the producer would write through a symlink, or into a FIFO or folder."""


def open_regular(path: str, flags: int = os.O_RDONLY) -> int:
    """Open ``path`` (created 0600 if ``flags`` say so), never through a symlink, never
    blocked by a FIFO; :class:`NotRegularFile` for anything but a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno not in _NOT_A_FILE:
            raise
        raise NotRegularFile(exc.errno, "not a regular file", path) from None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, "not a regular file", path)
    os.set_blocking(fd, True)  # as any file: O_NONBLOCK was for the open alone
    return fd


def open_append(path: str) -> int:
    """Open ``path`` to append to (created 0600); a thing planted there is moved aside.

    A symlink, FIFO or folder at ``path`` is renamed to ``<path>.odd-<hex>`` (the link, not
    its target), logged as an error, and a file made in its place.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    try:
        return open_regular(path, flags)
    except NotRegularFile:
        aside = f"{path}.odd-{os.urandom(3).hex()}"
        os.rename(path, aside)
        log.error(
            "%s is not a regular file (a symlink, FIFO or folder): moved to %s, and a file"
            " made in its place",
            path,
            aside,
        )
    return open_regular(path, flags)


def read_regular(path: str) -> bytes:
    """The whole of the regular file at ``path`` (see :func:`open_regular`)."""
    fd = open_regular(path)
    try:
        return read_fd(fd)
    finally:
        os.close(fd)


def read_fd(fd: int) -> bytes:
    """What ``fd`` holds from its offset to its end."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a write may take part of it) or raise ``OSError``."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n == 0:
            raise OSError("no room to write")
        view = view[n:]


def fsync_dir(path: str) -> None:
    """fsync the folder holding ``path``: its name (a new file, a rename) is then durable."""
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_new(path: str, data: bytes) -> None:
    """Create ``path`` (0600, never an existing file) holding ``data``, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data``: a new temp file, fsynced, renamed over it; folder fsync.

    Whatever was at ``path`` (a symlink, a FIFO) is replaced, never opened; a temp file
    left by a failed rename is removed.
    """
    tmp = f"{path}.{os.urandom(4).hex()}.tmp"
    write_new(tmp, data)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_dir(path)
