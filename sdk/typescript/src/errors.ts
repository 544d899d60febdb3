/** A REST call answered with a non-2xx status: `{error: {code, message}}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    /** the server's message alone (`message` is prefixed with the status and code) */
    readonly detail: string,
  ) {
    super(`${status} ${code}: ${detail}`);
    this.name = "ApiError";
  }
}

/** The ApiError of a non-2xx answer: its `{error: {code, message}}`, or a code made from
 * the status when the body is not the contract's (a proxy, a crash page). */
export function apiErrorOf(status: number, text: string): ApiError {
  let code = "http_" + status;
  let message = text.slice(0, 300);
  try {
    const err = (JSON.parse(text) as { error?: { code?: string; message?: string } }).error;
    if (err?.code) code = err.code;
    if (err?.message) message = err.message;
  } catch {
    /* not JSON */
  }
  return new ApiError(status, code, message);
}

/** A send refused by the server (`ack` with `ok: false`). Not retried. */
export class SendError extends Error {
  constructor(
    readonly code: string,
    /** the server's message alone (`message` is prefixed with the code) */
    readonly detail: string,
    readonly clientMsgId: string,
  ) {
    super(`${code}: ${detail}`);
    this.name = "SendError";
  }
}

/** No answer in time (a send never acked, the client closed meanwhile...). */
export class ImTimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ImTimeoutError";
  }
}
