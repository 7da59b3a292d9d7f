/**
 * Issue 35 through the client against the real host: search with its snippet ranges, the
 * paged list, update and fork, and a bad query's clear error.
 */

import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import {
  RpcError,
  forkSession,
  highlight,
  listSessions,
  search,
  updateSession,
} from "../src/index.js";
import { finish, message, startHost, stopAll } from "./helpers.js";

afterEach(stopAll);

const TIMEOUT = { timeout: 60_000 };

test("search, list pages, update and fork", TIMEOUT, async () => {
  const host = await startHost();
  const c = host.client;
  await c.call("handshake", { protocolVersion: 11 });
  for (let i = 0; i < 5; i++) {
    await c.call("session.create", { sessionId: `s${i}`, title: `chat ${i}` });
    await c.call("session.appendMessage", {
      sessionId: `s${i}`,
      message: message(`m${i}`, "user", `😀 note ${i} about the harbour 東京`),
    });
  }
  const found = await search(c, { query: "harbour", limit: 2 });
  assert.equal(found.hits.length, 2);
  assert.ok(found.cursor !== undefined);
  const first = found.hits[0]!;
  const parts = highlight(first.snippet);
  assert.deepEqual(
    parts.filter((p) => p.match).map((p) => p.text),
    ["harbour"],
  );
  const cjk = await search(c, { query: "東" });
  assert.equal(cjk.hits.length, 5);
  const rest = await search(c, { query: "harbour", limit: 10, cursor: found.cursor });
  assert.equal(rest.hits.length, 3);

  const updated = await updateSession(c, { sessionId: "s1", title: "Harbour", meta: { pinned: true } });
  assert.deepEqual(updated.meta, { pinned: true });
  const ids: string[] = [];
  for await (const s of listSessions(c, { limit: 2, pinnedFirst: true })) {
    ids.push(s.sessionId);
    assert.match(s.createdAt, /^\d{4}-\d\d-\d\dT/); // every entry carries both (the schema)
    assert.deepEqual(s.meta, s.sessionId === "s1" ? { pinned: true } : null);
  }
  assert.equal(ids.length, 5);
  assert.equal(ids[0], "s1");

  const forked = await forkSession(c, { sessionId: "s2", atMessageId: "m2", newSessionId: "f" });
  assert.deepEqual(forked, { sessionId: "f", created: true, messageCount: 1 });

  await assert.rejects(search(c, { query: "OR" }), (err: unknown) => {
    assert.ok(err instanceof RpcError);
    assert.equal(err.error.data.code, "INVALID_PARAMS");
    return true;
  });
  await assert.rejects(search(c, { query: "x".repeat(5000) }), (err: unknown) => {
    assert.ok(err instanceof RpcError);
    assert.equal(err.error.data.code, "LIMIT_EXCEEDED");
    return true;
  });
  await finish(host); // exit 0, and every request and answer matched the schema
});
