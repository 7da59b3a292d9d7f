"""NDJSON framing: split a byte stream into lines, holding at most 64 MiB of any line.

:class:`LineReader` is the protocol a transport reads into. The transport reads straight
into its buffer (``get_buffer``, uvloop and sockets) and each whole line is copied out
once and handed to ``on_line`` in the same callback: no stream reader, no second and
third copy of a 1 MB request, no task woken per read. Transports that only call
``data_received`` (asyncio's pipes) get the same splitting with one more copy.

A line longer than the limit is read through to its next newline and dropped as it goes
(ADR 0216 decision 3): the reader hands on :data:`TOO_LONG` for it and lives on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Final

from host._wire import MAX_LINE


class _TooLong:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TOO_LONG"


TOO_LONG: Final = _TooLong()
CHUNK = 1 << 20
"""The buffer a connection starts with, and the most a thread feeding a file reads at once."""
ROOM = 1 << 16
"""The least free room offered to a read; the buffer doubles when a line leaves less."""

OnLine = Callable[[bytes | _TooLong], None]


def _drop(line: bytes | _TooLong) -> None:
    pass


class LineReader(asyncio.BufferedProtocol):
    """Split what a transport reads into lines and hand each to ``on_line``, in order.

    ``ended`` is set at end of input (the last unterminated line counts) or when the
    transport is lost; :meth:`stop` drops whatever arrives after it.
    """

    def __init__(self, on_line: OnLine = _drop, limit: int = MAX_LINE) -> None:
        self.on_line = on_line
        self.limit = limit
        self.ended = asyncio.Event()
        self.transport: Any = None
        self._buf = bytearray(CHUNK)
        self._start = 0  # where the current line begins
        self._end = 0  # how far the buffer is filled
        self._scanned = 0  # bytes before this hold no newline of the current line
        self._discarding = False  # reading through a line over the limit
        self._more = False  # while ``on_line`` runs: another line may be fed first (more())

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        """Return the free end of the buffer, at least ``ROOM`` (or ``sizehint``) bytes."""
        need = max(sizehint, ROOM)
        if len(self._buf) - self._end < need:
            # Resized in place, which no transport's view outlives (each is released
            # after buffer_updated): a growing line is never held twice.
            del self._buf[: self._start]
            self._end -= self._start
            self._scanned -= self._start
            self._start = 0
            size = min(max(2 * len(self._buf), self._end + need), self.limit + need)
            if size > len(self._buf):  # past the limit a line is dropped, never held
                self._buf += bytes(size - len(self._buf))
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """Hand on every line the ``nbytes`` just read complete."""
        # A read that filled its room may have left more in the kernel, which uvloop reads
        # in the same pass, before any task runs: as if it were already here (``more``).
        self._lines(nbytes, self._end + nbytes == len(self._buf))

    def _lines(self, nbytes: int, full: bool) -> None:
        self._end += nbytes
        buf = self._buf
        nl = buf.find(b"\n", self._scanned, self._end)
        while nl >= 0:
            following = buf.find(b"\n", nl + 1, self._end)
            if self._discarding:
                self._discarding = False
                line: bytes | _TooLong = TOO_LONG
            elif nl - self._start > self.limit:
                line = TOO_LONG
            else:
                with memoryview(buf) as view:
                    line = bytes(view[self._start : nl])
            self._start = self._scanned = nl + 1
            self._more = following >= 0 or full
            self.on_line(line)
            nl = following
        self._more = False
        if self._start == self._end:  # nothing pending: start again at the front
            self._start = self._end = self._scanned = 0
            if len(buf) > 4 * CHUNK:  # let a huge line's buffer go
                self._buf = bytearray(CHUNK)
        elif self._discarding or self._end - self._start > self.limit:
            self._discarding = True  # drop what is held of it and read on to its end
            self._start = self._end = self._scanned = 0
        else:
            self._scanned = self._end

    def more(self) -> bool:
        """Whether another line may be fed before a task created for the one ``on_line`` is
        handling runs: a whole one was read behind it, or the read filled its room."""
        return self._more

    def data_received(self, data: bytes) -> None:
        """Take bytes from a transport that does not read into ``get_buffer`` (or a thread
        reading a file, whose full chunk may have another queued behind it)."""
        with self.get_buffer(len(data)) as room:
            room[: len(data)] = data
        self._lines(len(data), len(data) >= CHUNK)

    def eof_received(self) -> bool:
        if self._discarding:
            self._discarding = False
            self.on_line(TOO_LONG)
        elif self._end > self._start:
            with memoryview(self._buf) as view:
                self.on_line(bytes(view[self._start : self._end]))
        self._start = self._end = self._scanned = 0
        self.ended.set()
        return True  # a socket stays open for the answers still to come

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set()

    def stop(self) -> None:
        """Read no more: what arrives from now on is dropped (shutdown)."""
        self.on_line = _drop
        if self.transport is not None:
            with contextlib.suppress(RuntimeError, AttributeError, NotImplementedError):
                self.transport.pause_reading()
