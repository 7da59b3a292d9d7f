"""Durable file writes the outbox and the pi runtime share."""

from __future__ import annotations

import os


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
