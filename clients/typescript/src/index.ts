/** hostcore's TypeScript client: spawn or connect, typed calls, the connect sequence. */
export {
  DEFAULT_DEADLINE_MS,
  DeadlineExceeded,
  HostClient,
  HostGone,
  RequestTooLarge,
  RpcError,
  type CallOptions,
  type ClientOptions,
  type ErrorName,
  type ErrorOf,
  type MethodName,
  type Notification,
  type Params,
  type Result,
  type SpawnOptions,
  type TraceEvent,
} from "./client.js";
export { connectSequence, type ConnectOptions, type Connected } from "./connect.js";
export {
  INBOX_BYTES,
  Watch,
  readLines,
  reconnectTo,
  type WatchEvent,
  type WatchOptions,
} from "./watch.js";
export { LineSplitter } from "./framing.js";
export * from "./protocol.js";
export {
  forkSession,
  highlight,
  listSessions,
  search,
  updateSession,
  type ListParams,
  type SearchHit,
  type SearchParams,
  type SearchResult,
  type SessionSummary,
} from "./organise.js";
