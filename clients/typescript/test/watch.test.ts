/**
 * `watch` against the real host: a snapshot, then every change in order; a new snapshot after
 * a rewrite; live data; and, after the host is killed and another started on the same data
 * dir and socket, a resume by itself from the last cursor, nothing doubled, nothing missed.
 * Every `session.event` that arrives is checked against docs/protocol.schema.json.
 */

import assert from "node:assert/strict";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, test } from "node:test";

import {
  HostClient,
  PROTOCOL_VERSION,
  reconnectTo,
  type SessionEventNotification,
  type Watch,
  type WatchEvent,
} from "../src/index.js";
import { WireSchema, finish, message, removeDir, startHost, stopAll } from "./helpers.js";

afterEach(stopAll);

const TIMEOUT = { timeout: 60_000 };

async function take(watch: Watch, n: number): Promise<WatchEvent[]> {
  const out: WatchEvent[] = [];
  for (let i = 0; i < n; i++) {
    const next = await watch.next();
    assert.equal(next.done, false);
    out.push(next.value as WatchEvent);
  }
  return out;
}

function ids(events: WatchEvent[]): string[] {
  return events.flatMap((e) => (e.kind === "appended" ? [e.message.id] : []));
}

test("watch: a snapshot, changes, a rewrite, live data, a kill and a resume", TIMEOUT, async () => {
  const schema = await WireSchema.load();
  const problems: string[] = [];
  const check = (note: SessionEventNotification): void => {
    problems.push(...schema.check("/$defs/SessionEventNotification", note));
  };
  const dir = await mkdtemp(join(tmpdir(), "hostcore-ts-watch-"));
  const sock = join(dir, "host.sock");
  const args = ["--also-socket", sock];
  let app = await startHost(join(dir, "data"), { args });
  await app.client.call("handshake", { protocolVersion: PROTOCOL_VERSION });
  await app.client.call("session.create", { sessionId: "s" });
  for (const id of ["a0", "a1", "a2"]) {
    await app.client.call("session.appendMessage", {
      sessionId: "s",
      message: message(id, "user", id),
    });
  }
  // the socket is bound before the host recovers and served by the time stdio answers
  const watcher = await HostClient.connect(sock, { onEvent: check });
  await watcher.call("handshake", { protocolVersion: PROTOCOL_VERSION });
  const watch = watcher.watch("s");

  const [snapshot] = await take(watch, 1);
  assert.equal(snapshot?.kind, "snapshot");
  assert.deepEqual(snapshot?.kind === "snapshot" ? snapshot.messages.map((m) => m.id) : [], [
    "a0",
    "a1",
    "a2",
  ]);
  await app.client.call("session.appendMessage", {
    sessionId: "s",
    message: message("a3", "user", "x"),
  });
  assert.deepEqual(ids(await take(watch, 1)), ["a3"]);

  // a rewrite: the watch reads the lines again and gives a new snapshot
  await app.client.call("session.deleteMessages", { sessionId: "s", messageIds: ["a1"] });
  const [again] = await take(watch, 1);
  assert.equal(again?.kind, "snapshot");
  assert.equal(watch.resets, 1);

  // live data: stored nowhere, reaches a live watcher at once
  await app.client.call("session.beginTurn", { sessionId: "s", turnId: "t1" });
  app.client.notify("session.publish", { sessionId: "s", turnId: "t1", data: { delta: "Hel" } });
  const [turn, live] = await take(watch, 2);
  assert.equal(turn?.kind, "turn");
  assert.deepEqual(live?.kind === "live" ? live.data : undefined, { delta: "Hel" });

  // the host is killed; another starts on the same data dir and socket; changes land
  // while nobody watches; the watch resumes by itself from its cursor
  app.client.kill();
  await app.client.gone;
  app = await startHost(join(dir, "data"), { args });
  await app.client.call("handshake", { protocolVersion: PROTOCOL_VERSION });
  for (const id of ["a4", "a5"]) {
    await app.client.call("session.appendMessage", {
      sessionId: "s",
      message: message(id, "user", id),
    });
  }
  const after = await take(watch, 3); // the restart aborted t1, then the two lines
  assert.deepEqual(ids(after), ["a4", "a5"]);
  assert.deepEqual(
    after.flatMap((e) => (e.kind === "turn" ? [e.status] : [])),
    ["aborted"],
  );
  assert.equal(watch.reconnects, 1);
  const cursor = watch.cursor;
  await watch.return();

  // a cursor is a place to come back to
  await app.client.call("session.appendMessage", {
    sessionId: "s",
    message: message("a6", "user", "y"),
  });
  const other = await reconnectTo(sock, watcher)(); // a client of its own: dial, handshake
  const later = other.watch("s", cursor === undefined ? {} : { after: cursor });
  assert.deepEqual(ids(await take(later, 1)), ["a6"]);
  await later.return();
  await other.close();
  await watcher.close();
  assert.deepEqual(problems, [], "events that do not match the schema");
  await finish(app);
  await removeDir(dir);
});
