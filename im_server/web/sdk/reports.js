// Read, delivered and typing reports. Read and delivered are gathered `reportDelayMs`
// and sent as one batch: over the socket, else (read only: there is no REST delivered
// report) over REST. Reports written to a socket that then died are queued again when
// the next one opens (`reopened`): they are forward-only on the server, so a repeat is
// harmless. Typing goes out at most once per 3 s per conversation.
import { g } from "./env.js";
import { backoffDelay } from "./socket.js";
export class Reporter {
    write;
    readRest;
    opts;
    readQueue = new Map();
    readWaiters = [];
    deliveredQueue = new Map();
    deliveredSent = new Map();
    readOnSocket = new Map();
    /** the highest read seq reported per conversation: a lower one is not sent after it */
    readSent = new Map();
    deliveredOnSocket = new Map();
    timer = null;
    /** REST read reports that failed in a row (the next try backs off) */
    failures = 0;
    stopped = false;
    typingAt = new Map();
    /** `write` puts one frame on the socket (false when none is open); `readRest` is the
     * REST read report. */
    constructor(write, readRest, opts = {}) {
        this.write = write;
        this.readRest = readRest;
        this.opts = opts;
    }
    /** Report my read cursor (forward only); resolves once sent (batched). */
    read(convId, seq) {
        if ((this.readQueue.get(convId) ?? 0) < seq)
            this.readQueue.set(convId, seq);
        const done = new Promise((resolve, reject) => this.readWaiters.push({ resolve, reject }));
        this.schedule();
        return done;
    }
    /** Report delivered up to `seq` (batched; kept until a socket is open). */
    delivered(convId, seq) {
        if ((this.deliveredSent.get(convId) ?? 0) >= seq)
            return;
        if ((this.deliveredQueue.get(convId) ?? 0) < seq)
            this.deliveredQueue.set(convId, seq);
        this.schedule();
    }
    /** A socket (re)opened: what went on the last one is sent again. */
    reopened() {
        for (const [conv, seq] of this.readOnSocket) {
            if ((this.readQueue.get(conv) ?? 0) < seq)
                this.readQueue.set(conv, seq);
        }
        for (const [conv, seq] of this.deliveredOnSocket) {
            if ((this.deliveredQueue.get(conv) ?? 0) < seq)
                this.deliveredQueue.set(conv, seq);
        }
        this.readOnSocket.clear();
        this.deliveredOnSocket.clear();
        this.failures = 0;
        g.clearTimeout(this.timer); // a backed-off retry goes now
        this.timer = null;
        if (this.readQueue.size || this.deliveredQueue.size)
            this.schedule();
    }
    /** Tell the others I am typing; false when throttled or no socket is open. */
    typing(convId) {
        const now = Date.now();
        if (now - (this.typingAt.get(convId) ?? 0) < (this.opts.typingEveryMs ?? 3000))
            return false;
        const sent = this.write({ type: "typing", conv_id: convId });
        if (sent)
            this.typingAt.set(convId, now);
        return sent;
    }
    /** I sent a message: the others clear my typing line on it, the next keystroke says
     * it again. */
    typingEnded(convId) {
        this.typingAt.delete(convId);
    }
    /** No more scheduled flushes (a flush by hand still sends). */
    stop() {
        this.stopped = true;
        g.clearTimeout(this.timer);
        this.timer = null;
    }
    schedule(delay = this.opts.reportDelayMs ?? 250) {
        if (this.timer !== null || this.stopped)
            return;
        this.timer = g.setTimeout(() => {
            this.timer = null;
            this.flush().catch(() => undefined);
        }, delay);
    }
    /** Send the batched read and delivered reports now. */
    async flush() {
        g.clearTimeout(this.timer);
        this.timer = null;
        const reads = [...this.readQueue];
        const waiters = this.readWaiters;
        this.readQueue.clear();
        this.readWaiters = [];
        let failed = null;
        let again = false;
        for (const [conv, seq] of reads) {
            if (seq < (this.readSent.get(conv) ?? 0))
                continue; // the cursor is past it already
            if (this.write({ type: "read", conv_id: conv, seq })) {
                this.readOnSocket.set(conv, Math.max(seq, this.readOnSocket.get(conv) ?? 0));
                this.readSent.set(conv, Math.max(seq, this.readSent.get(conv) ?? 0));
                continue;
            }
            try {
                await this.readRest(conv, seq);
                this.readSent.set(conv, Math.max(seq, this.readSent.get(conv) ?? 0));
            }
            catch (e) {
                failed = e;
                // a refusal (4xx) is final; unreachable (no status, or 0) or 5xx: again later
                const status = e?.status;
                if (typeof status !== "number" || status <= 0 || status >= 500) {
                    const q = this.readQueue.get(conv) ?? 0;
                    if (q < seq)
                        this.readQueue.set(conv, seq); // tried again later
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
        for (const w of waiters)
            (failed ? w.reject(failed) : w.resolve());
        this.failures = again ? this.failures + 1 : 0;
        if (this.readQueue.size) {
            this.schedule(again ? backoffDelay(this.failures, { baseMs: 500, maxMs: 15000 }) : undefined);
        }
    }
}
