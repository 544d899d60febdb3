// One WebSocket that reconnects by itself: jittered exponential back-off, an application
// ping to notice dead connections, online/offline hooks, close 4401 ends it for good.
import { OPEN, g } from "./env.js";
export const PING_EVERY_MS = 20000;
export const PONG_TIMEOUT_MS = 8000;
/** Full-jitter-ish: uniform in [d/2, d] with d = min(max, base * 2^attempt). */
export function backoffDelay(attempt, o = {}) {
    const base = o.baseMs ?? 300;
    const max = o.maxMs ?? 15000;
    const d = Math.min(max, base * 2 ** Math.min(attempt, 20));
    return d / 2 + Math.random() * (d / 2);
}
export class ReconnectingSocket {
    url;
    Ctor;
    hooks;
    backoff;
    status = "closed";
    ws = null;
    running = false;
    online = true;
    attempt = 0;
    retryTimer = null;
    pingTimer = null;
    pongTimer = null;
    connectTimer = null;
    constructor(url, Ctor, hooks, backoff = {}) {
        this.url = url;
        this.Ctor = Ctor;
        this.hooks = hooks;
        this.backoff = backoff;
    }
    get isOpen() {
        return this.status === "open";
    }
    start() {
        if (this.running)
            return;
        this.running = true;
        this.open();
    }
    stop() {
        this.running = false;
        g.clearTimeout(this.retryTimer);
        this.stopPing();
        const ws = this.ws;
        this.ws = null;
        if (ws) {
            ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
            try {
                ws.close(1000, "bye");
            }
            catch {
                /* already closed */
            }
        }
        this.setStatus("closed");
    }
    /** Tell the socket whether the network is there (browser online/offline, NetInfo). */
    setOnline(online) {
        this.online = online;
        if (!online)
            this.drop("offline", false);
        else if (this.running) {
            g.clearTimeout(this.retryTimer);
            this.attempt = 0;
            if (!this.ws)
                this.open();
        }
    }
    send(frame) {
        if (!this.ws || this.ws.readyState !== OPEN || this.status !== "open")
            return false;
        try {
            this.ws.send(JSON.stringify(frame));
            return true;
        }
        catch {
            return false;
        }
    }
    /** Give up on this connection now (no closing handshake) and retry later. */
    drop(reason, retry = true) {
        const ws = this.ws;
        this.ws = null;
        this.stopPing();
        if (ws) {
            ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
            try {
                ws.close(4000, reason);
            }
            catch {
                /* already closed */
            }
        }
        this.setStatus("closed");
        if (retry)
            this.scheduleRetry();
    }
    setStatus(s) {
        if (this.status === s)
            return;
        this.status = s;
        this.hooks.onStatus(s);
    }
    open() {
        if (!this.running || !this.online)
            return;
        g.clearTimeout(this.retryTimer);
        this.setStatus("connecting");
        let ws;
        try {
            ws = new this.Ctor(this.url());
        }
        catch {
            this.scheduleRetry();
            return;
        }
        this.ws = ws;
        // an attempt can hang (a server shutting down accepted the TCP connection)
        g.clearTimeout(this.connectTimer);
        this.connectTimer = g.setTimeout(() => {
            if (this.ws === ws && this.status === "connecting")
                this.drop("connect timeout");
        }, this.backoff.connectTimeoutMs ?? 10000);
        ws.onopen = () => {
            if (this.ws !== ws)
                return;
            g.clearTimeout(this.connectTimer);
            this.attempt = 0;
            this.setStatus("open");
            this.startPing();
            this.hooks.onOpen();
        };
        ws.onmessage = (ev) => {
            if (this.ws !== ws)
                return;
            g.clearTimeout(this.pongTimer);
            const data = typeof ev.data === "string" ? ev.data : String(ev.data);
            let frame;
            try {
                frame = JSON.parse(data);
            }
            catch {
                return;
            }
            if (frame && typeof frame === "object" && !Array.isArray(frame)) {
                this.hooks.onFrame(frame);
            }
        };
        ws.onclose = (ev) => {
            if (this.ws !== ws)
                return;
            this.ws = null;
            this.stopPing();
            this.setStatus("closed");
            if (ev.code === 4401) {
                this.running = false;
                this.hooks.onUnauthorized();
                return;
            }
            this.scheduleRetry();
        };
        ws.onerror = () => {
            /* onclose follows */
        };
    }
    scheduleRetry() {
        if (!this.running || !this.online)
            return;
        g.clearTimeout(this.retryTimer);
        const delay = backoffDelay(this.attempt, this.backoff);
        this.attempt += 1;
        this.retryTimer = g.setTimeout(() => this.open(), delay);
    }
    startPing() {
        this.stopPing();
        const tick = () => {
            const ws = this.ws;
            if (this.send({ type: "ping" })) {
                g.clearTimeout(this.pongTimer);
                this.pongTimer = g.setTimeout(() => {
                    if (ws && this.ws === ws)
                        this.drop("no pong");
                }, PONG_TIMEOUT_MS);
            }
            this.pingTimer = g.setTimeout(tick, PING_EVERY_MS);
        };
        this.pingTimer = g.setTimeout(tick, PING_EVERY_MS);
    }
    stopPing() {
        g.clearTimeout(this.connectTimer);
        g.clearTimeout(this.pingTimer);
        g.clearTimeout(this.pongTimer);
    }
}
