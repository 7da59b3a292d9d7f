"""NDJSON framing: split a byte stream into lines, holding at most 64 MiB of any line.

:class:`LineReader` is the protocol a transport reads into. The transport reads straight
into its buffer (``get_buffer``, uvloop and sockets) and each whole line is copied out
once and handed to ``on_line`` in the same callback: no stream reader, no second and
third copy of a 1 MB request, no task woken per read. Transports that only call
``data_received`` (asyncio's pipes) get the same splitting with one more copy.

A line longer than the limit is read through to its next newline and dropped as it goes
(ADR 0216 decision 3): the reader hands on :data:`TOO_LONG` for it and lives on.

What a connection holds is bounded (issue 26). Its buffer is :data:`READ_BUFFER` until a
longer line arrives; what it grows past that is taken from the host's
:class:`RequestBudget`, shared by every connection, and a line the budget cannot hold is
dropped the same way, handed on as :class:`Refused` with its first bytes (for its id).
Its consumer may :meth:`~LineReader.pause` it: the transport stops reading, and lines
already read wait in the reader until :meth:`~LineReader.resume`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from host._limits import READ_BUFFER, REQUEST_BYTES
from host._wire import MAX_LINE


class _TooLong:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TOO_LONG"


class Refused:
    """A line dropped because the host already holds :data:`REQUEST_BYTES` of long lines."""

    __slots__ = ("head",)

    def __init__(self, head: bytes) -> None:
        self.head = head
        """The line's first bytes, where its id most often is."""

    def __repr__(self) -> str:
        return f"Refused({self.head[:40]!r})"


TOO_LONG: Final = _TooLong()
CHUNK = 1 << 20
"""A buffer's size once a line outgrows :data:`READ_BUFFER` (it doubles from there), and
the most a thread feeding a file reads at once."""
KEEP = 4 * CHUNK
"""A grown buffer up to this size is kept for the next line (a streaming reply's 1 MB
snapshots); past it, it is let go after its line."""
ROOM = 1 << 16
"""The least free room offered to a read; the buffer grows when a line leaves less."""
HEAD = 4096
"""The bytes of a refused line kept to answer it by its id."""

Line = bytes | _TooLong | Refused
OnLine = Callable[[Line], None]


def _drop(line: Line) -> None:
    pass


def _nothing() -> None:
    pass


class RequestBudget:
    """The request bytes of long lines the host holds for every connection together.

    Readers take what their buffers grow past :data:`READ_BUFFER`; a connection holds a
    long line's bytes while its calls run. A reader whose buffer grew for an earlier line
    and holds nothing now is *idle*: it lets its buffer go when the budget runs short.
    """

    def __init__(self, limit: int = REQUEST_BYTES) -> None:
        self.limit = limit
        self.used = 0
        self._idle: dict[LineReader, int] = {}  # readers keeping a grown buffer, empty

    def take(self, n: int) -> bool:
        """Take ``n`` bytes if the budget has them (idle readers' buffers let go first)."""
        if self.used + n > self.limit:
            for reader in list(self._idle):
                reader.let_go()
                if self.used + n <= self.limit:
                    break
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def hold(self, n: int) -> None:
        """Count ``n`` bytes that are already held (a line read whole), limit or not."""
        self.used += n

    def give(self, n: int) -> None:
        """Give back bytes taken or held."""
        self.used -= n

    def idle(self, reader: LineReader, kept: int) -> None:
        """Note that ``reader`` keeps ``kept`` bytes of a grown buffer with nothing in it
        (0: it holds a line, or no grown buffer)."""
        if kept:
            self._idle[reader] = kept
        else:
            self._idle.pop(reader, None)

    @property
    def held(self) -> int:
        """Bytes of requests held: lines being read or in flight (idle buffers aside)."""
        return self.used - sum(self._idle.values())


class LineReader(asyncio.BufferedProtocol):
    """Split what a transport reads into lines and hand each to ``on_line``, in order.

    ``ended`` is set at end of input (the last unterminated line counts) or when the
    transport is lost, once every line read is handed on; :meth:`stop` drops whatever
    arrives after it.
    """

    def __init__(
        self, on_line: OnLine = _drop, limit: int = MAX_LINE, budget: RequestBudget | None = None
    ) -> None:
        self.on_line = on_line
        self.limit = limit
        self.budget = budget or RequestBudget(limit=1 << 62)
        self.ended = asyncio.Event()
        self.transport: Any = None
        self._buf = bytearray(READ_BUFFER)
        self._taken = 0  # of the budget: what the buffer holds past READ_BUFFER
        self._start = 0  # where the current line begins
        self._end = 0  # how far the buffer is filled
        self._scanned = 0  # bytes before this hold no newline of the current line
        self._dropped: _TooLong | Refused | None = None  # reading through a dropped line
        self.on_read_end: Callable[[], None] = _nothing
        """Called once the lines of a read are handed on (the consumer starts them then)."""
        self._paused = False  # by the consumer: read nothing, hand on nothing
        self._waiting: deque[Line] = deque()  # read while paused
        self._input_over: bool | None = None  # end of input (True) or a lost transport
        self._stopped = False

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
            size = min(max(2 * len(self._buf), self._end + need, CHUNK), self.limit + need)
            if size > len(self._buf) and not self._grow(size):
                self._refuse()
            self._settle()
        return memoryview(self._buf)[self._end :]

    def _grow(self, size: int) -> bool:
        """Grow the buffer to ``size`` bytes, if the budget has what it takes past
        :data:`READ_BUFFER`."""
        self.budget.idle(self, 0)
        want = max(0, size - READ_BUFFER) - self._taken
        if self._stopped or (want > 0 and not self.budget.take(want)):
            return False
        self._taken += max(0, want)
        self._buf += bytes(size - len(self._buf))
        return True

    def _settle(self) -> None:
        """Keep what the budget counts for this buffer equal to its size past READ_BUFFER."""
        now = max(0, len(self._buf) - READ_BUFFER)
        if now < self._taken:
            self.budget.give(self._taken - now)
        elif now > self._taken:
            self.budget.hold(now - self._taken)
        self._taken = now

    def _refuse(self) -> None:
        """Drop the line being read (the budget is spent): read it through, then answer.

        What its buffer held goes back to the budget at once, so that another line the
        budget stalled can grow (else lines half-way through all wait on each other).
        """
        if self._dropped is None:
            self._dropped = Refused(bytes(self._buf[self._start : self._start + HEAD]))
        self._start = self._end = self._scanned = 0
        self.let_go()

    def let_go(self) -> None:
        """Give an idle grown buffer back (the budget ran short)."""
        if self._start == self._end and self._taken:
            self._buf = bytearray(READ_BUFFER)
            self.budget.give(self._taken)
            self._taken = 0
        self.budget.idle(self, 0)

    def buffer_updated(self, nbytes: int) -> None:
        """Hand on every line the ``nbytes`` just read complete."""
        self._lines(nbytes)

    def _lines(self, nbytes: int) -> None:
        self._end += nbytes
        buf = self._buf
        nl = buf.find(b"\n", self._scanned, self._end)
        while nl >= 0:
            line: Line
            if self._dropped is not None:
                line, self._dropped = self._dropped, None
            elif nl - self._start > self.limit:
                line = TOO_LONG
            else:
                with memoryview(buf) as view:
                    line = bytes(view[self._start : nl])
            self._start = self._scanned = nl + 1
            self._hand_on(line)
            nl = buf.find(b"\n", self._start, self._end)
        if self._start == self._end:  # nothing pending: start again at the front
            self._start = self._end = self._scanned = 0
            if len(buf) > KEEP:  # let a huge line's buffer go
                self.let_go()
            self.budget.idle(self, self._taken)
        elif self._dropped is not None or self._end - self._start > self.limit:
            self._dropped = self._dropped or TOO_LONG  # read on to its end, holding none
            self._start = self._end = self._scanned = 0
        else:
            self._scanned = self._end
        self.on_read_end()

    def _hand_on(self, line: Line) -> None:
        if self._paused or self._waiting:
            self._waiting.append(line)
        else:
            self.on_line(line)

    def data_received(self, data: bytes) -> None:
        """Take bytes from a transport that does not read into ``get_buffer`` (or a thread
        reading a file)."""
        view = memoryview(data)
        while view:
            with self.get_buffer(len(view)) as room:
                n = min(len(room), len(view))
                room[:n] = view[:n]
            view = view[n:]
            self._lines(n)

    def pause(self) -> None:
        """Read nothing more, and hold back the lines already read, until :meth:`resume`."""
        if not self._paused:
            self._paused = True
            self._transport_call("pause_reading")

    def resume(self) -> None:
        """Hand on the lines held back, then read again (unless paused again meanwhile)."""
        if not self._paused:
            return
        self._paused = False
        while self._waiting and not self._paused:
            self.on_line(self._waiting.popleft())
        self.on_read_end()
        if self._paused:
            return
        if self._input_over is not None:
            self._over(self._input_over)
        elif not self._stopped:
            self._transport_call("resume_reading")

    def eof_received(self) -> bool:
        self._over(True)
        return True  # a socket stays open for the answers still to come

    def connection_lost(self, exc: Exception | None) -> None:
        self._over(False)

    def _over(self, eof: bool) -> None:
        """End of input, or a lost transport: once every line read is handed on."""
        if self._paused or self._waiting:
            if self._input_over is None:
                self._input_over = eof
            return
        self._input_over = None
        if eof:
            if self._dropped is not None:
                line, self._dropped = self._dropped, None
                self.on_line(line)
            elif self._end > self._start:
                with memoryview(self._buf) as view:
                    self.on_line(bytes(view[self._start : self._end]))
            self.on_read_end()
        self._start = self._end = self._scanned = 0
        self.let_go()
        self.ended.set()

    def stop(self) -> None:
        """Read no more: what arrives from now on, or was held back, is dropped (shutdown)."""
        self.on_line = _drop
        self.on_read_end = _nothing
        self._stopped = True
        self._waiting.clear()
        self._start = self._end = self._scanned = 0
        self.let_go()
        self._transport_call("pause_reading")

    def _transport_call(self, name: str) -> None:
        if self.transport is not None:
            with contextlib.suppress(RuntimeError, AttributeError, NotImplementedError):
                getattr(self.transport, name)()
