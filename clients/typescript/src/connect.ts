/**
 * The connect sequence (ADR 0153 amendment): handshake, then the caller's outbox drain, then
 * `session.recoverInflightMessages`, and only then may anything read a transcript.
 *
 * The order matters: a finished reply may be durable in the app's outbox while the host
 * holds only an older checkpoint of it. Draining first stores the finished row; recovery
 * then finds that id indexed and drops the checkpoint. Recovering first would store the
 * stale partial as `aborted` and the finished row would be deduplicated away.
 */

import type { HostClient, Result } from "./client.js";
import { PROTOCOL_VERSION, type HandshakeResult, type RecoveredRow } from "./protocol.js";

export interface ConnectOptions {
  /** Who is calling, for the host's log (`handshake`'s `client`). */
  client?: { name: string; version?: string; [k: string]: unknown };
  /**
   * Deliver every row the app persisted before the host saw it (its outbox), through
   * `session.appendMessage` on this client. If it throws, recovery is not run (it would
   * let an older checkpoint win over a finished row) and `connectSequence` rethrows.
   */
  drain?: (client: HostClient) => Promise<void>;
  /**
   * On a reconnect, the sessions whose turn the app still runs (the host died while a reply
   * streamed): their checkpoints are left for the finished rows still to come.
   */
  keep?: string[];
  /** Deadline of each of the two calls (default: the client's). */
  deadlineMs?: number;
}

export interface Connected {
  handshake: HandshakeResult;
  /** Rows that recovery appended from leftover checkpoints (crashed turns' partial replies). */
  recovered: RecoveredRow[];
}

/** Handshake, drain, recover: what every connection runs before it reads a transcript. */
export async function connectSequence(
  client: HostClient,
  options: ConnectOptions = {},
): Promise<Connected> {
  const deadline = options.deadlineMs === undefined ? {} : { deadlineMs: options.deadlineMs };
  const params = {
    protocolVersion: PROTOCOL_VERSION,
    ...(options.client && { client: options.client }),
  };
  const handshake = await client.call("handshake", params, deadline);
  await options.drain?.(client);
  const recovered: Result<"session.recoverInflightMessages"> = await client.call(
    "session.recoverInflightMessages",
    options.keep === undefined ? {} : { keep: options.keep },
    deadline,
  );
  return { handshake, recovered: recovered.recovered };
}
