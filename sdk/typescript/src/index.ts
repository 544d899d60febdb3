export { ImClient, countable } from "./client.js";
export type {
  ConvState,
  HistoryOptions,
  HistoryResult,
  ImClientOptions,
  ImEvents,
  SyncResult,
} from "./client.js";
export { ApiError, ImTimeoutError, SendError } from "./errors.js";
export { Http, convPath, sendBody } from "./http.js";
export type { HistoryQuery, Query, SendOptions } from "./http.js";
export { ReconnectingSocket, backoffDelay } from "./socket.js";
export type { BackoffOptions, ConnectionStatus } from "./socket.js";
export { Outbox, RETRIED_CODES } from "./outbox.js";
export type { OutboxOptions } from "./outbox.js";
export { GAP_RETRY_MS, pullPages, syncPages } from "./recipe.js";
export type { SyncPagesOptions } from "./recipe.js";
export { Reporter } from "./reports.js";
export type { ReporterOptions } from "./reports.js";
export { MemoryStorage } from "./storage.js";
export type { StateStorage } from "./storage.js";
export { Segment } from "./segment.js";
export { ConvCursor, SyncState } from "./syncstate.js";
export type { Interval, SeqRange, SyncStateSnapshot } from "./syncstate.js";
export { newId } from "./env.js";
export type { FetchLike, WebSocketConstructor, WebSocketLike } from "./env.js";
export type * from "./wire.js";
