"""The JSON-RPC 2.0 endpoint of one connection; it knows nothing of the transport.

One pipeline serves every request (docs/design.md, "One request pipeline"):

1. :meth:`Connection.read` takes each line the reader hands on and decodes it: the
   one-pass decode for a valid request, the two-phase one to name an invalid one's
   error. A handshake, a cancel and an error are answered at once. A call passes the
   connection's gate (flow control, in arrival order): admitted, it is handed to the
   service (:meth:`Service.submit`), which puts it in its session's queue, now.
2. At the end of each read, :meth:`Connection.run_ready` gives each call of that read a
   task, in order: every step of a call runs in its task. The session's queue alone
   decides when it runs.
3. Its answer is written once it ends; answers written in one pass go out in one write.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Collection, Coroutine, Hashable
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, Raw, Struct

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
from host._surrogates import decode
from host._version import __version__
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
_RAW = msgspec.json.Decoder(Raw)
_EAGER = getattr(asyncio, "eager_task_factory", None)
"""Python 3.12+: a call's task takes its first step at once, in the read callback (as a
task all the same); on 3.11 it takes it in the loop's next pass."""


class Place(Protocol):
    """A call's place in the queues the service put it in (``host._locks.Ticket``)."""

    def run(self) -> Coroutine[Any, Any, Struct]:
        """Wait for the call's turn, run it and leave the queues; return its result."""

    def cancel(self) -> bool:
        """Leave the queues if the call has not started; whether it did."""

    def leave(self) -> None:
        """Leave the queues (idempotent)."""


class Service(Protocol):
    """What a connection serves: the host's methods, behind its session queues."""

    @property
    def methods(self) -> Collection[str]:
        """Every method but ``handshake`` and ``$/cancelRequest``."""

    @property
    def big_results(self) -> Collection[str]:
        """Methods whose answer is not bounded by their request (reads): one at a time."""

    def submit(self, method: str, params: Any, origin: Connection) -> Place:
        """Queue a decoded call on its session, now: its place is its admission
        (``origin``: the connection that asks, which a watch needs)."""


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...


class Reading(Protocol):
    """The reader feeding a connection, which its flow control pauses and resumes."""

    def pause(self) -> None: ...
    def resume(self) -> None: ...


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


class _Call:
    """One decoded call, from its line to its answer."""

    __slots__ = (
        "batch",
        "big",
        "body",
        "ended",
        "method",
        "note",
        "params",
        "place",
        "rid",
        "size",
        "waiting",
    )

    def __init__(
        self, method: str, params: Any, rid: Any, note: bool, batch: _Batch | None
    ) -> None:
        self.method = method
        self.params = params
        self.rid = rid
        self.note = note  # a notification: never answered
        self.batch = batch  # answered in its batch's line (else on its own)
        self.big = False  # one of the service's big_results
        self.place: Place | None = None  # in its session's queues, once admitted
        self.waiting: asyncio.Future[None] | None = None  # at the gate: done when let in
        self.size = 0  # the bytes of its line, held until it ends
        self.body: bytes | None = None  # its answer, once it ended
        self.ended = False


class _Batch:
    """A batch line: its elements' calls and answers, answered as one line."""

    __slots__ = ("bytes", "left", "parts", "size")

    def __init__(self) -> None:
        self.parts: list[_Call | bytes | None] = []
        self.left = 0  # calls not ended
        self.bytes = 0  # of the answers so far
        self.size = 0


class Connection:
    """One client's session with the host: handshake state, calls in flight, replies."""

    def __init__(
        self,
        service: Service,
        stats: Stats,
        writer: Writer,
        *,
        budget: RequestBudget | None = None,
    ) -> None:
        self.service = service
        self.stats = stats
        self.writer = writer
        self.budget = budget or RequestBudget(limit=1 << 62)
        """The host's request bytes: a long line's are held while its calls run."""
        self.reader: Reading | None = None
        """What feeds this connection: paused while its bounds are reached (flow control)."""
        self.handshaken = False
        self.calls: dict[Hashable, _Call] = {}
        self.tasks: set[asyncio.Future[Any]] = set()
        self._ready: deque[_Call] = deque()  # read, with no task yet
        self._running = False  # in run_ready: answers wait for its one write
        self._out: list[bytes] = []  # reply lines not yet written
        self._flushing: asyncio.Handle | None = None
        self.closed = False
        self._held = 0  # request bytes of the lines whose calls are in flight
        self._gate: deque[_Call] = deque()  # waiting for their client to read
        self._big = 0  # calls of big_results running (0 or 1)
        self._writer_paused = False  # the client leaves ANSWERS_WAITING bytes unread
        self._pausing = False  # this connection's flow control paused its reader
        self.outlet: Any = None  # its watches (host/_watch.py): told below

    # -- input ----------------------------------------------------------------------

    def feed(self, line: Line) -> None:
        """Take one line and run what it asks (a reader's lines: :meth:`read`, then
        :meth:`run_ready` once per read)."""
        self.read(line)
        self.run_ready()

    def read(self, line: Line) -> None:
        """Take one line read: answer it now, or admit its calls (their tasks start in
        :meth:`run_ready`).

        Its bytes count as held until its calls end (a batch's, until it is answered);
        a long line's are held in the host's budget too.
        """
        job = self._job(line)
        if job is None:
            return
        if isinstance(line, bytes):
            job.size = len(line)
            self._held += job.size
            if job.size > READ_BUFFER:
                self.budget.hold(job.size)
        if isinstance(job, _Batch):
            self._ready += (p for p in job.parts if isinstance(p, _Call))
        else:
            self._ready.append(job)

    def run_ready(self) -> None:
        """Give each call read so far its task, in arrival order; every call of the read
        is in its session's queue (or at the gate) already, so a backlog read in one go
        is one group. Answers written meanwhile go out in one write."""
        if self._running:
            return  # re-entered (a resumed reader): the loop below takes the new ones
        self._running = True
        died: BaseException | None = None
        try:
            loop = asyncio.get_running_loop()
            while self._ready:
                call = self._ready.popleft()
                coro = self._run(call)
                task = loop.create_task(coro) if _EAGER is None else _EAGER(loop, coro)
                if task.done():  # it ended in its first step (eager tasks, 3.12+)
                    self._task_done(call, task)
                    died = died or task.exception()  # only a dying call's task raised
                else:
                    self.tasks.add(task)
                    task.add_done_callback(functools.partial(self._task_done, call))
        finally:
            self._running = False
            if self._out:
                self._flush()
        self._flow()
        if died is not None:
            raise died

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
                if self.reader is not None:
                    self.reader.pause()
        elif (
            self._pausing
            and len(self.tasks) <= CALLS_IN_FLIGHT // 2
            and self._held <= READ_AHEAD // 2
        ):
            self._pausing = False
            self.stats.paused -= 1
            if self.reader is not None:
                self.reader.resume()

    def _job(self, line: Line) -> _Call | _Batch | None:
        """The call or batch a line asks for, or ``None`` when it was answered at once."""
        if line is TOO_LONG:
            self._write(_error(None, LimitExceeded("request line over 64 MiB").to_object()))
            return None
        if isinstance(line, Refused):
            full = LimitExceeded(
                f"the host holds {REQUEST_BYTES >> 20} MiB of long requests already: send"
                " it again later",
                limit=REQUEST_BYTES,
            )
            self._write(_error(_head_id(line.head), full.to_object()))
            return None
        assert isinstance(line, bytes)
        if not line or line.isspace():  # no copy of a 1 MB line, as strip() would make
            return None  # blank lines between messages are tolerated
        answer: _Call | _Batch | bytes | None
        try:
            answer = self._decode_line(line)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
            answer = _error(None, ParseError(f"parse error: {exc}").to_object())
        except BatchTooLong as exc:
            answer = _error(None, LimitExceeded(str(exc), limit=MAX_BATCH).to_object())
        if isinstance(answer, bytes):
            self._write(answer)
            return None
        return answer

    def _decode_line(self, line: bytes) -> _Call | _Batch | bytes | None:
        """A request, a batch, or the answer to a line that is neither (raises for one
        that is not JSON: a parse error)."""
        if not line.isascii():  # no copy for the usual case
            line.decode("utf-8")  # msgspec does not check UTF-8 inside raw values
        first = line[:1]
        if first.isspace():  # rare: only then a copy
            first = line.lstrip()[:1]
        if first == b"[":
            items = batch_items(line)
            if not items:
                return _error(None, InvalidRequest("empty batch").to_object())
            batch = _Batch()
            batch.parts = [self._element(bytes(i), batch) for i in items]
            batch.left = sum(isinstance(p, _Call) for p in batch.parts)
            if batch.left:
                return batch
            answers = [p for p in batch.parts if isinstance(p, bytes)]
            return _fit_batch(answers) if answers else None
        if first == b"{":
            return self._request(line)
        decode(_RAW, line)  # JSON, but not a request: tell the two apart
        err = InvalidRequest("a request must be a JSON object or a batch array")
        return _error(None, err.to_object())

    def _element(self, item: bytes, batch: _Batch) -> _Call | bytes | None:
        """One element of a batch: its call, or its own answer.

        An element its decoders refuse although the batch decoded (nested too deep for
        the few frames more they run beneath) is answered on its own: raised, it would
        drop the elements before it, already queued on their sessions, for good.
        """
        try:
            return self._request(item, batch)
        except (msgspec.DecodeError, RecursionError) as exc:  # its id, if it comes first
            return _error(_head_id(item[:4096]), ParseError(f"parse error: {exc}").to_object())

    def _request(self, item: bytes, batch: _Batch | None = None) -> _Call | bytes | None:
        """One request decoded: its call, admitted or at the gate, or its answer (``None``:
        a notification's)."""
        req = _one_pass(item) if self.handshaken else None
        if req is None or req[0] not in self.service.methods:
            two = self._two_phase(item)
            if not isinstance(two, tuple):
                return two
            req = two
        method, params, rid = req
        note = rid is UNSET
        call = _Call(method, params, None if note else rid, note, batch)
        if not note:
            self.calls[_key(rid)] = call
        self._enter(call)
        return call

    def _two_phase(self, item: bytes) -> tuple[str, Any, Any] | bytes | None:
        """Decode the envelope, then the params: ``(method, params, id)`` of a call, or the
        answer of anything else (an error, a handshake, a cancel; ``None``: unanswered)."""
        try:
            env = decode(ENVELOPE, item)  # a DecodeError (not JSON) goes up to read()
        except msgspec.ValidationError as exc:
            return _invalid(item, exc)
        note = env.id is UNSET
        rid = None if note else env.id
        if env.jsonrpc != "2.0":
            return _error(rid, InvalidRequest('"jsonrpc" must be "2.0"').to_object())
        method = env.method
        try:
            result = self._control(method, b"{}" if env.params is UNSET else env.params)
        except HostError as exc:
            known = method in self.service.methods or method in _CONTROL
            self.stats.record(method if known else "(unknown method)", 0.0, False)
            return None if note else _error(rid, exc.to_object())
        if isinstance(result, tuple):
            return method, result[0], env.id
        return None if note else _result(rid, result)

    def _control(self, method: str, params_raw: Raw | bytes) -> tuple[Any] | Struct | None:
        """A handshake's or cancel's answer, or ``(params,)`` of a call to queue."""
        if not self.handshaken and method != "handshake":
            raise NotHandshaken(f"{method}: handshake first")
        if method == "$/cancelRequest":
            self._cancel(params_raw)
            return None
        if method not in self.service.methods and method != "handshake":
            raise MethodNotFound(f"unknown method {method!r}")
        try:
            params = decode(DECODERS[method], params_raw)
        except msgspec.ValidationError as exc:
            if method == "handshake":
                _version_mismatch(params_raw)  # "11" or 11.0 is not exactly 11
            raise InvalidParams(f"{method}: {exc}") from None
        if method != "handshake":
            return (params,)
        result = self._handshake(params)
        self.stats.record(method, 0.0, True)
        return result

    def _handshake(self, p: HandshakeParams) -> HandshakeResult:
        if p.protocol_version != PROTOCOL_VERSION:
            raise _mismatch(p.protocol_version)
        self.handshaken = True
        return HandshakeResult(
            protocol_version=PROTOCOL_VERSION,
            host_version=__version__,
            methods=sorted({*self.service.methods, *_CONTROL}),
        )

    def _cancel(self, params_raw: Raw | bytes) -> None:
        try:
            rid = decode(CANCEL, params_raw).id
        except msgspec.MsgspecError as exc:  # a notification's error is never sent
            raise InvalidParams(f"$/cancelRequest: {exc}") from None
        call = self.calls.get(_key(rid))
        if call is None:
            return  # unknown or finished
        if call.place is not None:
            call.place.cancel()  # a started call finishes: a started write is atomic
        elif call in self._gate:
            self._leave_gate(call)

    # -- calls ----------------------------------------------------------------------

    async def _run(self, call: _Call) -> None:
        """Run one call in its task: wait at the gate if it must, then for its turn in
        its session's queues; send its answer (an error's too) on its own line, or in its
        batch's once that is complete.

        A read in a batch whose answers already pass 64 MiB does not run: the batch answer
        could not hold it, and holding it would take the connection past any bound.
        """
        if call.waiting is not None:
            await call.waiting  # let in, or cancelled while it waited
        t0 = time.perf_counter()
        rid, batch = call.rid, call.batch
        try:
            if call.place is None:
                raise RequestCancelled("cancelled before it started")
            if batch is not None and call.big and batch.bytes > MAX_LINE:
                call.place.leave()
                raise LimitExceeded("batch response over 64 MiB: send these calls on their own")
            body = _result(rid, await call.place.run())
            if len(body) > MAX_LINE:
                err = LimitExceeded("result over 64 MiB: page with limit/beforeLine")
                body, ok = _error(rid, err.to_object()), False
            else:
                ok = True
        except Exception as exc:
            body, ok = _error(rid, to_error_object(exc, call.method)), False
        self.stats.record(call.method, time.perf_counter() - t0, ok)
        if batch is not None:
            batch.bytes += len(body)
        call.body = None if call.note else body
        if self._end(call):
            await self._drain()

    def _end(self, call: _Call) -> bool:
        """The call is over, however it ended (idempotent): its answer goes to the writer
        (its batch's once the batch's last call ended), its places are given up. Whether
        a line was written."""
        if call.ended:
            return False
        call.ended = True
        if not call.note and self.calls.get(_key(call.rid)) is call:
            del self.calls[_key(call.rid)]
        if call.batch is not None:
            wrote = self._batch_done(call.batch)
        else:
            wrote = call.body is not None
            if call.body is not None:
                self._write(call.body)
            self._job_done(call)
        if call.place is None:
            if call in self._gate:  # its task was cancelled there
                self._leave_gate(call)
        else:
            call.place.leave()  # given up already, unless its task was cancelled
            call.place = None
            if call.big:  # its answer is with the writer (or its batch): the next read may go
                self._big -= 1
                self._open_gate()
        return wrote

    def _batch_done(self, batch: _Batch) -> bool:
        """One call of ``batch`` ended: answer the batch if it was the last one."""
        batch.left -= 1
        if batch.left:
            return False
        answers = [p.body if isinstance(p, _Call) else p for p in batch.parts]
        batch.parts = []  # no cycle left for the collector
        bodies = [b for b in answers if b is not None]
        if bodies:
            self._write(_fit_batch(bodies))
        self._job_done(batch)
        return bool(bodies)

    def _task_done(self, call: _Call, task: asyncio.Future[Any]) -> None:
        self.tasks.discard(task)
        if not call.ended:  # its task was cancelled before its first step, or died
            self._end(call)
        if not self._running:
            self._flow()

    def _job_done(self, job: _Call | _Batch) -> None:
        self._held -= job.size
        if job.size > READ_BUFFER:
            self.budget.give(job.size)

    # -- flow control ---------------------------------------------------------------

    def _enter(self, call: _Call) -> None:
        """Admit a call now if the gate lets it, else queue it there, in arrival order.

        Calls start while the client takes its answers (the writer is not paused), and
        one of :attr:`big_results` at a time: its answer, which its request does not
        bound, is with the writer before the next is admitted. A call waiting here is in
        no session's queue: a client that stops reading stops its own calls, never
        another connection's, and its later calls wait here behind it.
        """
        call.big = call.method in self.service.big_results
        if not self._gate and self._may_start(call.big):
            self._admit(call)
        else:
            call.waiting = asyncio.get_running_loop().create_future()
            self._gate.append(call)
            self.stats.waiting += 1

    def _admit(self, call: _Call) -> None:
        self._big += call.big
        call.place = self.service.submit(call.method, call.params, self)

    def _leave_gate(self, call: _Call) -> None:
        """Take a call out of the gate unadmitted (cancelled): it answers as such."""
        self._gate.remove(call)
        self.stats.waiting -= 1
        if call.waiting is not None and not call.waiting.done():
            call.waiting.set_result(None)
        self._open_gate()  # it may have held up the calls behind it

    def waiting(self) -> bool:
        """Whether calls wait for the client to read its answers."""
        return bool(self._gate)

    def _may_start(self, big: bool) -> bool:
        return (self.closed or not self._writer_paused) and not (big and self._big)

    def _open_gate(self) -> None:
        """Admit the calls at the head of the gate, in order, while they may start."""
        while self._gate and self._may_start(self._gate[0].big):
            call = self._gate.popleft()
            self.stats.waiting -= 1
            self._admit(call)
            if call.waiting is not None and not call.waiting.done():
                call.waiting.set_result(None)

    def writer_paused(self, paused: bool) -> None:
        """The writer's client left more than ``ANSWERS_WAITING`` bytes unread (``True``),
        or read them down to :data:`ANSWERS_RESUME` (``False``)."""
        self._writer_paused = paused
        if paused:
            if self.outlet is not None:  # what its watchers are sent waits
                self.outlet.paused()
            self._flow()
        else:
            self._open_gate()
            asyncio.get_running_loop().call_soon(self._flow)  # not inside the transport's call
            if self.outlet is not None:  # its watchers' queued events go on
                self.outlet.writable()

    def writer_gone(self) -> None:
        """The client went away: nothing more can reach it; calls still run (writes land)."""
        self.closed = True
        if self.outlet is not None:  # its watches end
            self.outlet.gone()
        self._open_gate()
        asyncio.get_running_loop().call_soon(self._flow)

    # -- output ---------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """Whether its client takes more now (its watchers' events wait if not)."""
        return not self._writer_paused and not self.closed

    def notify(self, data: bytes) -> None:
        """Write notification lines, behind the answers queued so far."""
        if self._out:
            self._flush()
        if not self.closed:
            try:
                self.writer.write(data)
            except (ConnectionError, RuntimeError) as exc:
                self._gone(exc)

    def error_now(self, error: dict[str, Any]) -> None:
        """Write an error object that answers no request (``id: null``), now."""
        self._write(_error(None, error))

    def _write(self, body: bytes) -> None:
        """Queue one reply line for the writer.

        Replies made while a read's calls are given their tasks go out in one ``write``
        at its end; with other calls in flight, those of one pass of the loop at its end
        (a backlog's answers cost one system call, not one each). A long one goes at once, so the
        writer knows of it before another call starts.
        """
        if self.closed:
            return
        if len(body) > READ_BUFFER:  # not copied into a joined write: 16 MiB is 16 MiB
            self._flush()
            self._out += (body, b"\n")
            self._flush(join=False)
            return
        self._out += (body, b"\n")
        if self._flushing is None and not self._running:  # run_ready writes at its end
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

    async def finish(self) -> None:
        """Wait for every call in flight and every reply to be written.

        Cancelling this wait cancels no call (``asyncio.wait``, not ``gather``): a call
        that has started runs to its end whatever happens to its client.
        """
        if self.outlet is not None:  # no event after end of input
            self.outlet.gone()
        while self.tasks:
            await asyncio.wait(list(self.tasks))
        self._flush()
        if self._pausing:  # the connection is done: it no longer counts as paused
            self._pausing = False
            self.stats.paused -= 1


_CONTROL = ("handshake", "$/cancelRequest")


def _invalid(item: bytes, exc: msgspec.ValidationError) -> bytes:
    """The answer to JSON that is no request (raises ``DecodeError`` if it is no JSON)."""
    decode(_RAW, item)  # a type error seen before a truncation is still not JSON
    try:
        rid = decode(ID_ONLY, item).id
    except msgspec.MsgspecError:
        rid = None
    if not isinstance(rid, int | str) or isinstance(rid, bool):
        rid = None
    return _error(rid, InvalidRequest(f"invalid request: {exc}").to_object())


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
        except (msgspec.MsgspecError, RecursionError):  # a prefix nested too deep: no id
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


def _key(rid: Any) -> Hashable:
    return (type(rid).__name__, rid)
