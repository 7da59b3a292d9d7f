/**
 * The client's transport against the real host: deadlines and cancels, the 64 MiB line
 * limit, bytes split inside a character, backpressure, the socket, and the host going away.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, test } from "node:test";
import { isDeepStrictEqual } from "node:util";

import {
  DeadlineExceeded,
  HostClient,
  HostGone,
  MAX_LINE_BYTES,
  RequestTooLarge,
  RpcError,
  connectSequence,
  type Response,
  type TraceEvent,
} from "../src/index.js";
import {
  finish,
  message,
  removeDir,
  signal,
  startHost,
  stopAll,
  type TestHost,
} from "./helpers.js";

afterEach(stopAll);

const TIMEOUT = { timeout: 60_000 };

async function ready(options: Parameters<typeof startHost>[1] = {}): Promise<TestHost> {
  const host = await startHost(undefined, options);
  await connectSequence(host.client);
  await host.client.call("session.create", { sessionId: "s" });
  return host;
}

async function storedIds(host: TestHost): Promise<string[]> {
  return (await host.client.call("session.get", { sessionId: "s" })).messages.map((m) => m.id);
}

test(
  "a deadline sends $/cancelRequest, and the call it gave up on does nothing",
  TIMEOUT,
  async () => {
    const late = signal<Response>();
    let stalledId: unknown;
    const host = await ready({
      trace: (event: TraceEvent) => {
        if (event.direction === "send") {
          const m = event.message;
          if (m.method === "session.appendMessage" && m.params.message.id === "b") stalledId = m.id;
        } else if (event.message.id === stalledId) {
          late.resolve(event.message);
        }
      },
    });
    const c = host.client;
    await c.call("session.appendMessage", {
      sessionId: "s",
      message: message("a", "user", "first"),
    });
    // A host that answers nothing (stopped): the call's deadline passes, the client cancels.
    // A call ahead of it on the same session (no deadline) holds the session as it is read,
    // so the one behind it is still waiting when its cancel is read (docs/protocol.md: a
    // call on an idle session takes its lock as it is read, and a cancel then comes too late).
    process.kill(c.pid!, "SIGSTOP");
    let ahead: Promise<unknown> = Promise.resolve();
    try {
      ahead = c.call("session.appendMessage", {
        sessionId: "s",
        message: message("a2", "user", "ahead"),
      });
      const stalled = c.call(
        "session.appendMessage",
        { sessionId: "s", message: message("b", "user", "second") },
        { deadlineMs: 300 },
      );
      await assert.rejects(stalled, DeadlineExceeded);
    } finally {
      process.kill(c.pid!, "SIGCONT");
    }
    await ahead;
    // The request and its cancel reach the host together: it is answered REQUEST_CANCELLED,
    // which the client drops (its caller has moved on), and nothing of it was stored.
    const answer = await late.promise;
    assert.ok(
      "error" in answer && answer.error.data.code === "REQUEST_CANCELLED",
      JSON.stringify(answer),
    );
    assert.deepEqual(await storedIds(host), ["a", "a2"]);
    await finish(host);
  },
);

test("an abort signal cancels a call waiting for its session's lock", TIMEOUT, async () => {
  const sent: string[] = [];
  const host = await ready({
    trace: (event: TraceEvent) => {
      if (event.direction !== "send") return;
      const m = event.message;
      if (m.method === "session.appendMessage") sent.push(m.params.message.id);
    },
  });
  const c = host.client;
  const stop = new AbortController();
  const first = c.call("session.appendMessage", {
    sessionId: "s",
    message: message("a", "user", "1"),
  });
  const second = c.call(
    "session.appendMessage",
    { sessionId: "s", message: message("b", "user", "2") },
    { signal: stop.signal },
  );
  stop.abort(); // in the same turn: the call and its cancel leave in one write
  const cancelled = assert.rejects(
    second,
    (e: unknown) => e instanceof RpcError && e.is("REQUEST_CANCELLED"),
  );
  assert.deepEqual(await first, { line: 0, appended: true });
  await cancelled;
  assert.deepEqual(await storedIds(host), ["a"]);

  // A call aborted while it still waits behind backpressure is never sent at all.
  const big = "x".repeat(8 << 20);
  const blocking = c.call("session.saveInflightMessage", {
    sessionId: "s",
    turnId: "t",
    message: message("big", "assistant", big),
  });
  const queued = c.call(
    "session.appendMessage",
    { sessionId: "s", message: message("never", "user", "3") },
    { signal: AbortSignal.abort(new Error("stopped")) },
  );
  await assert.rejects(queued, /stopped/);
  const stop2 = new AbortController();
  const waiting = c.call(
    "session.appendMessage",
    { sessionId: "s", message: message("never2", "user", "4") },
    { signal: stop2.signal },
  );
  stop2.abort(new Error("stopped too"));
  await assert.rejects(waiting, /stopped too/);
  assert.deepEqual(await blocking, { saved: true });
  assert.deepEqual(await storedIds(host), ["a"]);
  assert.deepEqual(sent, ["a", "b"]);
  await finish(host);
});

const MAX_MESSAGE_BYTES = MAX_LINE_BYTES - 4096; // the room kept for the host's fields

test(
  "a 64 MiB line is sent, one byte more is refused, and the connection lives on",
  TIMEOUT,
  async () => {
    const unmatched = signal<Response | Buffer>();
    const host = await ready({ onUnmatched: (m) => unmatched.resolve(m) });
    const c = host.client;
    const append = (content: string): Promise<unknown> =>
      c.call("session.appendMessage", { sessionId: "s", message: message("big", "user", content) });

    // Measure the line: the client refuses it before sending and says how long it is.
    const probe = "x".repeat(MAX_LINE_BYTES);
    const refused = await append(probe).then(
      () => assert.fail("a line over 64 MiB was sent"),
      (e: unknown) => e,
    );
    assert.ok(refused instanceof RequestTooLarge);
    const exact = probe.slice(0, MAX_LINE_BYTES - (refused.bytes - MAX_LINE_BYTES));
    // Exactly 64 MiB: the host reads the line, but its message leaves no room for the
    // fields the host adds once stored (docs/protocol.md: 64 MiB less 4 KiB a message).
    const full = await append(exact).then(
      () => assert.fail("a message over 64 MiB less 4 KiB was stored"),
      (e: unknown) => e,
    );
    assert.ok(full instanceof RpcError && full.is("LIMIT_EXCEEDED"), String(full));
    assert.deepEqual(full.error.data, { code: "LIMIT_EXCEEDED", limit: MAX_MESSAGE_BYTES });
    const messageBytes = Buffer.byteLength(JSON.stringify(message("big", "user", exact)));
    const most = exact.slice(0, exact.length - (messageBytes - MAX_MESSAGE_BYTES));
    assert.deepEqual(await append(most), { line: 0, appended: true }); // the most: stored
    const over = await append(exact + "x").then(
      () => assert.fail("a line of 64 MiB + 1 was sent"),
      (e: unknown) => e,
    );
    assert.ok(over instanceof RequestTooLarge && over.bytes === MAX_LINE_BYTES + 1);

    // The same line sent raw: the host reads it through and answers LIMIT_EXCEEDED, id null.
    const head =
      '{"jsonrpc":"2.0","id":99,"method":"session.appendMessage","params":{"sessionId":"s","message":{"id":"raw","role":"user","content":"';
    const tail = '"}}}';
    const raw = head + "y".repeat(MAX_LINE_BYTES + 1 - head.length - tail.length) + tail;
    assert.equal(Buffer.byteLength(raw), MAX_LINE_BYTES + 1);
    c.writeLine(raw);
    const answer = await unmatched.promise;
    assert.ok(!Buffer.isBuffer(answer) && "error" in answer, String(answer));
    assert.equal(answer.id, null);
    assert.equal(answer.error.data.code, "LIMIT_EXCEEDED");
    assert.deepEqual(await storedIds(host), ["big"]); // and the connection still works
    await finish(host);
  },
);

test("characters split across the host's chunks come back whole", TIMEOUT, async () => {
  const host = await ready();
  const c = host.client;
  // 1.2 MB of two- and four-byte characters: the pipe's chunk edges fall inside them.
  const text = "a" + "é😀".repeat(200_000);
  await c.call("session.appendMessage", { sessionId: "s", message: message("m", "user", text) });
  const [stored] = (await c.call("session.get", { sessionId: "s" })).messages;
  const got = String(stored?.content);
  if (got !== text) {
    const want = [...text];
    const at = [...got].findIndex((ch, i) => ch !== want[i]);
    assert.fail(
      `read back differs from character ${at}: ${JSON.stringify([...got].slice(at, at + 4))}`,
    );
  }
  await finish(host);
});

test(
  "a string cut in half through a surrogate pair is stored and read back",
  TIMEOUT,
  async () => {
    const unmatched = signal<Response | Buffer>();
    const host = await ready({ onUnmatched: (m) => unmatched.resolve(m) });
    const c = host.client;
    const cut = "Bonjour 😀".slice(0, -1); // what a stream cut mid-emoji leaves: "Bonjour \ud83d"
    assert.equal(JSON.stringify(cut), '"Bonjour \\ud83d"');
    const appended = c.call("session.appendMessage", {
      sessionId: "s",
      message: message("m", "assistant", cut),
    });
    const first = await Promise.race([appended, unmatched.promise]);
    if (!isDeepStrictEqual(first, { line: 0, appended: true })) {
      assert.fail(`the host answered ${JSON.stringify(first)}`);
    }
    const [stored] = (await c.call("session.get", { sessionId: "s" })).messages;
    assert.equal(stored?.content, cut);
    const line = await readFile(join(host.dataDir, "sessions", "s.jsonl"), "utf8");
    assert.ok(line.includes('"Bonjour \\ud83d"'), line); // the caller's bytes, as sent
    await finish(host);
  },
);

test(
  "it reads while it writes: big answers and big requests cross, queued calls keep order",
  TIMEOUT,
  async () => {
    const host = await ready();
    const c = host.client;
    const eight = "z".repeat(8 << 20);
    await c.call("session.appendMessage", {
      sessionId: "s",
      message: message("m0", "user", eight),
    });
    // An 8 MB answer comes back while an 8 MB request goes out, with 50 calls queued behind it.
    const read = c.call("session.get", { sessionId: "s" });
    const write = c.call("session.saveInflightMessage", {
      sessionId: "s",
      turnId: "t",
      message: message("cp", "assistant", eight),
    });
    const small = Array.from({ length: 50 }, (_, i) =>
      c.call("session.appendMessage", {
        sessionId: "s",
        message: message(`m${i + 1}`, "user", `${i}`),
      }),
    );
    assert.equal((await read).messages[0]?.content, eight);
    assert.deepEqual(await write, { saved: true });
    const lines = (await Promise.all(small)).map((r) => r.line);
    assert.deepEqual(
      lines,
      Array.from({ length: 50 }, (_, i) => i + 1),
    ); // applied in order
    await finish(host);
  },
);

test(
  "the host going away fails what waits and what comes after with HostGone",
  TIMEOUT,
  async () => {
    const host = await ready();
    const c = host.client;
    assert.deepEqual(await c.call("host.shutdown"), { shuttingDown: true });
    const gone = await c.gone;
    assert.equal(gone.exitCode, 0);
    const error = await c.call("session.list").catch((e: unknown) => e);
    assert.ok(error instanceof HostGone && error === gone);
    assert.deepEqual(host.violations, []);
    await removeDir(host.dataDir);

    const nowhere = HostClient.spawn({
      dataDir: host.dataDir,
      python: join(host.dataDir, "no-python"),
    });
    await assert.rejects(nowhere.call("handshake", { protocolVersion: 11 }), (e: unknown) => {
      return e instanceof HostGone && /could not be started/.test(e.message);
    });
  },
);

test("connect to a host serving a Unix socket; two clients share it", TIMEOUT, async () => {
  const dir = await mkdtemp(join(tmpdir(), "hostcore-ts-"));
  const path = join(dir, "host.sock");
  const python = process.env["HOSTCORE_PYTHON"] ?? "python3";
  const proc = spawn(
    python,
    ["-m", "host", "serve", "--data-dir", join(dir, "data"), "--socket", path],
    {
      stdio: ["ignore", "ignore", "pipe"],
    },
  );
  let log = "";
  const listening = signal();
  proc.stderr.on("data", (chunk: Buffer) => {
    log += chunk.toString("utf8");
    if (log.includes(`serving on ${path}`)) listening.resolve();
  });
  const exited = once(proc, "exit");
  try {
    await Promise.race([listening.promise, exited.then(() => assert.fail(`host exited: ${log}`))]);
    const one = await HostClient.connect(path);
    const two = await HostClient.connect(path);
    await connectSequence(one);
    await connectSequence(two);
    await one.call("session.create", { sessionId: "shared" });
    const listed = await two.call("session.list");
    assert.deepEqual(
      listed.sessions.map((s) => s.sessionId),
      ["shared"],
    );
    await assert.rejects(
      one.call("session.get", { sessionId: "absent" }),
      (e: unknown) => e instanceof RpcError && e.is("NOT_FOUND") && e.data.kind === "session",
    );
    await one.call("host.shutdown");
    const [goneOne, goneTwo] = await Promise.all([one.gone, two.gone]);
    assert.ok(goneOne instanceof HostGone && goneTwo instanceof HostGone);
    const [code] = await exited;
    assert.equal(code, 0, log);
  } finally {
    proc.kill("SIGKILL");
    await removeDir(dir);
  }
});
