"""The JSON-RPC 2.0 endpoint of one connection; it knows nothing of the transport.

Each line is handled synchronously up to the point where its call's task is created, so
tasks start (and queue on their session's lock) in the order lines arrived. A handshake
is answered synchronously, so requests pipelined right behind it see it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Container, Hashable
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, Raw, Struct

from host import __version__
from host._errors import (
    HostError,
    InvalidParams,
    InvalidRequest,
    LimitExceeded,
    MethodNotFound,
    NotHandshaken,
    ParseError,
    ProtocolMismatch,
    RequestCancelled,
    to_error_object,
)
from host._framing import TOO_LONG, Line, Refused, RequestBudget
from host._limits import (
    CALLS_IN_FLIGHT,
    READ_AHEAD,
    READ_BUFFER,
    REQUEST_BYTES,
)
from host._locks import CURRENT_CALL, CallState
from host._surrogates import decode
from host._wire import (
    CANCEL,
    DECODERS,
    ENCODER,
    ENVELOPE,
    ID_ONLY,
    MAX_BATCH,
    MAX_LINE,
    PROTOCOL_VERSION,
    REQUEST,
    REQUEST_TYPES,
    BatchTooLong,
    HandshakeParams,
    HandshakeResult,
    batch_items,
)

log = logging.getLogger("host.rpc")
Handler = Callable[[Any], Awaitable[Struct]]
Immediate = Callable[[Any], Struct | None]
"""A method's call done at once, in the read callback, or ``None``: take the awaited way."""
_RAW = msgspec.json.Decoder(Raw)
SPLIT_MIN = 1 << 16
"""A request line longer than this may have its message split off (:func:`_split`)."""
_SPLIT_KEY = b'"message":'
_SPLIT_HEAD = 4096  # the bytes ``"message":`` is looked for in: the ids' room, never a body


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...


class Reading(Protocol):
    """The reader feeding a connection, which its flow control pauses and resumes."""

    @property
    def paused(self) -> bool: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class _Unpaused:
    """A connection fed by hand: nothing to pause."""

    paused = False

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass


class Stats:
    """Per-method counts and latencies for ``host.stats``."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.calls: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.samples: dict[str, deque[float]] = {}
        self.paused = 0  # connections whose reading flow control has paused
        self.waiting = 0  # calls waiting for their client to read (the gate)

    def record(self, method: str, seconds: float, ok: bool) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if not ok:
            self.errors[method] = self.errors.get(method, 0) + 1
        self.samples.setdefault(method, deque(maxlen=2048)).append(seconds * 1000)

    def per_method(self) -> dict[str, dict[str, float]]:
        out = {}
        for m, samples in self.samples.items():
            s = sorted(samples)
            out[m] = {
                "count": self.calls[m],
                "errors": self.errors.get(m, 0),
                "p50Ms": s[len(s) // 2],
                "p99Ms": s[min(len(s) - 1, int(len(s) * 0.99))],
                "maxMs": s[-1],
            }
        return out


def _error(rid: Any, err: dict[str, Any]) -> bytes:
    return ENCODER.encode({"jsonrpc": "2.0", "id": rid, "error": err})


def _result(rid: Any, result: Any) -> bytes:
    return ENCODER.encode({"jsonrpc": "2.0", "id": rid, "result": result})


class Connection:
    """One client's session with the host: handshake state, calls in flight, replies."""

    def __init__(
        self,
        handlers: dict[str, Handler],
        stats: Stats,
        writer: Writer,
        immediate: dict[str, Immediate] | None = None,
        split: dict[str, Immediate] | None = None,
        *,
        budget: RequestBudget | None = None,
        big_results: Collection[str] = (),
    ) -> None:
        self.handlers = handlers
        self.stats = stats
        self.writer = writer
        self.budget = budget or RequestBudget(limit=1 << 62)
        """The host's request bytes: a long line's are held while its calls run."""
        self.big_results = big_results
        """Methods whose answer is not bounded by their request (reads): one at a time."""
        self.reader: Reading = _Unpaused()
        """What feeds this connection: paused while its bounds are reached (flow control)."""
        self.immediate = immediate or {}
        self.split = split or {}
        """Calls done at once with their message split off their line (:func:`_split`):
        the call proves it JSON, and gives ``None`` when it is not."""
        self.more: Callable[[], bool] = _unknown
        """Whether another line may be fed before a task made for this one would run (its
        reader sets it: ``LineReader.more``); a call is done at once only when not, so a
        backlog still forms groups and a line read behind still finds the call queued."""
        self.handshaken = False
        self.calls: dict[Hashable, CallState] = {}
        self.tasks: set[asyncio.Future[Any]] = set()
        self._out: list[bytes] = []  # reply lines not yet written
        self._flushing: asyncio.Handle | None = None
        self.closed = False
        self._held = 0  # request bytes of the lines whose calls are in flight
        self._last: asyncio.Future[Any] | None = None  # the last task a line made
        self._gate: deque[tuple[asyncio.Future[None], bool]] = deque()  # calls waiting
        self._big = 0  # calls of big_results running (0 or 1)
        self._writer_paused = False  # the client leaves ANSWERS_WAITING bytes unread
        self._pausing = False  # this connection's flow control paused its reader

    # -- input ----------------------------------------------------------------------

    def feed(self, line: Line) -> None:
        """Handle one input line: answer it now, or start the tasks that will.

        Its bytes count as held until the last task it made is done (for a batch, the one
        that answers it); a long line's are held in the host's budget too.
        """
        self._last = None
        self._feed(line)
        task, self._last = self._last, None
        if task is not None and isinstance(line, bytes):
            size = len(line)
            self._held += size
            if size > READ_BUFFER:
                self.budget.hold(size)
            task.add_done_callback(functools.partial(self._line_done, size))
        self._flow()

    def _line_done(self, size: int, task: asyncio.Future[Any]) -> None:
        self._held -= size
        if size > READ_BUFFER:
            self.budget.give(size)
        self._flow()

    def _flow(self) -> None:
        """Pause the reader while a bound is reached; resume it once well under them all."""
        if (
            len(self.tasks) >= CALLS_IN_FLIGHT
            or self._held >= READ_AHEAD
            or (self._writer_paused and not self.closed)
        ):
            if not self._pausing:
                self._pausing = True
                self.stats.paused += 1
                self.reader.pause()
        elif (
            self._pausing
            and len(self.tasks) <= CALLS_IN_FLIGHT // 2
            and self._held <= READ_AHEAD // 2
        ):
            self._pausing = False
            self.stats.paused -= 1
            self.reader.resume()

    def _feed(self, line: Line) -> None:
        if line is TOO_LONG:
            self._spawn_send(_error(None, LimitExceeded("request line over 64 MiB").to_object()))
            return
        if isinstance(line, Refused):
            full = LimitExceeded(
                f"the host holds {REQUEST_BYTES >> 20} MiB of long requests already: send"
                " it again later",
                limit=REQUEST_BYTES,
            )
            self._spawn_send(_error(_head_id(line.head), full.to_object()))
            return
        assert isinstance(line, bytes)
        if not line or line.isspace():  # no copy of a 1 MB line, as strip() would make
            return  # blank lines between messages are tolerated
        try:
            if not line.isascii():  # no copy for the usual case
                line.decode("utf-8")  # msgspec does not check UTF-8 inside raw values
        except UnicodeDecodeError as exc:
            self._spawn_send(_parse_error(exc))
            return
        first = line[:1]
        if first.isspace():  # rare: only then a copy
            first = line.lstrip()[:1]
        try:
            if first == b"[":
                items = batch_items(line)
                if not items:
                    self._spawn_send(_error(None, InvalidRequest("empty batch").to_object()))
                    return
                tally = _Tally()
                parts = [self._start(bytes(item), reply=False, tally=tally) for item in items]
                self._spawn(self._finish_batch(parts))
            elif first == b"{":
                part = self._start(line, reply=True)  # malformed JSON raises DecodeError
                if isinstance(part, bytes):
                    self._spawn_send(part)
            else:
                decode(_RAW, line)  # JSON, but not a request: tell the two apart
                err = InvalidRequest("a request must be a JSON object or a batch array")
                self._spawn_send(_error(None, err.to_object()))
        except (msgspec.DecodeError, RecursionError) as exc:  # not JSON, or nested too deep
            self._spawn_send(_parse_error(exc))
        except BatchTooLong as exc:
            self._spawn_send(_error(None, LimitExceeded(str(exc), limit=MAX_BATCH).to_object()))

    def _start(
        self, item: bytes, *, reply: bool, tally: _Tally | None = None
    ) -> bytes | asyncio.Task[bytes | None] | None:
        alone = reply and not self.tasks and not self.more()
        if alone and self.handshaken and len(item) > SPLIT_MIN and self._split_now(item):
            return None
        if self.handshaken and (req := _one_pass(item)) is not None and req[0] in self.handlers:
            method, params, rid = req
            note = rid is UNSET
            now = self.immediate.get(method)
            if now and alone and not note and self._now(now, method, params, rid):
                return None
            return self._call(method, params, None if note else rid, reply, note, tally)
        try:
            env = decode(ENVELOPE, item)  # a DecodeError (not JSON) goes up to feed()
        except msgspec.ValidationError as exc:
            decode(_RAW, item)  # a type error seen before a truncation is still not JSON
            try:
                rid = decode(ID_ONLY, item).id
            except msgspec.MsgspecError:
                rid = None
            if not isinstance(rid, int | str) or isinstance(rid, bool):
                rid = None
            return _error(rid, InvalidRequest(f"invalid request: {exc}").to_object())
        note = env.id is UNSET
        rid = None if env.id is UNSET else env.id
        if env.jsonrpc != "2.0":
            return _error(rid, InvalidRequest('"jsonrpc" must be "2.0"').to_object())
        method = env.method
        params_raw = b"{}" if env.params is UNSET else env.params  # decoded in place
        try:
            if not self.handshaken and method != "handshake":
                raise NotHandshaken(f"{method}: handshake first")
            if method == "$/cancelRequest":
                self._cancel(params_raw)
                return None if note else _result(rid, None)
            if method not in self.handlers and method != "handshake":
                raise MethodNotFound(f"unknown method {method!r}")
            try:
                params = decode(DECODERS[method], params_raw)
            except msgspec.ValidationError as exc:
                if method == "handshake":
                    _version_mismatch(params_raw)  # "11" or 11.0 is not exactly 11
                raise InvalidParams(f"{method}: {exc}") from None
            if method == "handshake":
                result: Struct = self._handshake(params)
                self.stats.record(method, 0.0, True)
                return None if note else _result(rid, result)
        except HostError as exc:
            known = method in self.handlers or method in ("handshake", "$/cancelRequest")
            self.stats.record(method if known else "(unknown method)", 0.0, False)
            return None if note else _error(rid, exc.to_object())
        return self._call(method, params, rid, reply, note, tally)

    def _call(
        self, method: str, params: Any, rid: Any, reply: bool, note: bool, tally: _Tally | None
    ) -> asyncio.Task[bytes | None]:
        """Start the task that runs a decoded call of a known method."""
        call = CallState(method)
        task = asyncio.get_running_loop().create_task(
            self._run(call, self.handlers[method], params, rid, note, reply, tally)
        )
        call.task = task
        call.created()
        self.tasks.add(task)
        self._last = task
        task.add_done_callback(functools.partial(self._ended, call))
        if not note:
            self.calls[_key(rid)] = call
        return task

    def _split_now(self, item: bytes) -> bool:
        """Do a big request at once with its message split off (:func:`_split`).

        ``False`` when the line is not of that shape, or the call cannot be done at once,
        or its message proves not to be one JSON value: the line is then decoded whole and
        answered as any other, and nothing has happened in between.
        """
        req = _split(item, self.split)
        return req is not None and self._now(self.split[req[0]], *req)

    def _now(self, now: Immediate, method: str, params: Any, rid: Any) -> bool:
        """Do a call at once and answer it; ``False`` when it must take the awaited way.

        Only with nothing of this connection in flight, so the answer goes out first in
        line; its result is small (an append's or a save's), so it needs no 64 MiB check.
        """
        t0 = time.perf_counter()
        try:
            result = now(params)
            if result is None:
                return False
            body, ok = _result(rid, result), True
        except Exception as exc:
            body, ok = _error(rid, to_error_object(exc, method)), False
        self._out += (body, b"\n")
        self._flush()
        self.stats.record(method, time.perf_counter() - t0, ok)  # after: the client waits
        return True

    def _handshake(self, p: HandshakeParams) -> HandshakeResult:
        if p.protocol_version != PROTOCOL_VERSION:
            raise _mismatch(p.protocol_version)
        self.handshaken = True
        return HandshakeResult(
            protocol_version=PROTOCOL_VERSION,
            host_version=__version__,
            methods=sorted({*self.handlers, "handshake", "$/cancelRequest"}),
        )

    def _cancel(self, params_raw: Raw | bytes) -> None:
        try:
            rid = decode(CANCEL, params_raw).id
        except msgspec.MsgspecError as exc:  # a notification's error is never sent
            raise InvalidParams(f"$/cancelRequest: {exc}") from None
        call = self.calls.get(_key(rid))
        if call is None or call.started:
            return  # unknown, finished, or started: a started write finishes atomically
        call.cancel_requested = True
        if call.running and call.task is not None:
            call.task.cancel("$/cancelRequest")  # waiting for its lock: wake it to answer
        # a task that has not taken its first step sees cancel_requested when it does

    # -- calls ----------------------------------------------------------------------

    async def _run(
        self,
        call: CallState,
        handler: Handler,
        params: Any,
        rid: Any,
        note: bool,
        reply: bool,
        tally: _Tally | None,
    ) -> bytes | None:
        """Run one call once the gate lets it start; send its answer when ``reply`` (else
        a batch collects it)."""
        CURRENT_CALL.set(call)
        call.ran()
        call.running = True
        big = call.method in self.big_results
        admitted = False
        t0 = time.perf_counter()
        ok = False
        try:
            try:
                if call.cancel_requested:
                    raise asyncio.CancelledError("$/cancelRequest")
                await self._admit(big)
                admitted = True
                t0 = time.perf_counter()
                body, ok = await self._answer(call.method, handler, params, rid, tally, big)
            except asyncio.CancelledError:
                if not (call.cancel_requested and not call.started):
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                body = _error(rid, RequestCancelled("cancelled before it started").to_object())
            finally:
                self.stats.record(call.method, time.perf_counter() - t0, ok)
                if not note and self.calls.get(_key(rid)) is call:
                    del self.calls[_key(rid)]
            if note:
                return None
            if reply:
                self._write(body)
        finally:
            if admitted and big:  # its answer is with the writer (or its batch): the next
                self._big -= 1
                self._open_gate()
        if reply:
            await self._drain()
        return body

    async def _answer(
        self, method: str, handler: Handler, params: Any, rid: Any, tally: _Tally | None, big: bool
    ) -> tuple[bytes, bool]:
        """Run the handler; return its answer line (an error's too) and whether it is a result.

        A read in a batch whose answers already pass 64 MiB does not run: the batch answer
        could not hold it, and holding it would take the connection past any bound.
        """
        try:
            if tally is not None and big and tally.bytes > MAX_LINE:
                raise LimitExceeded("batch response over 64 MiB: send these calls on their own")
            body = _result(rid, await handler(params))
            if len(body) > MAX_LINE:
                err = LimitExceeded("result over 64 MiB: page with limit/beforeLine")
                body, ok = _error(rid, err.to_object()), False
            else:
                ok = True
        except Exception as exc:
            body, ok = _error(rid, to_error_object(exc, method)), False
        if tally is not None:
            tally.bytes += len(body)
        return body, ok

    # -- flow control ---------------------------------------------------------------

    async def _admit(self, big: bool) -> None:
        """Wait, in arrival order, until this call may start.

        Calls start while the client takes its answers (the writer is not paused), and
        one of :attr:`big_results` at a time: its answer, which its request does not
        bound, is with the writer before the next is made. A client that stops reading
        stops its own calls, never another connection's (no lock is held here).
        """
        if not self._gate and self._may_start(big):
            self._big += big
            return
        entry = (asyncio.get_running_loop().create_future(), big)
        self._gate.append(entry)
        self.stats.waiting += 1
        try:
            await entry[0]
        except BaseException:
            if entry[0].done() and not entry[0].cancelled():  # let in, then cancelled
                self._big -= big
                self._open_gate()
            elif entry in self._gate:
                self._gate.remove(entry)
                self._open_gate()  # it may have held up the calls behind it
            raise
        finally:
            self.stats.waiting -= 1

    def waiting(self) -> bool:
        """Whether calls wait for the client to read its answers."""
        return bool(self._gate)

    def _may_start(self, big: bool) -> bool:
        return (self.closed or not self._writer_paused) and not (big and self._big)

    def _open_gate(self) -> None:
        """Let the calls at the head of the gate start, in order, while they may."""
        while self._gate:
            fut, big = self._gate[0]
            if fut.done():  # cancelled while waiting
                self._gate.popleft()
                continue
            if not self._may_start(big):
                return
            self._gate.popleft()
            self._big += big
            fut.set_result(None)

    def writer_paused(self, paused: bool) -> None:
        """The writer's client left more than ``ANSWERS_WAITING`` bytes unread (``True``),
        or read them down to :data:`ANSWERS_RESUME` (``False``)."""
        self._writer_paused = paused
        if paused:
            self._flow()
        else:
            self._open_gate()
            asyncio.get_running_loop().call_soon(self._flow)  # not inside the transport's call

    def writer_gone(self) -> None:
        """The client went away: nothing more can reach it; calls still run (writes land)."""
        self.closed = True
        self._open_gate()
        asyncio.get_running_loop().call_soon(self._flow)

    async def _finish_batch(self, parts: list[bytes | asyncio.Task[bytes | None] | None]) -> None:
        out: list[bytes] = []
        for part in parts:
            body = await part if isinstance(part, asyncio.Task) else part
            if body is not None:
                out.append(body)
        if out:
            await self.send(_fit_batch(out))

    # -- output ---------------------------------------------------------------------

    def error_now(self, error: dict[str, Any]) -> None:
        """Write an error object that answers no request (``id: null``), now."""
        self._write(_error(None, error))

    async def send(self, body: bytes) -> None:
        """Send one reply line, whole (lines never interleave), then drain."""
        self._write(body)
        await self._drain()

    def _write(self, body: bytes) -> None:
        """Queue one reply line for the writer.

        With other calls in flight, replies queued in one pass of the loop go out in one
        ``write`` at its end (a backlog's answers cost one system call, not one each); a
        long one goes at once, so the writer knows of it before another call starts.
        """
        if self.closed:
            return
        if len(body) > READ_BUFFER:  # not copied into a joined write: 16 MiB is 16 MiB
            self._flush()
            self._out += (body, b"\n")
            self._flush(join=False)
            return
        self._out += (body, b"\n")
        if self._flushing is None:
            if len(self.tasks) <= 1:
                self._flush()
            else:
                self._flushing = asyncio.get_running_loop().call_soon(self._flush)

    async def _drain(self) -> None:
        """Wait while the client reads too slowly."""
        try:
            await self.writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._gone(exc)

    def _flush(self, *, join: bool = True) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
            self._flushing = None
        pieces, self._out = ([b"".join(self._out)] if join else self._out), []
        for data in pieces:
            if data and not self.closed:
                try:
                    self.writer.write(data)
                except (ConnectionError, RuntimeError) as exc:
                    self._gone(exc)

    def _gone(self, exc: BaseException) -> None:
        if not self.closed:
            log.info("client went away before a reply could be sent: %s", exc)
            self.writer_gone()

    def _ended(self, call: CallState, task: asyncio.Future[Any]) -> None:
        call.ran()
        call.task = None  # the task's context holds the call: no cycle left for the GC
        self._discard(task)

    def _discard(self, task: asyncio.Future[Any]) -> None:
        self.tasks.discard(task)
        if self._pausing:
            self._flow()

    def _spawn_send(self, body: bytes) -> None:
        self._spawn(self.send(body))

    def _spawn(self, coro: Awaitable[None]) -> None:
        self._track(asyncio.ensure_future(coro))

    def _track(self, task: asyncio.Future[Any]) -> None:
        self.tasks.add(task)
        self._last = task
        task.add_done_callback(self._discard)

    async def finish(self) -> None:
        """Wait for every call in flight and every reply to be written."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        self._flush()
        if self._pausing:  # the connection is done: it no longer counts as paused
            self._pausing = False
            self.stats.paused -= 1


class _Tally:
    """The answer bytes a batch has collected so far."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


def _head_id(head: bytes) -> Any:
    """The id of a request from its first bytes (a line dropped unread), else ``None``.

    Each prefix that ends before a comma, closed with ``}``, is tried in turn: one that
    decodes is an object of the request's first members, so its ``id`` is the request's.
    An id after ``params`` (or not in ``head``) is not found.
    """
    end = head.find(b",")
    for _ in range(64):
        if end < 0:
            return None
        try:
            rid = ID_ONLY.decode(head[:end] + b"}").id
        except msgspec.MsgspecError:
            rid = None
        if isinstance(rid, int | str) and not isinstance(rid, bool):
            return rid
        end = head.find(b",", end + 1)
    return None


class _AnyVersion(msgspec.Struct, rename="camel"):
    protocol_version: Any = UNSET


_ANY_VERSION = msgspec.json.Decoder(_AnyVersion)


def _one_pass(item: bytes) -> tuple[str, Struct, Any] | None:
    """``(method, params, id)`` of a valid request decoded in one pass, else ``None``.

    ``None`` sends the request the two-phase way, which alone decides its error.
    """
    try:
        req = decode(REQUEST, item)
    except (msgspec.MsgspecError, RecursionError):
        return None
    if req.jsonrpc != "2.0" or req.params is UNSET:
        return None
    return REQUEST_TYPES[type(req)], req.params, req.id


def _split(item: bytes, methods: Container[str]) -> tuple[str, Struct, Any] | None:
    """``(method, params, id)`` of a big request decoded but for its ``message``, else ``None``.

    The line must be a request (with an id) of one of ``methods``, ending with its
    message, an object, and the braces that close the params and the request, with no
    space between (the bytes are then the ones the message's ``Raw`` would hold, no more).
    The rest of it, with ``null`` in the message's place, is decoded as usual; the message
    becomes a ``Raw`` view of its bytes, not yet proved JSON: the call proves it on a
    thread while it writes it, so a 1 MB snapshot is scanned once, beside its write,
    instead of once before it.

    Exact: the head holds no backslash and ``"message"`` just once, so whatever a decoder
    does with a repeated or escaped key, the key found is the params' only ``message``,
    and ``null`` decoding there proves it is one. The line is then this request exactly
    when the bytes are one JSON value (``tests/host/test_split.py``).
    """
    if not item.endswith(b"}}}"):
        return None
    at = item.find(_SPLIT_KEY, 0, _SPLIT_HEAD)
    start = at + len(_SPLIT_KEY)
    if at < 0 or item[start : start + 1] != b"{":
        return None
    head = item[:start]
    if b"\\" in head or head.count(b'"message"') != 1:
        return None
    req = _one_pass(head + b"null}}")
    if req is None or req[0] not in methods or req[2] is UNSET:
        return None
    method, params, rid = req
    if bytes(params.message) != b"null":  # type: ignore[attr-defined]
        return None
    return method, msgspec.structs.replace(params, message=Raw(memoryview(item)[start:-2])), rid


def _fit_batch(out: list[bytes]) -> bytes:
    """The batch answer holding ``out``, within 64 MiB.

    Each answer fits on its own; together they may not. Then the largest answers give way
    to ``LIMIT_EXCEEDED`` errors, each only when its error is shorter than it, so every
    step shrinks the line and there are at most ``len(out)`` of them. When that is not
    enough (answers whose ids alone fill the line), the batch gets one error, ``id: null``.
    """
    size = sum(len(b) + 1 for b in out) + 1
    if size > MAX_LINE:
        err = LimitExceeded("batch response over 64 MiB: send these calls on their own")
        for i in sorted(range(len(out)), key=lambda k: len(out[k]), reverse=True):
            small = _error(ID_ONLY.decode(out[i]).id, err.to_object())
            if len(small) < len(out[i]):
                size -= len(out[i]) - len(small)
                out[i] = small
                if size <= MAX_LINE:
                    break
        if size > MAX_LINE:
            return _error(None, err.to_object())
    return b"[" + b",".join(out) + b"]"


def _parse_error(exc: BaseException) -> bytes:
    return _error(None, ParseError(f"parse error: {exc}").to_object())


def _version_mismatch(params_raw: Raw | bytes) -> None:
    """Raise ``ProtocolMismatch`` when a handshake names a version of the wrong type."""
    try:
        got = decode(_ANY_VERSION, params_raw).protocol_version
    except msgspec.MsgspecError:
        return  # params that are not an object: INVALID_PARAMS
    if got is not UNSET and not (type(got) is int and got == PROTOCOL_VERSION):
        raise _mismatch(got)


def _mismatch(got: Any) -> ProtocolMismatch:
    return ProtocolMismatch(
        f"protocol version {got!r} is not {PROTOCOL_VERSION}", expected=PROTOCOL_VERSION, got=got
    )


def _unknown() -> bool:
    return True  # fed by hand, not by a reader: lines may follow


def _key(rid: Any) -> Hashable:
    return (type(rid).__name__, rid)
