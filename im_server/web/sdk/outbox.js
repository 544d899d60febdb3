// Sends until acked: each frame carries its client_msg_id and is written again, with the
// same id, after every reconnect (`resendAll`) and after `ackTimeoutMs` without an ack;
// the server dedupes. "Not now" refusals (unavailable, rate_limited) are retried with
// back-off; other refusals reject with SendError.
import { g } from "./env.js";
import { ImTimeoutError, SendError } from "./errors.js";
import { backoffDelay } from "./socket.js";
/** Refusals that say "not now": the send is tried again (same client_msg_id). */
export const RETRIED_CODES = new Set(["unavailable", "rate_limited"]);
export class Outbox {
    write;
    opts;
    pending = new Map();
    /** `write` puts one frame on the socket, false when there is none open. */
    constructor(write, opts = {}) {
        this.write = write;
        this.opts = opts;
    }
    /** Messages sent but not acked yet. */
    get size() {
        return this.pending.size;
    }
    has(clientMsgId) {
        return this.pending.has(clientMsgId);
    }
    /** Send a "send" frame (with its client_msg_id) until acked. `onAck` runs on the ack,
     * before the promise resolves. A send of an id already pending replaces it. */
    send(frame, opts = {}) {
        const id = frame.client_msg_id;
        const old = this.pending.get(id);
        if (old)
            this.forget(id, old);
        const timeout = opts.timeoutMs ?? this.opts.sendTimeoutMs ?? 120000;
        return new Promise((resolve, reject) => {
            const p = {
                frame,
                resolve: (a) => {
                    opts.onAck?.(a);
                    resolve(a);
                },
                reject,
                retryTimer: null,
                refusals: 0,
                deadline: timeout > 0 && Number.isFinite(timeout)
                    ? g.setTimeout(() => {
                        if (this.pending.get(id) !== p)
                            return;
                        this.forget(id, p);
                        reject(new ImTimeoutError(`no ack for ${id}`));
                    }, timeout)
                    : null,
            };
            this.pending.set(id, p);
            this.transmit(p);
        });
    }
    /** Write every unacked frame again (the socket just opened). */
    resendAll() {
        for (const p of this.pending.values())
            this.transmit(p);
    }
    /** An ack frame; true when it answered a send of this outbox. */
    onAck(a) {
        const id = a.client_msg_id;
        if (!id)
            return false;
        const p = this.pending.get(id);
        if (!p)
            return false;
        g.clearTimeout(p.retryTimer);
        if (a.ok) {
            this.forget(id, p);
            p.resolve(a);
        }
        else if (RETRIED_CODES.has(a.code) && p.refusals < (this.opts.maxRefusals ?? 8)) {
            // a transient refusal: the same frame again after a back-off
            p.refusals += 1;
            p.retryTimer = g.setTimeout(() => {
                if (this.pending.get(id) === p)
                    this.transmit(p);
            }, backoffDelay(p.refusals, { baseMs: 200, maxMs: 5000 }));
        }
        else {
            this.forget(id, p);
            p.reject(new SendError(a.code, a.message, id));
        }
        return true;
    }
    /** Stop: every unacked send rejects with `error`. */
    rejectAll(error) {
        const all = [...this.pending];
        for (const [id, p] of all)
            this.forget(id, p);
        for (const [, p] of all)
            p.reject(error);
    }
    forget(id, p) {
        g.clearTimeout(p.retryTimer);
        g.clearTimeout(p.deadline);
        if (this.pending.get(id) === p)
            this.pending.delete(id);
    }
    transmit(p) {
        g.clearTimeout(p.retryTimer);
        this.write(p.frame);
        // written or not: try again later (a reconnect writes it at once anyway)
        const id = p.frame.client_msg_id;
        p.retryTimer = g.setTimeout(() => {
            if (this.pending.get(id) === p)
                this.transmit(p);
        }, this.opts.ackTimeoutMs ?? 10000);
    }
}
