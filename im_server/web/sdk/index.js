export { ImClient, countable } from "./client.js";
export { ApiError, ImTimeoutError, SendError } from "./errors.js";
export { Http, convPath } from "./http.js";
export { ReconnectingSocket, backoffDelay } from "./socket.js";
export { MemoryStorage } from "./storage.js";
export { ConvCursor, SyncState } from "./syncstate.js";
export { newId } from "./env.js";
