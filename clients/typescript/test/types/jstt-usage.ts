// Type-level checks on `npx json-schema-to-typescript docs/protocol.schema.json` (no options),
// compiled by test/schema.test.ts next to its output as ./jstt.ts. A line ending in
// "// error TSnnnn" must fail with exactly that error; every other line must compile.
import type {
  AppendParams,
  EmptyParams,
  ErrorObject,
  HostcoreProtocol,
  Message,
  Methods,
  Request,
  Response,
} from "./jstt.js";

type Params<M extends keyof Methods> = Methods[M]["params"];
type Result<M extends keyof Methods> = Methods[M]["result"];

// What an app writes compiles.
export const append: Params<"session.appendMessage"> = {
  sessionId: "chat-1",
  turnId: "t1",
  message: { id: "a1", role: "assistant", content: [{ type: "text", text: "Hi" }], usage: { out: 3 } },
};
export const request: Request = { jsonrpc: "2.0", id: 1, method: "session.appendMessage", params: append };
export const list: Params<"session.list"> = {};
export const version: HostcoreProtocol["protocolVersion"] = 11;
export const ended: Params<"session.endTurn"> = { sessionId: "s", turnId: "t", status: "aborted", recoverInflight: true };

export function read(r: Result<"session.appendMessage">, page: Result<"session.get">): number {
  const first: Message | undefined = page.messages[0];
  return r.line + (r.appended ? 1 : 0) + (first?.status === "aborted" ? 1 : 0);
}

export function describe(response: Response): string {
  if (!("error" in response)) return "ok";
  const error: ErrorObject = response.error;
  switch (error.data.code) {
    case "NOT_FOUND":
      return error.data.kind; // `data` is narrowed per code
    case "AGENT_BUSY":
      return error.data.turnId;
    case "PROTOCOL_MISMATCH":
      return String(error.data.expected);
    default:
      return error.message;
  }
}

// What must not compile.
export const notAMessage: AppendParams = { sessionId: "s", message: 42 }; // error TS2322
export function typo(r: Result<"session.appendMessage">): unknown { return r.apended; } // error TS2551
export const extra: Params<"session.list"> = { sessionId: "s" }; // error TS2353
export const notEmpty: EmptyParams = 42; // error TS2322
export const oldVersion: HostcoreProtocol["protocolVersion"] = 10; // error TS2322
export const badStatus: Message = { id: "m", role: "assistant", status: "completed" }; // error TS2820
export const badRole: Message = { id: "m", role: "robot" }; // error TS2322
export const badEnd: Params<"session.endTurn"> = { sessionId: "s", turnId: "t", status: "complete" }; // error TS2820
export const noSuchMethod: Params<"session.apend"> = {}; // error TS2344
export const mismatched: Request = { jsonrpc: "2.0", id: 1, method: "session.get", params: { limit: 5 } }; // error TS2322
export function wrongData(e: ErrorObject): unknown { return e.data.code === "CONFLICT" && e.data.kind; } // error TS2339
