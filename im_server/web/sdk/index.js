export { ImClient, countable } from "./client.js";
export { ApiError, ImTimeoutError, SendError } from "./errors.js";
export { Http, convPath, sendBody } from "./http.js";
export { ReconnectingSocket, backoffDelay } from "./socket.js";
export { Outbox, RETRIED_CODES } from "./outbox.js";
export { Reporter } from "./reports.js";
export { MemoryStorage } from "./storage.js";
export { ConvCursor, SyncState } from "./syncstate.js";
export { newId } from "./env.js";
