/**
 * One connection to a hostcore host: spawn `python -m host serve` or connect to its Unix
 * socket, then call its methods, typed by the schema.
 *
 * Requests are NDJSON lines, answers are matched by id (they may come back in any order).
 * Every call has a deadline; when it passes the call fails with {@link DeadlineExceeded} and
 * the client sends `$/cancelRequest`. When the host goes away every call still waiting fails
 * with {@link HostGone}. `watch` follows a session's changes (`session.event`
 * notifications) as an async iterator that re-reads after a reset and resumes by itself
 * after a reconnect (`watch.ts`). Writes respect the stream's backpressure (a line is handed over
 * only while the stream takes more, the rest waits for `'drain'`), and answers are read
 * the whole time, so a large request never stalls the answers to earlier ones.
 *
 *     Error
 *     ├── HostGone          the host process or socket went away (or the client closed it)
 *     ├── DeadlineExceeded  a call's deadline passed; `$/cancelRequest` was sent
 *     ├── RequestTooLarge   a request line over the host's 64 MiB limit: never sent
 *     └── RpcError          the host answered with a JSON-RPC error (`code`, `data.code`)
 */

import { spawn, type ChildProcess } from "node:child_process";
import { connect as netConnect, type Socket } from "node:net";
import type { Readable, Writable } from "node:stream";

import { LineSplitter } from "./framing.js";
import {
  MAX_LINE_BYTES,
  type CancelNotification,
  type ErrorObject,
  type Methods,
  type Request,
  type Response,
  type SessionEventNotification,
} from "./protocol.js";
import { Inbox, Watch, type WatchOptions } from "./watch.js";

/** A method the host serves. */
export type MethodName = keyof Methods;
/** The params of method `M`. */
export type Params<M extends MethodName> = Methods[M]["params"];
/** The result of method `M`. */
export type Result<M extends MethodName> = Methods[M]["result"];
/** The stable name of an error (`error.data.code`). */
export type ErrorName = ErrorObject["data"]["code"];
/** The error object the host sends with the name `N`. */
export type ErrorOf<N extends ErrorName> = Extract<ErrorObject, { data: { code: N } }>;

/** Default deadline of a call, as the producer side uses (PROTOCOL.md). */
export const DEFAULT_DEADLINE_MS = 130_000;
const STDERR_TAIL = 8192;

/** Raised when the host went away before answering (or the client closed it). */
export class HostGone extends Error {
  override readonly name = "HostGone";
  /** The host's exit status, when this client spawned it and it exited. */
  readonly exitCode: number | null;
  /** The signal that ended the host (`"SIGKILL"` for a kill -9). */
  readonly signal: NodeJS.Signals | null;
  /** The end of what the host wrote to stderr, when this client spawned it. */
  readonly stderrTail: string;

  constructor(
    message: string,
    exitCode: number | null = null,
    signal: NodeJS.Signals | null = null,
    stderrTail = "",
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.exitCode = exitCode;
    this.signal = signal;
    this.stderrTail = stderrTail;
  }
}

/** Raised when a call's deadline passed; `$/cancelRequest` was sent for it. */
export class DeadlineExceeded extends Error {
  override readonly name = "DeadlineExceeded";
  constructor(
    readonly method: string,
    readonly deadlineMs: number,
  ) {
    super(`${method}: no answer within ${deadlineMs} ms (a $/cancelRequest was sent)`);
  }
}

/** Raised when a request's line would exceed the host's limit; it was not sent. */
export class RequestTooLarge extends Error {
  override readonly name = "RequestTooLarge";
  constructor(
    readonly method: string,
    readonly bytes: number,
  ) {
    super(`${method}: request line of ${bytes} bytes is over the host's ${MAX_LINE_BYTES}`);
  }
}

/** Raised when the host answered a call with an error object. */
export class RpcError<E extends ErrorObject = ErrorObject> extends Error {
  override readonly name = "RpcError";
  readonly method: string;
  readonly error: E;

  constructor(method: string, error: E) {
    super(`${method}: ${error.data.code} (${error.code}): ${error.message}`);
    this.method = method;
    this.error = error;
  }

  /** The JSON-RPC error code (for example -32004). */
  get code(): E["code"] {
    return this.error.code;
  }

  /** The error's `data`; `data.code` is the stable name. */
  get data(): E["data"] {
    return this.error.data;
  }

  /** Whether this is the error named `name`; narrows `data` to that error's members. */
  is<N extends ErrorName>(name: N): this is RpcError<ErrorOf<N>> {
    return this.error.data.code === name;
  }
}

/** What a trace callback sees: every message sent and received, already as objects. */
export type TraceEvent =
  | { direction: "send"; message: Request | CancelNotification }
  | { direction: "receive"; message: Response; method: MethodName | undefined };

/** A notification the client sends (no `id`, no answer): `session.publish` as a token goes. */
export interface Notification {
  jsonrpc: "2.0";
  method: MethodName;
  params: unknown;
}

export interface ClientOptions {
  /** Deadline of every call unless the call gives its own (default 130 s). */
  deadlineMs?: number;
  /**
   * An answer no call is waiting for: an `id: null` error (a line the host could not read,
   * a line over its limit) or a line that is not JSON (given as its bytes).
   */
  onUnmatched?: (message: Response | Buffer) => void;
  /** Every message sent and received (for logs and tests), notifications aside. */
  trace?: (event: TraceEvent) => void;
  /** Every `session.event` notification received (for logs and tests). */
  onEvent?: (event: SessionEventNotification) => void;
}

export interface SpawnOptions extends ClientOptions {
  /** The host's data dir (`--data-dir`). */
  dataDir: string;
  /** The Python that has hostcore installed (default `python3`). */
  python?: string;
  /** More `serve` arguments, for example `["--log-level", "debug"]`. */
  args?: readonly string[];
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  /** The host's stderr (its log), chunk by chunk; by default copied to this process's stderr. */
  onStderr?: (chunk: Buffer) => void;
}

export interface CallOptions {
  /** This call's deadline in ms (default: the client's). */
  deadlineMs?: number;
  /**
   * Cancel the call: if it was not sent yet it is dropped and fails with the signal's
   * reason; otherwise `$/cancelRequest` is sent and the call settles with the host's answer,
   * `REQUEST_CANCELLED` if it had not started, its result if it had (a started call
   * finishes atomically).
   */
  signal?: AbortSignal;
}

type ParamsArgs<M extends MethodName> =
  {} extends Params<M>
    ? [params?: Params<M>, options?: CallOptions]
    : [params: Params<M>, options?: CallOptions];

interface Pending {
  readonly id: number;
  readonly method: MethodName;
  readonly message: Request;
  readonly resolve: (value: unknown) => void;
  readonly reject: (error: Error) => void;
  timer: NodeJS.Timeout | undefined;
  onAbort: (() => void) | undefined;
  signal: AbortSignal | undefined;
}

/** A line waiting to be handed to the stream: a call's, a cancel, or a raw line. */
interface Outgoing {
  readonly line: Buffer;
  readonly message: Request | CancelNotification | undefined;
  readonly call: Pending | undefined;
}

/** One connection to a host. */
export class HostClient {
  readonly #input: Writable;
  readonly #child: ChildProcess | undefined;
  readonly #deadlineMs: number;
  readonly #onUnmatched: ((message: Response | Buffer) => void) | undefined;
  readonly #trace: ((event: TraceEvent) => void) | undefined;
  readonly #pending = new Map<number, Pending>();
  readonly #abandoned = new Map<number, MethodName>(); // past their deadline: answers dropped
  readonly #queue: Outgoing[] = []; // in order, waiting for the stream to take more
  readonly #gone: Promise<HostGone>;
  #markGone!: (gone: HostGone) => void;
  #goneError: HostGone | undefined;
  #nextId = 1;
  #blocked = false;
  #corked = false;
  #stderrTail = "";
  #closing = false;
  #socketPath: string | undefined;
  #clientOptions: ClientOptions;
  /** Each watch's events as they arrive, by `watchId` (see `watch.ts`). */
  readonly inboxes = new Map<string, Inbox>();

  private constructor(
    input: Writable,
    output: Readable,
    child: ChildProcess | undefined,
    options: ClientOptions,
  ) {
    this.#input = input;
    this.#child = child;
    this.#deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    this.#onUnmatched = options.onUnmatched;
    this.#trace = options.trace;
    this.#clientOptions = options;
    this.#gone = new Promise((resolve) => (this.#markGone = resolve));
    const splitter = new LineSplitter((line) => this.#receive(line));
    output.on("data", (chunk: Buffer) => splitter.push(chunk));
    output.on("error", () => {}); // the end is reported once, by 'close'
    input.on("error", () => {}); // EPIPE after the host died: 'close' reports it
    input.on("drain", () => {
      this.#blocked = false;
      this.#flush();
    });
  }

  /** Start `python -m host serve --data-dir DIR` and talk to it over its stdin and stdout. */
  static spawn(options: SpawnOptions): HostClient {
    const argv = ["-m", "host", "serve", "--data-dir", options.dataDir, ...(options.args ?? [])];
    const child = spawn(options.python ?? "python3", argv, {
      cwd: options.cwd,
      env: options.env,
      stdio: ["pipe", "pipe", "pipe"],
    });
    const client = new HostClient(child.stdin!, child.stdout!, child, options);
    const onStderr = options.onStderr ?? ((chunk: Buffer) => process.stderr.write(chunk));
    child.stderr!.on("data", (chunk: Buffer) => {
      client.#stderrTail = (client.#stderrTail + chunk.toString("utf8")).slice(-STDERR_TAIL);
      onStderr(chunk);
    });
    child.on("error", (error) => {
      if (child.pid === undefined) client.#end(null, null, error); // it never started
    });
    child.on("close", (code, signal) => client.#end(code, signal));
    return client;
  }

  /** Connect to a host serving on a Unix socket (`serve --socket PATH`). */
  static connect(socketPath: string, options: ClientOptions = {}): Promise<HostClient> {
    return new Promise((resolve, reject) => {
      const socket: Socket = netConnect(socketPath);
      const failed = (error: Error): void => reject(error);
      socket.once("error", failed);
      socket.once("connect", () => {
        socket.off("error", failed);
        const client = new HostClient(socket, socket, undefined, options);
        client.#socketPath = socketPath;
        socket.on("close", () => client.#end(null, null));
        resolve(client);
      });
    });
  }

  /** The socket this client connected to (`connect`), else `undefined`. */
  get socketPath(): string | undefined {
    return this.#socketPath;
  }

  /** The options this client was made with (a reconnect makes the next one alike). */
  get options(): ClientOptions {
    return this.#clientOptions;
  }

  /**
   * Follow `sessionId`: an async iterator of its events (see `Watch`). Without `after` it
   * starts with a `snapshot` of the session's lines; with it, after that cursor. When the
   * connection is lost it resumes on `reconnect()`'s client (by default, for a socket
   * client, a new connection to the same socket).
   */
  watch(sessionId: string, options: WatchOptions = {}): Watch {
    return new Watch(this, sessionId, options);
  }

  /** Send a notification: no answer, nothing to wait for (`session.publish`). */
  notify<M extends MethodName>(method: M, params: Params<M>): void {
    const message: Notification = { jsonrpc: "2.0", method, params };
    const line = Buffer.from(JSON.stringify(message) + "\n", "utf8");
    this.#send({ line, message: undefined, call: undefined });
  }

  /** The host's pid, when this client spawned it. */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  /** Settles (never rejects) once the host is gone: exited, killed, or the socket closed. */
  get gone(): Promise<HostGone> {
    return this.#gone;
  }

  /** Call `method` and return its result; params may be left out when none is required. */
  call<M extends MethodName>(method: M, ...args: ParamsArgs<M>): Promise<Result<M>> {
    const [params, options = {}] = args;
    return new Promise<Result<M>>((resolve, reject) => {
      if (this.#goneError || this.#closing) {
        reject(this.#goneError ?? new HostGone("the client is closing"));
        return;
      }
      if (options.signal?.aborted) {
        reject(options.signal.reason as Error);
        return;
      }
      const id = this.#nextId++;
      const message = { jsonrpc: "2.0", id, method, params: params ?? {} } as Request;
      const line = Buffer.from(JSON.stringify(message) + "\n", "utf8");
      if (line.length - 1 > MAX_LINE_BYTES) {
        reject(new RequestTooLarge(method, line.length - 1));
        return;
      }
      const call: Pending = {
        id,
        method,
        message,
        resolve: resolve as (value: unknown) => void,
        reject,
        timer: undefined,
        onAbort: undefined,
        signal: options.signal,
      };
      const deadlineMs = options.deadlineMs ?? this.#deadlineMs;
      call.timer = setTimeout(() => this.#expire(call, deadlineMs), deadlineMs);
      if (options.signal) {
        call.onAbort = () => this.#abort(call);
        options.signal.addEventListener("abort", call.onAbort, { once: true });
      }
      this.#pending.set(id, call);
      this.#send({ line, message, call });
    });
  }

  /** Send `$/cancelRequest` for the request `id` (calls do it themselves on a deadline). */
  cancel(id: number | string | null): void {
    const message: CancelNotification = {
      jsonrpc: "2.0",
      method: "$/cancelRequest",
      params: { id },
    };
    this.#send({
      line: Buffer.from(JSON.stringify(message) + "\n", "utf8"),
      message,
      call: undefined,
    });
  }

  /**
   * Write one raw line (a newline is added), in order with the calls. For diagnostics and
   * tests: the host's answer, if any, comes to `onUnmatched` unless its id is a call's.
   */
  writeLine(line: Buffer | string): void {
    const bytes = typeof line === "string" ? Buffer.from(line, "utf8") : line;
    this.#send({
      line: Buffer.concat([bytes, Buffer.from("\n")]),
      message: undefined,
      call: undefined,
    });
  }

  /**
   * End input: the host finishes the calls in flight, answers them and (spawned) exits 0.
   * If it has not gone after `timeoutMs`, it is killed.
   */
  async close(timeoutMs = 10_000): Promise<HostGone> {
    this.#closing = true;
    this.#whenDrained(() => this.#input.end());
    const timer = setTimeout(() => this.kill(), timeoutMs);
    try {
      return await this.#gone;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Kill the host (spawned) or drop the connection (socket). */
  kill(signal: NodeJS.Signals = "SIGKILL"): void {
    if (this.#child) {
      if (this.#child.exitCode === null && this.#child.signalCode === null) {
        this.#child.kill(signal);
      }
    } else {
      (this.#input as Socket).destroy();
    }
  }

  // -- writing --------------------------------------------------------------------------

  #send(outgoing: Outgoing): void {
    if (this.#goneError) return;
    this.#queue.push(outgoing);
    this.#flush();
  }

  /** Hand queued lines to the stream, in order, while it takes more; the rest waits for 'drain'. */
  #flush(): void {
    while (!this.#blocked && !this.#goneError) {
      const next = this.#queue.shift();
      if (!next) break;
      this.#cork();
      this.#blocked = !this.#input.write(next.line);
      if (next.message) this.#trace?.({ direction: "send", message: next.message });
    }
  }

  /**
   * Lines written in one turn of the event loop leave in one write (a call and its cancel
   * reach the host together, as two lines of one read).
   */
  #cork(): void {
    if (this.#corked) return;
    this.#corked = true;
    this.#input.cork();
    process.nextTick(() => {
      this.#corked = false;
      this.#input.uncork();
    });
  }

  #whenDrained(then: () => void): void {
    if (this.#queue.length === 0) {
      then();
      return;
    }
    this.#input.once("drain", () => queueMicrotask(() => this.#whenDrained(then)));
  }

  // -- reading --------------------------------------------------------------------------

  #receive(line: Buffer): void {
    if (line.length === 0) return;
    let value: unknown;
    try {
      value = JSON.parse(line.toString("utf8"));
    } catch {
      this.#onUnmatched?.(line);
      return;
    }
    for (const item of Array.isArray(value) ? value : [value]) {
      if (isEvent(item)) this.#event(item, line.length);
      else this.#answer(item as Response);
    }
  }

  #event(note: SessionEventNotification, size: number): void {
    this.#clientOptions.onEvent?.(note);
    this.inboxes.get(note.params.watchId)?.put(note.params, size);
  }

  #answer(response: Response): void {
    const id = typeof response.id === "number" ? response.id : undefined;
    const call = id === undefined ? undefined : this.#pending.get(id);
    const method = call?.method ?? (id === undefined ? undefined : this.#abandoned.get(id));
    this.#trace?.({ direction: "receive", message: response, method });
    if (!call) {
      if (id !== undefined && this.#abandoned.delete(id)) return; // its caller has moved on
      this.#onUnmatched?.(response);
      return;
    }
    this.#settle(call);
    if ("error" in response) {
      call.reject(new RpcError(call.method, response.error));
      return;
    }
    if (call.method === "session.watch") {
      // its events follow the answer at once: their inbox must exist before they come
      const started = response.result as unknown as Result<"session.watch">;
      if (!this.inboxes.has(started.watchId)) {
        this.inboxes.set(started.watchId, new Inbox(started.cursor));
      }
    }
    call.resolve(response.result);
  }

  #settle(call: Pending): void {
    this.#pending.delete(call.id);
    clearTimeout(call.timer);
    if (call.onAbort) call.signal?.removeEventListener("abort", call.onAbort);
  }

  // -- deadlines, cancels, the end ------------------------------------------------------

  /** Take a call's line out of the queue; false when it was already handed to the stream. */
  #unqueue(call: Pending): boolean {
    const at = this.#queue.findIndex((outgoing) => outgoing.call === call);
    if (at >= 0) this.#queue.splice(at, 1);
    return at >= 0;
  }

  #expire(call: Pending, deadlineMs: number): void {
    this.#settle(call);
    if (!this.#unqueue(call)) {
      this.#abandoned.set(call.id, call.method);
      this.cancel(call.id);
    }
    call.reject(new DeadlineExceeded(call.method, deadlineMs));
  }

  #abort(call: Pending): void {
    if (this.#unqueue(call)) {
      this.#settle(call);
      call.reject(call.signal?.reason as Error);
      return;
    }
    this.cancel(call.id); // the host's answer settles the call
  }

  #end(code: number | null, signal: NodeJS.Signals | null, error?: Error): void {
    if (this.#goneError) return;
    const how =
      error !== undefined
        ? `could not be started: ${error.message}`
        : signal
          ? `was killed by ${signal}`
          : code !== null
            ? `exited with status ${code}`
            : "closed the connection";
    const tail = this.#stderrTail.trim().split("\n").slice(-1)[0] ?? "";
    const gone = new HostGone(
      `the host ${how}${tail ? ` (last log line: ${tail})` : ""}`,
      code,
      signal,
      this.#stderrTail,
      error ? { cause: error } : undefined,
    );
    this.#goneError = gone;
    this.#queue.length = 0;
    for (const call of [...this.#pending.values()]) {
      this.#settle(call);
      call.reject(gone);
    }
    this.#abandoned.clear();
    for (const inbox of this.inboxes.values()) inbox.fail(gone);
    this.#markGone(gone);
  }
}

function isEvent(item: unknown): item is SessionEventNotification {
  return (
    typeof item === "object" &&
    item !== null &&
    (item as { method?: unknown }).method === "session.event" &&
    typeof (item as { params?: { watchId?: unknown } }).params?.watchId === "string"
  );
}
