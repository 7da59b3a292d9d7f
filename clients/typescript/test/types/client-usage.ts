// Type-level checks on HostClient.call, compiled by test/schema.test.ts against src/. A line
// ending in "// error TSnnnn" must fail with exactly that error; every other line must compile.
import { HostClient, RpcError } from "../src/index.js";

declare const c: HostClient;

export async function compiles(): Promise<number> {
  const r = await c.call("session.appendMessage", { sessionId: "s", message: { id: "m", role: "user", content: "hi" } });
  await c.call("session.list");
  await c.call("session.create");
  const page = await c.call("session.get", { sessionId: "s", limit: 10 }, { deadlineMs: 5_000 });
  return r.line + page.totalLines + (page.messages[0]?.turnId ? 1 : 0);
}

export function narrows(e: unknown): string | undefined {
  if (e instanceof RpcError && e.is("AGENT_BUSY")) return e.data.turnId;
  if (e instanceof RpcError && e.is("NOT_FOUND")) return e.data.kind;
  return undefined;
}

export async function refused(e: unknown): Promise<unknown> {
  await c.call("session.appendMessage", { sessionId: "s", message: 42 }); // error TS2322
  const r = await c.call("session.appendMessage", { sessionId: "s", message: { id: "m", role: "user" } });
  await c.call("session.get"); // error TS2554
  await c.call("session.get", { sessionId: "s", limt: 5 }); // error TS2561
  await c.call("session.apend", {}); // error TS2345
  await c.call("handshake", { protocolVersion: 10 }); // error TS2322
  if (e instanceof RpcError && e.is("AGENT_BUSY")) return e.data.kind; // error TS2339
  return r.apended; // error TS2551
}
