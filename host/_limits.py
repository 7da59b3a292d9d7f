"""The host's bounds on what clients may make it hold: memory, descriptors, time.

Every number here is a contract (docs/protocol.md, "Limits", is generated from this
module): each says what a client gets when it reaches it. They come from how hostile
or careless clients really behave (issue 26): a batch of 520,000 elements, answers
nobody reads, a dozen 60 MiB lines at once, a thousand idle connections, ten thousand
sessions under a desktop's ``ulimit -n 256``.

The descriptor bounds follow the process's ``RLIMIT_NOFILE``, which ``serve`` first
raises to its hard limit (:func:`raise_nofile`); the rest are fixed.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

# -- one connection -----------------------------------------------------------------------

CALLS_IN_FLIGHT = 1_024
"""A connection's calls read but not yet answered, at most; its reading pauses there."""
READ_AHEAD = 4 * 1024 * 1024
"""Request bytes of a connection's calls in flight; its reading pauses past them."""
ANSWERS_WAITING = 4 * 1024 * 1024
"""Answer bytes written but not yet taken by the client; past them the connection's
reading pauses and no call of it starts, until the client has read them down to
:data:`ANSWERS_RESUME`."""
ANSWERS_RESUME = 1024 * 1024
READ_BUFFER = 64 * 1024
"""What a connection's read buffer holds until a longer line arrives (and again after)."""

# -- every connection ---------------------------------------------------------------------

REQUEST_BYTES = 256 * 1024 * 1024
"""Bytes of long lines (past :data:`READ_BUFFER`) the host holds for all connections
together, being read or in flight; a line that would pass it is dropped as it streams by
and answered ``LIMIT_EXCEEDED``."""
HANDSHAKE_TIMEOUT = 10.0
"""Seconds a socket connection may stay without a good handshake before it is closed."""
REFUSAL_WAIT = 2.0
"""Seconds a connection refused at the cap is kept, its line sent and the host's side shut,
for the client to read the line and close; then it is closed."""
REFUSAL_READ = 64 * 1024
"""Bytes a refused connection may send meanwhile (read and dropped); past them it is closed."""

# -- descriptors --------------------------------------------------------------------------

MAX_CONNECTIONS = 1_024
"""Socket connections served at once, at most (fewer when descriptors are scarce)."""
OPEN_TRANSCRIPTS = 1_024
"""Transcripts kept open at once, at most (fewer when descriptors are scarce): the least
recently used is closed and reopened when next needed."""
REFUSALS_HELD = 64
"""Refused connections kept for their client to read the refusal, at most (fewer when
descriptors are scarce); one past them is closed as soon as its line is written."""
RESERVED_FDS = 64
"""Descriptors left for the index, the log, rewrites' temp files and the loop itself."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds that depend on the descriptors the process may open."""

    max_connections: int = MAX_CONNECTIONS
    open_transcripts: int = OPEN_TRANSCRIPTS
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    refusals_held: int = REFUSALS_HELD

    @classmethod
    def for_descriptors(cls, nofile: int, handshake_timeout: float = HANDSHAKE_TIMEOUT) -> Limits:
        """Share ``nofile`` descriptors: a quarter (at most 64) kept back, half the rest for
        connections, a quarter for open transcripts, the last quarter for everything
        transient (a rewrite's temp file, a checkpoint's spare, SQLite's journals), half
        of which refused connections may hold while their clients read the refusal."""
        spare = nofile - min(RESERVED_FDS, nofile // 4)
        return cls(
            max_connections=max(1, min(MAX_CONNECTIONS, spare // 2)),
            open_transcripts=max(4, min(OPEN_TRANSCRIPTS, spare // 4)),
            handshake_timeout=handshake_timeout,
            refusals_held=max(1, min(REFUSALS_HELD, spare // 8)),
        )


FALLBACK_NOFILE = (10_240, 4_096)
"""Soft limits tried when the hard one cannot be set (macOS: unlimited, but capped by
``kern.maxfilesperproc``, 10,240 by default)."""


def raise_nofile() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` as far as it goes (the hard limit); return it.

    A desktop app's child inherits macOS's soft limit of 256 descriptors, however many
    the system allows it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    tries = [hard] if hard != resource.RLIM_INFINITY else []
    for want in [*tries, *FALLBACK_NOFILE]:
        if want <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            continue
        return want
    return soft


# -- watches (issue 34) -------------------------------------------------------------------

WATCH_QUEUE = 1024 * 1024
"""Event bytes queued for one watcher, beyond the one being written, while its client takes
no more; past it (or past :data:`WATCH_EVENTS`) its queued events are dropped and it gets
one ``reset`` (``overflow``) with the cursor to resume from, which ends it."""
WATCH_EVENTS = 4096
"""Events queued for one watcher (small ones: ``live`` deltas), as :data:`WATCH_QUEUE`."""
WATCH_BYTES = 64 * 1024 * 1024
"""Event bytes queued for all watchers together; past it the watcher with the most queued
is ended as at :data:`WATCH_QUEUE`."""
WATCHES_PER_CONNECTION = 256
"""Watches one connection holds at once; ``session.watch`` past it is ``LIMIT_EXCEEDED``."""
WATCHERS_PER_SESSION = 1024
"""Watchers of one session at once (each event is written once per watcher);
``session.watch`` past it is ``LIMIT_EXCEEDED``."""
LIVE_DATA = 1024 * 1024
"""Bytes of one ``session.publish``'s ``data``; a longer one is ``LIMIT_EXCEEDED``."""
REPLAY_CHUNK = 256 * 1024
"""Stored bytes a catching-up watcher reads in one hold of its session (at least one line),
and only once its client has taken what it read before."""
DRAIN_STEP = 1024 * 1024
"""Notification bytes a connection is handed in one pass of the loop."""
