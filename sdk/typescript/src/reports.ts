// Read, delivered and typing reports. Read and delivered are gathered `reportDelayMs`
// and sent as one batch: over the socket, else (read only: there is no REST delivered
// report) over REST. Reports written to a socket that then died are queued again when
// the next one opens (`reopened`): they are forward-only on the server, so a repeat is
// harmless. Typing goes out at most once per 3 s per conversation.

import { g } from "./env.js";
import { backoffDelay } from "./socket.js";

export interface ReporterOptions {
  /** Read and delivered reports are gathered this long, then sent (ms). Default 250. */
  reportDelayMs?: number;
  /** Typing is sent at most once per this long per conversation (ms). Default 3000. */
  typingEveryMs?: number;
}

export class Reporter {
  private readQueue = new Map<string, number>();
  private readWaiters: Array<{ resolve(): void; reject(e: Error): void }> = [];
  private deliveredQueue = new Map<string, number>();
  private deliveredSent = new Map<string, number>();
  private readOnSocket = new Map<string, number>();
  /** the highest read seq reported per conversation: a lower one is not sent after it */
  private readSent = new Map<string, number>();
  private deliveredOnSocket = new Map<string, number>();
  private timer: unknown = null;
  /** REST read reports that failed in a row (the next try backs off) */
  private failures = 0;
  private stopped = false;
  private typingAt = new Map<string, number>();

  /** `write` puts one frame on the socket (false when none is open); `readRest` is the
   * REST read report. */
  constructor(
    private readonly write: (frame: Record<string, unknown>) => boolean,
    private readonly readRest: (convId: string, seq: number) => Promise<unknown>,
    private readonly opts: ReporterOptions = {},
  ) {}

  /** Report my read cursor (forward only); resolves once sent (batched). */
  read(convId: string, seq: number): Promise<void> {
    if ((this.readQueue.get(convId) ?? 0) < seq) this.readQueue.set(convId, seq);
    const done = new Promise<void>((resolve, reject) => this.readWaiters.push({ resolve, reject }));
    this.schedule();
    return done;
  }

  /** Report delivered up to `seq` (batched; kept until a socket is open). */
  delivered(convId: string, seq: number): void {
    if ((this.deliveredSent.get(convId) ?? 0) >= seq) return;
    if ((this.deliveredQueue.get(convId) ?? 0) < seq) this.deliveredQueue.set(convId, seq);
    this.schedule();
  }

  /** A socket (re)opened: what went on the last one is sent again. */
  reopened(): void {
    for (const [conv, seq] of this.readOnSocket) {
      if ((this.readQueue.get(conv) ?? 0) < seq) this.readQueue.set(conv, seq);
    }
    for (const [conv, seq] of this.deliveredOnSocket) {
      if ((this.deliveredQueue.get(conv) ?? 0) < seq) this.deliveredQueue.set(conv, seq);
    }
    this.readOnSocket.clear();
    this.deliveredOnSocket.clear();
    this.failures = 0;
    g.clearTimeout(this.timer); // a backed-off retry goes now
    this.timer = null;
    if (this.readQueue.size || this.deliveredQueue.size) this.schedule();
  }

  /** Tell the others I am typing; false when throttled or no socket is open. */
  typing(convId: string): boolean {
    const now = Date.now();
    if (now - (this.typingAt.get(convId) ?? 0) < (this.opts.typingEveryMs ?? 3000)) return false;
    const sent = this.write({ type: "typing", conv_id: convId });
    if (sent) this.typingAt.set(convId, now);
    return sent;
  }

  /** I sent a message: the others clear my typing line on it, the next keystroke says
   * it again. */
  typingEnded(convId: string): void {
    this.typingAt.delete(convId);
  }

  /** No more scheduled flushes (a flush by hand still sends). */
  stop(): void {
    this.stopped = true;
    g.clearTimeout(this.timer);
    this.timer = null;
  }

  private schedule(delay = this.opts.reportDelayMs ?? 250): void {
    if (this.timer !== null || this.stopped) return;
    this.timer = g.setTimeout(() => {
      this.timer = null;
      this.flush().catch(() => undefined);
    }, delay);
  }

  /** Send the batched read and delivered reports now. */
  async flush(): Promise<void> {
    g.clearTimeout(this.timer);
    this.timer = null;
    const reads = [...this.readQueue];
    const waiters = this.readWaiters;
    this.readQueue.clear();
    this.readWaiters = [];
    let failed: Error | null = null;
    let again = false;
    for (const [conv, seq] of reads) {
      if (seq < (this.readSent.get(conv) ?? 0)) continue; // the cursor is past it already
      if (this.write({ type: "read", conv_id: conv, seq })) {
        this.readOnSocket.set(conv, Math.max(seq, this.readOnSocket.get(conv) ?? 0));
        this.readSent.set(conv, Math.max(seq, this.readSent.get(conv) ?? 0));
        continue;
      }
      try {
        await this.readRest(conv, seq);
        this.readSent.set(conv, Math.max(seq, this.readSent.get(conv) ?? 0));
      } catch (e) {
        failed = e as Error;
        // a refusal (4xx) is final; unreachable (no status, or 0) or 5xx: again later
        const status = (e as { status?: unknown } | null)?.status;
        if (typeof status !== "number" || status <= 0 || status >= 500) {
          const q = this.readQueue.get(conv) ?? 0;
          if (q < seq) this.readQueue.set(conv, seq); // tried again later
          again = true;
        }
      }
    }
    for (const [conv, seq] of [...this.deliveredQueue]) {
      if (this.write({ type: "delivered", conv_id: conv, seq })) {
        this.deliveredQueue.delete(conv);
        this.deliveredSent.set(conv, Math.max(seq, this.deliveredSent.get(conv) ?? 0));
        this.deliveredOnSocket.set(conv, Math.max(seq, this.deliveredOnSocket.get(conv) ?? 0));
      }
      // else kept until the socket opens (there is no REST delivered report)
    }
    for (const w of waiters) (failed ? w.reject(failed) : w.resolve());
    this.failures = again ? this.failures + 1 : 0;
    if (this.readQueue.size) {
      this.schedule(again ? backoffDelay(this.failures, { baseMs: 500, maxMs: 15000 }) : undefined);
    }
  }
}
