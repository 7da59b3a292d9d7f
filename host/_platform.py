"""Where the host runs: Linux and macOS, and what it refuses elsewhere.

The host needs POSIX file locks (``fcntl.flock``: one host per data dir, a checkpoint read
beside a save), ``O_NOFOLLOW`` opens and Unix sockets. Windows has none of them, so there
``python -m host`` says so in one line and exits :data:`EXIT_UNSUPPORTED` instead of
failing on an ``ImportError``; the package itself still imports (``host.Host`` then raises
:class:`UnsupportedPlatform`). This module imports nothing the check is about.
"""

from __future__ import annotations

import sys

EXIT_UNSUPPORTED = 4
"""``python -m host``'s exit status on a platform it cannot run on."""


class UnsupportedPlatform(ImportError):
    """Raised when a part of the host is used on a platform it does not run on."""


def unsupported() -> str | None:
    """Why the host cannot run here, in one line, or ``None`` where it can."""
    try:
        import fcntl  # noqa: F401 - only whether it exists
    except ImportError:
        return (
            f"hostcore's host runs on Linux and macOS only: this Python ({sys.platform})"
            " has no fcntl module for the POSIX file locks it needs"
        )
    return None
