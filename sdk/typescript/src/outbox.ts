// Sends until acked: each frame carries its client_msg_id and is written again, with the
// same id, after every reconnect (`resendAll`) and after `ackTimeoutMs` without an ack;
// the server dedupes. "Not now" refusals (unavailable, rate_limited) are retried with
// back-off; other refusals reject with SendError.

import { g } from "./env.js";
import { ImTimeoutError, SendError } from "./errors.js";
import { backoffDelay } from "./socket.js";
import type { AckOk, AckRefused } from "./wire.js";

/** Refusals that say "not now": the send is tried again (same client_msg_id). */
export const RETRIED_CODES = new Set(["unavailable", "rate_limited"]);

export interface OutboxOptions {
  /** Time to wait for one ack before sending the frame again (ms). Default 10000. */
  ackTimeoutMs?: number;
  /** Give up on a send after this long without an ack (ms); 0 or Infinity: never.
   * Default 120000. */
  sendTimeoutMs?: number;
  /** Transient refusals retried before the send fails. Default 8. */
  maxRefusals?: number;
}

interface Pending {
  frame: Record<string, unknown>;
  resolve(a: AckOk): void;
  reject(e: Error): void;
  retryTimer: unknown;
  deadline: unknown;
  refusals: number;
}

export class Outbox {
  private pending = new Map<string, Pending>();

  /** `write` puts one frame on the socket, false when there is none open. */
  constructor(
    private readonly write: (frame: Record<string, unknown>) => boolean,
    private readonly opts: OutboxOptions = {},
  ) {}

  /** Messages sent but not acked yet. */
  get size(): number {
    return this.pending.size;
  }

  has(clientMsgId: string): boolean {
    return this.pending.has(clientMsgId);
  }

  /** Send a "send" frame (with its client_msg_id) until acked. `onAck` runs on the ack,
   * before the promise resolves. A send of an id already pending replaces it. */
  send(
    frame: Record<string, unknown> & { client_msg_id: string },
    opts: { timeoutMs?: number; onAck?: (a: AckOk) => void } = {},
  ): Promise<AckOk> {
    const id = frame.client_msg_id;
    const old = this.pending.get(id);
    if (old) this.forget(id, old);
    const timeout = opts.timeoutMs ?? this.opts.sendTimeoutMs ?? 120000;
    return new Promise<AckOk>((resolve, reject) => {
      const p: Pending = {
        frame,
        resolve: (a) => {
          opts.onAck?.(a);
          resolve(a);
        },
        reject,
        retryTimer: null,
        refusals: 0,
        deadline:
          timeout > 0 && Number.isFinite(timeout)
            ? g.setTimeout(() => {
                if (this.pending.get(id) !== p) return;
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
  resendAll(): void {
    for (const p of this.pending.values()) this.transmit(p);
  }

  /** An ack frame; true when it answered a send of this outbox. */
  onAck(a: AckOk | AckRefused): boolean {
    const id = a.client_msg_id;
    if (!id) return false;
    const p = this.pending.get(id);
    if (!p) return false;
    g.clearTimeout(p.retryTimer);
    if (a.ok) {
      this.forget(id, p);
      p.resolve(a);
    } else if (RETRIED_CODES.has(a.code) && p.refusals < (this.opts.maxRefusals ?? 8)) {
      // a transient refusal: the same frame again after a back-off
      p.refusals += 1;
      p.retryTimer = g.setTimeout(() => {
        if (this.pending.get(id) === p) this.transmit(p);
      }, backoffDelay(p.refusals, { baseMs: 200, maxMs: 5000 }));
    } else {
      this.forget(id, p);
      p.reject(new SendError(a.code, a.message, id));
    }
    return true;
  }

  /** Stop: every unacked send rejects with `error`. */
  rejectAll(error: Error): void {
    const all = [...this.pending];
    for (const [id, p] of all) this.forget(id, p);
    for (const [, p] of all) p.reject(error);
  }

  private forget(id: string, p: Pending): void {
    g.clearTimeout(p.retryTimer);
    g.clearTimeout(p.deadline);
    if (this.pending.get(id) === p) this.pending.delete(id);
  }

  private transmit(p: Pending): void {
    g.clearTimeout(p.retryTimer);
    this.write(p.frame);
    // written or not: try again later (a reconnect writes it at once anyway)
    const id = p.frame.client_msg_id as string;
    p.retryTimer = g.setTimeout(() => {
      if (this.pending.get(id) === p) this.transmit(p);
    }, this.opts.ackTimeoutMs ?? 10000);
  }
}
