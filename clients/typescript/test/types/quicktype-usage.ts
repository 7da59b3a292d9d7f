// Type-level checks on `npx quicktype -s schema docs/protocol.schema.json -l ts`, compiled by
// test/schema.test.ts next to its output as ./quicktype.ts. A line ending in
// "// error TSnnnn" must fail with exactly that error; every other line must compile.
import {
  Convert,
  MessageStatus,
  Role,
  TurnStatus,
  type AppendParams,
  type Message,
  type Methods,
  type ProtocolSchema,
} from "./quicktype.js";

type Params<M extends keyof Methods> = Methods[M]["params"];
type Result<M extends keyof Methods> = Methods[M]["result"];

// What an app writes compiles.
export const append: Params<"session.appendMessage"> = {
  sessionId: "s",
  message: { id: "a1", role: Role.Assistant, content: "hi", usage: { out: 3 } },
};
export const ended: Params<"session.endTurn"> = { sessionId: "s", turnId: "t", status: TurnStatus.Aborted };
export function read(r: Result<"session.appendMessage">, page: Result<"session.get">): number {
  return r.line + (page.messages[0]?.status === MessageStatus.Aborted ? 1 : 0);
}
export const parse = (json: string): ProtocolSchema => Convert.toProtocolSchema(json);

// What must not compile.
export const notAMessage: AppendParams = { sessionId: "s", message: 42 }; // error TS2322
export function typo(r: Result<"session.appendMessage">): unknown { return r.apended; } // error TS2551
export const badRole: Message = { id: "m", role: "robot" }; // error TS2322
export const badStatus: Message = { id: "m", role: Role.User, status: "completed" }; // error TS2820
export const noSuchMethod: Params<"session.apend"> = {}; // error TS2344
