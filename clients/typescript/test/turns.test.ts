/**
 * Conversations through the client against the real host: a streamed turn with checkpoints,
 * a kill -9 mid-stream and the recovery the connect sequence runs, and a regenerate with
 * its revisions. Every message on the wire is checked against docs/protocol.schema.json.
 */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, test } from "node:test";

import { HostGone, connectSequence, type Message } from "../src/index.js";
import { finish, message, startHost, stopAll } from "./helpers.js";

afterEach(stopAll);

const TIMEOUT = { timeout: 60_000 };

function checkpoint(dataDir: string, sessionId: string): string {
  return join(dataDir, "sessions", `${sessionId}.inflight.json`);
}

test("a streamed turn: prompt, checkpoints, the final row, end", TIMEOUT, async () => {
  const host = await startHost();
  const c = host.client;
  const drained: string[] = [];
  const connected = await connectSequence(c, {
    client: { name: "turns.test" },
    drain: async () => {
      drained.push("drain");
    },
  });
  assert.equal(connected.handshake.protocolVersion, 11);
  assert.deepEqual(connected.recovered, []);
  assert.deepEqual(drained, ["drain"]);

  await c.call("session.create", { sessionId: "chat-1", title: "Trip plan" });
  const begun = await c.call("session.beginTurn", {
    sessionId: "chat-1",
    turnId: "t1",
    prompt: message("u1", "user", "Plan a day in Lyon"),
  });
  assert.deepEqual(begun, { turnId: "t1", line: 0 });

  let text = "";
  for (const word of ["Start", " at", " Fourvière,", " then", " the old town."]) {
    text += word;
    const saved = await c.call("session.saveInflightMessage", {
      sessionId: "chat-1",
      turnId: "t1",
      message: message("a1", "assistant", text),
    });
    assert.deepEqual(saved, { saved: true });
    const onDisk = JSON.parse(await readFile(checkpoint(host.dataDir, "chat-1"), "utf8"));
    assert.equal(onDisk.message.content, text); // durable before the answer
  }

  const appended = await c.call("session.appendMessage", {
    sessionId: "chat-1",
    turnId: "t1",
    message: message("a1", "assistant", text),
  });
  assert.deepEqual(appended, { line: 1, appended: true });
  assert.equal(existsSync(checkpoint(host.dataDir, "chat-1")), false); // the final row settled it
  const ended = await c.call("session.endTurn", {
    sessionId: "chat-1",
    turnId: "t1",
    status: "completed",
  });
  assert.deepEqual(ended, { status: "completed", recovered: false });

  const page = await c.call("session.get", { sessionId: "chat-1", limit: 50 });
  assert.deepEqual(
    page.messages.map((m: Message) => [m.id, m.role, m.turnId, m.content]),
    [
      ["u1", "user", "t1", "Plan a day in Lyon"],
      ["a1", "assistant", "t1", "Start at Fourvière, then the old town."],
    ],
  );
  assert.deepEqual([page.startLine, page.endLine, page.totalLines], [0, 2, 2]);
  assert.deepEqual((await c.call("session.recoverInflightMessages")).recovered, []);
  await finish(host);
});

test(
  "kill -9 mid-stream: every call waiting fails HostGone, the next host recovers the checkpoint",
  TIMEOUT,
  async () => {
    const first = await startHost();
    const c = first.client;
    await connectSequence(c);
    await c.call("session.create", { sessionId: "s" });
    await c.call("session.beginTurn", {
      sessionId: "s",
      turnId: "t1",
      prompt: message("u1", "user", "Tell me a story"),
    });
    let text = "Once upon a time";
    await c.call("session.saveInflightMessage", {
      sessionId: "s",
      turnId: "t1",
      message: message("a1", "assistant", text),
    });
    let acknowledged = text;

    // The stream goes on, snapshots in flight, and the host is killed under them: after the
    // fifth is answered, and right behind one more that it cannot have answered.
    const snapshots: string[] = [];
    const save = (): Promise<unknown> => {
      text += ` and then ${text.length}`;
      snapshots.push(text);
      const snapshot = message("a1", "assistant", text);
      return c.call("session.saveInflightMessage", {
        sessionId: "s",
        turnId: "t1",
        message: snapshot,
      });
    };
    const inFlight = Array.from({ length: 20 }, save);
    await inFlight[4];
    inFlight.push(save());
    c.kill("SIGKILL");
    const outcomes = await Promise.allSettled(inFlight);
    const gone = await c.gone;
    assert.equal(gone.signal, "SIGKILL");
    for (const outcome of outcomes) {
      if (outcome.status === "rejected")
        assert.ok(outcome.reason instanceof HostGone, String(outcome.reason));
    }
    assert.equal(outcomes.at(-1)?.status, "rejected");
    acknowledged =
      snapshots[outcomes.findLastIndex((o) => o.status === "fulfilled")] ?? acknowledged;
    await assert.rejects(c.call("session.list"), HostGone); // at once, not after a deadline
    assert.deepEqual(first.violations, []);

    // A new host on the same data dir, and the connect sequence.
    const second = await startHost(first.dataDir);
    const d = second.client;
    let seenInDrain: Message[] | undefined;
    const connected = await connectSequence(d, {
      drain: async (client) => {
        // The drain runs after the handshake (a call here would be NOT_HANDSHAKEN otherwise)
        // and before recovery: the checkpoint is not a row yet.
        seenInDrain = (await client.call("session.get", { sessionId: "s" })).messages;
      },
    });
    assert.deepEqual(
      seenInDrain?.map((m) => m.id),
      ["u1"],
    );
    assert.deepEqual(connected.recovered, [
      { sessionId: "s", messageId: "a1", turnId: "t1", status: "aborted" },
    ]);
    const rows = (await d.call("session.get", { sessionId: "s" })).messages;
    assert.deepEqual(
      rows.map((m) => [m.id, m.status ?? "complete", m.turnId]),
      [
        ["u1", "complete", "t1"],
        ["a1", "aborted", "t1"],
      ],
    );
    // The reply survives up to a snapshot at least as new as the last one acknowledged.
    const kept = String(rows[1]?.content);
    assert.ok(kept.startsWith(acknowledged) && text.startsWith(kept), kept);
    const ended = await d.call("session.endTurn", {
      sessionId: "s",
      turnId: "t1",
      status: "completed",
    });
    assert.deepEqual(ended, { status: "aborted", recovered: false }); // the host ended it at start
    await finish(second);
  },
);

test(
  "the host dies while the app streams on: a reconnect keeps the checkpoint for the finished row",
  TIMEOUT,
  async () => {
    const first = await startHost();
    await connectSequence(first.client);
    const c = first.client;
    await c.call("session.create", { sessionId: "s" });
    await c.call("session.beginTurn", {
      sessionId: "s",
      turnId: "t1",
      prompt: message("u1", "user", "Tell me a story"),
    });
    await c.call("session.saveInflightMessage", {
      sessionId: "s",
      turnId: "t1",
      message: message("a1", "assistant", "Once upon"),
    });
    c.kill("SIGKILL");
    await c.gone;

    // The app's runtime goes on streaming: its reconnect keeps the session's checkpoint.
    const second = await startHost(first.dataDir);
    const d = second.client;
    const connected = await connectSequence(d, { keep: ["s"] });
    assert.deepEqual(connected.recovered, []);
    const whole = "Once upon a time, the end.";
    const appended = await d.call("session.appendMessage", {
      sessionId: "s",
      turnId: "t1",
      message: message("a1", "assistant", whole),
    });
    assert.equal(appended.appended, true);
    const ended = await d.call("session.endTurn", {
      sessionId: "s",
      turnId: "t1",
      status: "completed",
    });
    assert.equal(ended.status, "aborted"); // the second host's start ended it
    assert.equal(existsSync(checkpoint(first.dataDir, "s")), false); // the final row settled it
    assert.deepEqual((await d.call("session.recoverInflightMessages")).recovered, []);
    const page = await d.call("session.get", { sessionId: "s" });
    assert.deepEqual(
      page.messages.map((m: Message) => [m.id, m.content]),
      [
        ["u1", "Tell me a story"],
        ["a1", whole],
      ],
    );
    await finish(second);
  },
);

test(
  "regenerate: truncateFrom archives the old reply, revisions page between branches",
  TIMEOUT,
  async () => {
    const host = await startHost();
    const c = host.client;
    await connectSequence(c);
    const sid = "s";
    await c.call("session.create", { sessionId: sid });
    const turn = async (turnId: string, prompt: Message | null, reply: Message): Promise<void> => {
      await c.call("session.beginTurn", { sessionId: sid, turnId, ...(prompt ? { prompt } : {}) });
      await c.call("session.saveInflightMessage", {
        sessionId: sid,
        turnId,
        message: { ...reply, content: "…" },
      });
      await c.call("session.appendMessage", { sessionId: sid, turnId, message: reply });
      await c.call("session.endTurn", { sessionId: sid, turnId, status: "completed" });
    };
    await turn("t0", message("u0", "user", "Hi"), message("a0", "assistant", "Hello"));
    await turn("t1", message("u1", "user", "A haiku?"), message("a1", "assistant", "first haiku"));
    assert.deepEqual(await c.call("session.saveActiveRevision", { sessionId: sid }), {
      rootId: "u1",
      revisionCount: 1,
      activeRevision: 0,
      archived: 1,
      stamped: true,
    });

    // Regenerate: the old reply is cut and archived, the root stamped for the new one.
    const cut = await c.call("session.truncateFrom", { sessionId: sid, fromMessageId: "a1" });
    assert.deepEqual(cut, {
      kept: 3,
      removed: 1,
      archived: 1,
      pager: { rootId: "u1", revisionCount: 2, activeRevision: 1 },
    });
    await turn("t2", null, message("a1b", "assistant", "second haiku"));
    const saved = await c.call("session.saveActiveRevision", { sessionId: sid });
    assert.deepEqual([saved.revisionCount, saved.activeRevision, saved.stamped], [2, 1, false]);

    const listed = await c.call("session.listRevisions", {
      sessionId: sid,
      rootId: "u1",
      includeMessages: true,
    });
    assert.deepEqual([listed.revisionCount, listed.activeRevision], [2, 1]);
    assert.deepEqual(
      listed.revisions.map((r) => [r.revision, r.messageCount, r.messages?.map((m) => m.content)]),
      [
        [0, 1, ["first haiku"]],
        [1, 1, ["second haiku"]],
      ],
    );

    // Page back to the first branch: its reply returns with its own turn; the root's pager says so.
    assert.deepEqual(
      await c.call("session.activateRevision", { sessionId: sid, rootId: "u1", revision: 0 }),
      {
        activeRevision: 0,
        revisionCount: 2,
      },
    );
    const rows = (await c.call("session.get", { sessionId: sid })).messages;
    assert.deepEqual(
      rows.map((m) => [m.id, m.turnId]),
      [
        ["u0", "t0"],
        ["a0", "t0"],
        ["u1", "t1"],
        ["a1", "t1"],
      ],
    );
    const root = rows[2]!;
    assert.deepEqual([root.revisionRootId, root.revisionCount, root.activeRevision], ["u1", 2, 0]);
    await finish(host);
  },
);
