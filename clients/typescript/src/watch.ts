/**
 * Follow a session as it changes (`session.watch`), across resets and reconnects.
 *
 * `HostClient.watch` returns a {@link Watch}: an async iterator of the session's events,
 * each with the `cursor` just after it. What it yields rebuilds the session exactly: a
 * `snapshot` (every line, read with `session.get`) to start from, then `appended` lines,
 * `turn` changes, `checkpoint`s and `live` data as the host applies them, and a new
 * `snapshot` whenever the host says `reset` (the transcript was rewritten). Nothing is
 * yielded twice and nothing is skipped:
 *
 * - a snapshot is taken at a cursor: the watch asks for the cursor, reads the lines before
 *   it, then watches from it; the host honours that cursor only if no rewrite came between
 *   (the same epoch), else it answers with a newer one and the watch reads again;
 * - a `reset` for an `overflow` (the client fell behind) needs no read: the watch resumes
 *   from the cursor it was given, and the host replays what was dropped;
 * - when the connection is lost, the watch resumes on a new one (`reconnect`) from the
 *   cursor of the last event it yielded; a host restart or power cut in between changes
 *   nothing to that (the cursor names what is on disk).
 *
 * A `deleted` event ends the iteration; so does `return()` (leaving a `for await` with
 * `break`), which ends the watch on the host.
 */

import type { HostClient } from "./client.js";
import { HostGone, RpcError } from "./client.js";
import type {
  AppendedEvent,
  CheckpointEvent,
  DeletedEvent,
  LiveEvent,
  Message,
  SessionEventParams,
  TurnEvent,
} from "./protocol.js";

/** What a watch yields: a snapshot to start from, or one change; each with its cursor. */
export type WatchEvent =
  | { kind: "snapshot"; messages: Message[]; totalLines: number; cursor: string }
  | ((AppendedEvent | TurnEvent | CheckpointEvent | LiveEvent | DeletedEvent) & {
      cursor: string;
    });

export interface WatchOptions {
  /** Resume after this cursor (an event's `cursor`) instead of starting with a snapshot. */
  after?: string;
  /** A new connection once the old one is lost (default: the same socket, for ever). */
  reconnect?: () => Promise<HostClient>;
}

/** Lines a snapshot reads per `session.get`. */
const PAGE = 512;
/** Event bytes a watch holds unread before it drops the rest and resumes from the files. */
export const INBOX_BYTES = 16 * 1024 * 1024;

/**
 * One watch's events as the connection read them, until its iterator takes them. Bounded as
 * the host bounds a watcher: an event that would take it past {@link INBOX_BYTES} is dropped,
 * with every one after it, for an `overflow` reset after the last one it holds.
 */
export class Inbox {
  readonly #items: { params: SessionEventParams; size: number }[] = [];
  #bytes = 0;
  #closed = false;
  #gone: Error | undefined;
  #wake: (() => void) | undefined;
  #start: string;

  constructor(start: string) {
    this.#start = start;
  }

  put(params: SessionEventParams, size: number): void {
    if (this.#closed) return;
    if (this.#items.length > 0 && this.#bytes + size > INBOX_BYTES) {
      const at = this.#items[this.#items.length - 1]?.params.cursor ?? this.#start;
      const reset = { kind: "reset" as const, reason: "overflow" as const, totalLines: 0 };
      this.#items.push({ params: { watchId: params.watchId, cursor: at, event: reset }, size: 0 });
      this.#closed = true;
    } else {
      this.#items.push({ params, size });
      this.#bytes += size;
    }
    this.#wake?.();
  }

  fail(error: Error): void {
    this.#gone = error;
    this.#wake?.();
  }

  async get(): Promise<SessionEventParams> {
    for (;;) {
      const next = this.#items.shift();
      if (next) {
        this.#bytes -= next.size;
        return next.params;
      }
      if (this.#gone) throw this.#gone;
      await new Promise<void>((resolve) => (this.#wake = resolve));
      this.#wake = undefined;
    }
  }
}

/** A reconnect that dials `path` again (and handshakes) until a host answers there. */
export function reconnectTo(path: string, client: HostClient): () => Promise<HostClient> {
  return async () => {
    const { HostClient: Client } = await import("./client.js");
    const { PROTOCOL_VERSION } = await import("./protocol.js");
    let delay = 20;
    for (;;) {
      try {
        const next = await Client.connect(path, client.options);
        await next.call("handshake", { protocolVersion: PROTOCOL_VERSION });
        return next;
      } catch (error) {
        if (!(error instanceof Error) || error instanceof RpcError) throw error;
        await new Promise((resolve) => setTimeout(resolve, delay)); // a restarting host
        delay = Math.min(1000, delay * 2);
      }
    }
  };
}

/** The session's first `total` lines, a page at a time from the end. */
export async function readLines(
  client: HostClient,
  sessionId: string,
  total: number,
): Promise<Message[]> {
  const out: Message[] = [];
  let end = total;
  let page = PAGE;
  while (end > 0) {
    let got;
    try {
      got = await client.call("session.get", {
        sessionId,
        beforeLine: end,
        limit: Math.min(page, end),
      });
    } catch (error) {
      if (error instanceof RpcError && error.is("LIMIT_EXCEEDED") && page > 1) {
        page = Math.floor(page / 2); // big lines: smaller pages
        continue;
      }
      throw error;
    }
    if (got.messages.length === 0) break; // shorter than the cursor says: a reset follows
    out.unshift(...got.messages);
    end = got.startLine;
  }
  return out;
}

/** One session followed (see the module's doc); iterate it with `for await`. */
export class Watch implements AsyncIterableIterator<WatchEvent> {
  client: HostClient;
  readonly sessionId: string;
  /** The cursor after the last event yielded: resume from it (`after`). */
  cursor: string | undefined;
  /** Snapshots read again after a reset. */
  resets = 0;
  /** Resumes after falling behind (the host's bound or the inbox's). */
  overflows = 0;
  reconnects = 0;
  readonly #reconnect: (() => Promise<HostClient>) | undefined;
  #reread: boolean;
  #total = 0;
  #watchId: string | undefined;
  #inbox: Inbox | undefined;
  #yielded = false;
  #done = false;
  #owned: HostClient | undefined;

  constructor(client: HostClient, sessionId: string, options: WatchOptions = {}) {
    this.client = client;
    this.sessionId = sessionId;
    this.cursor = options.after;
    this.#reread = options.after === undefined;
    const path = client.socketPath;
    this.#reconnect = options.reconnect ?? (path ? reconnectTo(path, client) : undefined);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<WatchEvent>> {
    while (!this.#done) {
      let params: SessionEventParams;
      try {
        if (!this.#inbox) {
          const snapshot = await this.#start();
          if (snapshot) return this.#out(snapshot);
          continue;
        }
        params = await this.#inbox.get();
      } catch (error) {
        if (error instanceof HostGone) {
          await this.#reconnected(error);
          continue;
        }
        if (error instanceof RpcError && error.is("NOT_FOUND") && this.#yielded) {
          this.#done = true;
          return this.#out({ kind: "deleted", cursor: this.cursor ?? "" });
        }
        throw error;
      }
      const event = params.event;
      if (event.kind === "reset") {
        await this.#drop();
        this.cursor = params.cursor;
        this.#reread = event.reason !== "overflow";
        this.#total = event.totalLines;
        if (this.#reread) this.resets += 1;
        else this.overflows += 1;
        continue;
      }
      this.cursor = params.cursor;
      if (event.kind === "deleted") {
        await this.#drop();
        this.#done = true;
      }
      return this.#out({ ...event, cursor: params.cursor });
    }
    await this.#closeOwned();
    return { done: true, value: undefined };
  }

  async return(): Promise<IteratorResult<WatchEvent>> {
    this.#done = true;
    await this.#drop();
    await this.#closeOwned();
    return { done: true, value: undefined };
  }

  #out(event: WatchEvent): IteratorResult<WatchEvent> {
    this.#yielded = true;
    return { done: false, value: event };
  }

  /** Watch from the cursor, reading the lines before it first when they must be; the
   * snapshot once the host honoured its cursor. */
  async #start(): Promise<WatchEvent | undefined> {
    const client = this.client;
    const sessionId = this.sessionId;
    let messages: Message[] = [];
    if (this.#reread) {
      if (this.cursor === undefined) {
        const fresh = await client.call("session.watch", { sessionId });
        client.inboxes.delete(fresh.watchId);
        await client.call("session.unwatch", { watchId: fresh.watchId });
        this.cursor = fresh.cursor;
        this.#total = fresh.totalLines;
      }
      messages = await readLines(client, sessionId, this.#total);
    }
    const started = await client.call("session.watch", { sessionId, after: this.cursor! });
    this.#watchId = started.watchId;
    this.#inbox = client.inboxes.get(started.watchId);
    if (!this.#reread || started.cursor !== this.cursor) return undefined; // a reset comes
    this.#reread = false;
    return { kind: "snapshot", messages, totalLines: this.#total, cursor: this.cursor! };
  }

  /** Forget the host's watch (ended by its reset, or by us). */
  async #drop(): Promise<void> {
    const watchId = this.#watchId;
    this.#watchId = undefined;
    this.#inbox = undefined;
    if (watchId === undefined) return;
    this.client.inboxes.delete(watchId);
    try {
      await this.client.call("session.unwatch", { watchId });
    } catch {
      // gone: the watch ended with its connection
    }
  }

  async #reconnected(error: HostGone): Promise<void> {
    this.#watchId = undefined;
    this.#inbox = undefined;
    if (!this.#reconnect) throw error;
    await this.#closeOwned();
    this.client = this.#owned = await this.#reconnect();
    this.reconnects += 1;
  }

  async #closeOwned(): Promise<void> {
    const owned = this.#owned;
    this.#owned = undefined;
    if (owned) await owned.close();
  }
}
