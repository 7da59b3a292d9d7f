"""The JSON-RPC 2.0 endpoint of one connection; it knows nothing of the transport.

One pipeline serves every request (docs/design.md, "One request pipeline"):

1. :meth:`Connection.read` takes each line the reader hands on and decodes it: the
   one-pass decode for a valid request, the two-phase one to name an invalid one's
   error. A handshake, a cancel and an error are answered at once; a call is handed to
   the service (:meth:`Service.submit`), which queues it on its session in arrival order.
2. At the end of each read, :meth:`Connection.run_ready` starts the calls of that read in
   order. Each runs at once, in the read callback, as far as it can: a call that finds
   its session idle and needs nothing but the loop ends there (*inline*); one that must
   wait (its session busy, a thread, the index) goes on as a task (*queued*).
3. Its answer is written once it ends; answers written in one pass go out in one write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Collection, Coroutine, Generator, Hashable
from collections.abc import Coroutine as CoroutineABC
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, Raw, Struct

from host._call import CallState
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


class Service(Protocol):
    """What a connection serves: the host's methods, behind its session queues."""

    @property
    def methods(self) -> Collection[str]:
        """Every method but ``handshake`` and ``$/cancelRequest``."""

    @property
    def big_results(self) -> Collection[str]:
        """Methods whose answer is not bounded by their request (reads): one at a time."""

    def submit(self, method: str, params: Any, call: CallState) -> Coroutine[Any, Any, Struct]:
        """Queue a decoded call, now (its place is its arrival), and return what runs it."""


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
        self.inline = 0  # calls that ended in the read callback that started them
        self.queued = 0  # calls that had to wait, and went on as a task

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

    __slots__ = ("body", "coro", "note", "reply", "rid", "size", "state", "tally")

    def __init__(
        self,
        state: CallState,
        coro: Coroutine[Any, Any, Struct],
        rid: Any,
        *,
        note: bool,
        reply: bool,
        tally: _Tally | None,
    ) -> None:
        self.state = state
        self.coro = coro
        self.rid = rid
        self.note = note  # a notification: never answered
        self.reply = reply  # answered on its own line (else its batch's)
        self.tally = tally
        self.size = 0  # the bytes of its line, held until it ends
        self.body: bytes | None = None  # its answer, once it ended


class _Batch:
    """A batch line: its elements' calls and answers, answered as one line."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[_Call | bytes | None]) -> None:
        self.parts = parts
        self.size = 0


class _Rest(CoroutineABC[Any, Any, Any]):
    """The rest of a coroutine whose first step ran in a read callback, for a task.

    Its first step hands the task what that step waits for; from then on it passes on
    what the task sends or throws (a cancel before the task's first step included).
    asyncio 3.11 has no eager tasks: this is the one piece of one.
    """

    __slots__ = ("coro", "first", "waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting
        self.first = True

    def send(self, value: Any) -> Any:
        if self.first:
            self.first = False
            return self.waiting
        return self.coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self.first = False
        return self.coro.throw(typ if val is None else val)

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        raise TypeError("a task's coroutine, not to be awaited")


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
        self.reader: Reading = _Unpaused()
        """What feeds this connection: paused while its bounds are reached (flow control)."""
        self.handshaken = False
        self.calls: dict[Hashable, CallState] = {}
        self.tasks: set[asyncio.Future[Any]] = set()
        self._ready: deque[_Call | _Batch] = deque()  # read, not yet started
        self._running = False  # in run_ready: answers wait for its one write
        self._out: list[bytes] = []  # reply lines not yet written
        self._flushing: asyncio.Handle | None = None
        self.closed = False
        self._held = 0  # request bytes of the lines whose calls are in flight
        self._gate: deque[tuple[asyncio.Future[None], bool, CallState]] = deque()  # waiting
        self._big = 0  # calls of big_results running (0 or 1)
        self._writer_paused = False  # the client leaves ANSWERS_WAITING bytes unread
        self._pausing = False  # this connection's flow control paused its reader

    # -- input ----------------------------------------------------------------------

    def feed(self, line: Line) -> None:
        """Take one line and run what it asks (a reader's lines: :meth:`read`, then
        :meth:`run_ready` once per read)."""
        self.read(line)
        self.run_ready()

    def read(self, line: Line) -> None:
        """Take one line read: answer it now, or queue its calls for :meth:`run_ready`.

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
        self._ready.append(job)

    def run_ready(self) -> None:
        """Start the calls read so far, in arrival order: each runs at once as far as it
        can (see the module's doc); their answers go out in one write."""
        if self._running:
            return  # re-entered (a resumed reader): the loop below takes the new ones
        self._running = True
        try:
            while self._ready:
                job = self._ready.popleft()
                if isinstance(job, _Batch):
                    self._run_batch(job)
                else:
                    self._start(job)
        finally:
            self._running = False
            self._flush()
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
            tally = _Tally()
            return _Batch([self._element(bytes(i), tally) for i in items])
        if first == b"{":
            return self._request(line, reply=True)
        decode(_RAW, line)  # JSON, but not a request: tell the two apart
        err = InvalidRequest("a request must be a JSON object or a batch array")
        return _error(None, err.to_object())

    def _element(self, item: bytes, tally: _Tally) -> _Call | bytes | None:
        """One element of a batch: its call, or its own answer.

        An element its decoders refuse although the batch decoded (nested too deep for
        the few frames more they run beneath) is answered on its own: raised, it would
        drop the elements before it, already queued on their sessions, for good.
        """
        try:
            return self._request(item, reply=False, tally=tally)
        except (msgspec.DecodeError, RecursionError) as exc:
            return _error(None, ParseError(f"parse error: {exc}").to_object())

    def _request(
        self, item: bytes, *, reply: bool, tally: _Tally | None = None
    ) -> _Call | bytes | None:
        """One request decoded: its call, or its answer (``None``: a notification's)."""
        req = _one_pass(item) if self.handshaken else None
        if req is None or req[0] not in self.service.methods:
            two = self._two_phase(item)
            if not isinstance(two, tuple):
                return two
            req = two
        method, params, rid = req
        note = rid is UNSET
        state = CallState(method)
        call = _Call(
            state,
            self.service.submit(method, params, state),
            None if note else rid,
            note=note,
            reply=reply,
            tally=tally,
        )
        if not note:
            self.calls[_key(rid)] = state
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
        if call is None or call.started:
            return  # unknown, finished, or started: a started write finishes atomically
        call.cancel_requested = True  # removed from its queue when it is reached
        if call.task is not None:
            call.task.cancel("$/cancelRequest")  # waiting in its queue: wake it to answer

    # -- calls ----------------------------------------------------------------------

    def _start(self, call: _Call) -> None:
        """Run a call's first step now; it ends here (inline) or goes on as a task."""
        coro = self._run(call)
        try:
            waiting = coro.send(None)
        except StopIteration:
            self.stats.inline += 1
            self._job_done(call)
            return
        except BaseException:  # not a handler's error (those are answers): the process's
            self._job_done(call)
            raise
        self.stats.queued += 1
        task = asyncio.get_running_loop().create_task(_Rest(coro, waiting))
        call.state.task = task
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, call))

    def _task_done(self, task: asyncio.Future[Any], call: _Call | _Batch) -> None:
        if isinstance(call, _Call):
            call.state.task = None  # no cycle left for the GC
        self.tasks.discard(task)
        self._job_done(call)

    def _job_done(self, job: _Call | _Batch) -> None:
        self._held -= job.size
        if job.size > READ_BUFFER:
            self.budget.give(job.size)
        if not self._running:
            self._flow()

    async def _run(self, call: _Call) -> None:
        """Run one call once the gate lets it start; send its answer when it has a line of
        its own (else its batch collects it)."""
        state = call.state
        state.running = True
        big = state.method in self.service.big_results
        admitted = False
        t0 = time.perf_counter()
        ok = False
        try:
            try:
                if state.cancel_requested:
                    raise asyncio.CancelledError("$/cancelRequest")
                if self._gate or not self._may_start(big):
                    await self._admit(big, state)
                else:
                    self._big += big
                admitted = True
                t0 = time.perf_counter()
                body, ok = await self._answer(call, big)
            except asyncio.CancelledError:
                if not (state.cancel_requested and not state.started):
                    raise
                if (task := asyncio.current_task()) is not None and task is state.task:
                    task.uncancel()
                body = _error(call.rid, RequestCancelled("cancelled before it started").to_object())
            finally:
                call.coro.close()  # one cancelled before it ran never runs
                state.end()  # its places in the session queues are given up
                self.stats.record(state.method, time.perf_counter() - t0, ok)
                if not call.note and self.calls.get(_key(call.rid)) is state:
                    del self.calls[_key(call.rid)]
            if not call.note:
                call.body = body
                if call.reply:
                    self._write(body)
        finally:
            if admitted and big:  # its answer is with the writer (or its batch): the next
                self._big -= 1
                self._open_gate()
        if call.reply:
            await self._drain()

    async def _answer(self, call: _Call, big: bool) -> tuple[bytes, bool]:
        """Run the call; return its answer line (an error's too) and whether it is a result.

        A read in a batch whose answers already pass 64 MiB does not run: the batch answer
        could not hold it, and holding it would take the connection past any bound.
        """
        rid, tally = call.rid, call.tally
        try:
            if tally is not None and big and tally.bytes > MAX_LINE:
                raise LimitExceeded("batch response over 64 MiB: send these calls on their own")
            body = _result(rid, await call.coro)
            if len(body) > MAX_LINE:
                err = LimitExceeded("result over 64 MiB: page with limit/beforeLine")
                body, ok = _error(rid, err.to_object()), False
            else:
                ok = True
        except Exception as exc:
            body, ok = _error(rid, to_error_object(exc, call.state.method)), False
        if tally is not None:
            tally.bytes += len(body)
        return body, ok

    def _run_batch(self, batch: _Batch) -> None:
        """Start a batch's calls in order; answer it once the last one ends."""
        calls = [p for p in batch.parts if isinstance(p, _Call)]
        for i, call in enumerate(calls):
            try:
                self._start(call)
            except BaseException:  # as in _start: the calls behind it give up their places
                for rest in calls[i + 1 :]:
                    rest.coro.close()
                    rest.state.end()
                self._job_done(batch)
                raise
        pending = [c.state.task for c in calls if c.state.task is not None]
        if not pending:
            self._answer_batch(batch)
            self._job_done(batch)
            return
        task = asyncio.get_running_loop().create_task(self._finish_batch(batch, pending))
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, batch))

    async def _finish_batch(self, batch: _Batch, pending: list[asyncio.Task[object]]) -> None:
        await asyncio.gather(*pending, return_exceptions=True)
        self._answer_batch(batch)
        await self._drain()

    def _answer_batch(self, batch: _Batch) -> None:
        out = [p.body if isinstance(p, _Call) else p for p in batch.parts]
        bodies = [b for b in out if b is not None]
        if bodies:
            self._write(_fit_batch(bodies))

    # -- flow control ---------------------------------------------------------------

    async def _admit(self, big: bool, state: CallState) -> None:
        """Wait, in arrival order, until this call may start.

        Calls start while the client takes its answers (the writer is not paused), and
        one of :attr:`big_results` at a time: its answer, which its request does not
        bound, is with the writer before the next is made. A client that stops reading
        stops its own calls, never another connection's: a call waiting here is out of
        its session queues (:meth:`CallState.step_out`), and back in, last, once let in.
        """
        entry = (asyncio.get_running_loop().create_future(), big, state)
        self._gate.append(entry)
        state.step_out()
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
            fut, big, state = self._gate[0]
            if fut.done():  # cancelled while waiting
                self._gate.popleft()
                continue
            if not self._may_start(big):
                return
            self._gate.popleft()
            self._big += big
            state.step_in()  # now, before any call read later is queued
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

    # -- output ---------------------------------------------------------------------

    def error_now(self, error: dict[str, Any]) -> None:
        """Write an error object that answers no request (``id: null``), now."""
        self._write(_error(None, error))

    def _write(self, body: bytes) -> None:
        """Queue one reply line for the writer.

        The replies of one read's calls go out in one ``write`` once they are started;
        with other calls in flight, those of one pass of the loop at its end (a backlog's
        answers cost one system call, not one each). A long one goes at once, so the
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
