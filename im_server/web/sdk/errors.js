/** A REST call answered with a non-2xx status: `{error: {code, message}}`. */
export class ApiError extends Error {
    status;
    code;
    detail;
    constructor(status, code, 
    /** the server's message alone (`message` is prefixed with the status and code) */
    detail) {
        super(`${status} ${code}: ${detail}`);
        this.status = status;
        this.code = code;
        this.detail = detail;
        this.name = "ApiError";
    }
}
/** The ApiError of a non-2xx answer: its `{error: {code, message}}`, or a code made from
 * the status when the body is not the contract's (a proxy, a crash page). */
export function apiErrorOf(status, text) {
    let code = "http_" + status;
    let message = text.slice(0, 300);
    try {
        const err = JSON.parse(text).error;
        if (err?.code)
            code = err.code;
        if (err?.message)
            message = err.message;
    }
    catch {
        /* not JSON */
    }
    return new ApiError(status, code, message);
}
/** A send refused by the server (`ack` with `ok: false`). Not retried. */
export class SendError extends Error {
    code;
    detail;
    clientMsgId;
    constructor(code, 
    /** the server's message alone (`message` is prefixed with the code) */
    detail, clientMsgId) {
        super(`${code}: ${detail}`);
        this.code = code;
        this.detail = detail;
        this.clientMsgId = clientMsgId;
        this.name = "SendError";
    }
}
/** No answer in time (a send never acked, the client closed meanwhile...). */
export class ImTimeoutError extends Error {
    constructor(message) {
        super(message);
        this.name = "ImTimeoutError";
    }
}
