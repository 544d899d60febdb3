// One WebSocket that reconnects by itself: jittered exponential back-off, an application
// ping to notice dead connections, online/offline hooks, close 4401 ends it for good.

import { OPEN, type WebSocketConstructor, type WebSocketLike, g } from "./env.js";

export type ConnectionStatus = "connecting" | "open" | "closed";

export interface BackoffOptions {
  /** First retry delay (ms), doubled per failed attempt. Default 300. */
  baseMs?: number;
  /** Cap of the delay (ms). Default 15000. */
  maxMs?: number;
  /** A connection attempt not open after this long is given up and retried (ms).
   * Default 10000. */
  connectTimeoutMs?: number;
}

export interface SocketHooks {
  onStatus(s: ConnectionStatus): void;
  onOpen(): void;
  onFrame(frame: Record<string, unknown>): void;
  onUnauthorized(): void;
}

export const PING_EVERY_MS = 20000;
export const PONG_TIMEOUT_MS = 8000;

/** Full-jitter-ish: uniform in [d/2, d] with d = min(max, base * 2^attempt). */
export function backoffDelay(attempt: number, o: BackoffOptions = {}): number {
  const base = o.baseMs ?? 300;
  const max = o.maxMs ?? 15000;
  const d = Math.min(max, base * 2 ** Math.min(attempt, 20));
  return d / 2 + Math.random() * (d / 2);
}

export class ReconnectingSocket {
  status: ConnectionStatus = "closed";
  private ws: WebSocketLike | null = null;
  private running = false;
  private online = true;
  private attempt = 0;
  private retryTimer: unknown = null;
  private pingTimer: unknown = null;
  private pongTimer: unknown = null;
  private connectTimer: unknown = null;

  constructor(
    private readonly url: () => string,
    private readonly Ctor: WebSocketConstructor,
    private readonly hooks: SocketHooks,
    private readonly backoff: BackoffOptions = {},
  ) {}

  get isOpen(): boolean {
    return this.status === "open";
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    this.open();
  }

  stop(): void {
    this.running = false;
    g.clearTimeout(this.retryTimer);
    this.stopPing();
    const ws = this.ws;
    this.ws = null;
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      try {
        ws.close(1000, "bye");
      } catch {
        /* already closed */
      }
    }
    this.setStatus("closed");
  }

  /** Tell the socket whether the network is there (browser online/offline, NetInfo). */
  setOnline(online: boolean): void {
    this.online = online;
    if (!online) this.drop("offline", false);
    else if (this.running) {
      g.clearTimeout(this.retryTimer);
      this.attempt = 0;
      if (!this.ws) this.open();
    }
  }

  send(frame: unknown): boolean {
    if (!this.ws || this.ws.readyState !== OPEN || this.status !== "open") return false;
    try {
      this.ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false;
    }
  }

  /** Give up on this connection now (no closing handshake) and retry later. */
  drop(reason: string, retry = true): void {
    const ws = this.ws;
    this.ws = null;
    this.stopPing();
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      try {
        ws.close(4000, reason);
      } catch {
        /* already closed */
      }
    }
    this.setStatus("closed");
    if (retry) this.scheduleRetry();
  }

  private setStatus(s: ConnectionStatus): void {
    if (this.status === s) return;
    this.status = s;
    this.hooks.onStatus(s);
  }

  private open(): void {
    if (!this.running || !this.online) return;
    g.clearTimeout(this.retryTimer);
    this.setStatus("connecting");
    let ws: WebSocketLike;
    try {
      ws = new this.Ctor(this.url());
    } catch {
      this.scheduleRetry();
      return;
    }
    this.ws = ws;
    // an attempt can hang (a server shutting down accepted the TCP connection)
    g.clearTimeout(this.connectTimer);
    this.connectTimer = g.setTimeout(() => {
      if (this.ws === ws && this.status === "connecting") this.drop("connect timeout");
    }, this.backoff.connectTimeoutMs ?? 10000);
    ws.onopen = () => {
      if (this.ws !== ws) return;
      g.clearTimeout(this.connectTimer);
      this.attempt = 0;
      this.setStatus("open");
      this.startPing();
      this.hooks.onOpen();
    };
    ws.onmessage = (ev) => {
      if (this.ws !== ws) return;
      g.clearTimeout(this.pongTimer);
      const data = typeof ev.data === "string" ? ev.data : String(ev.data);
      let frame: unknown;
      try {
        frame = JSON.parse(data);
      } catch {
        return;
      }
      if (frame && typeof frame === "object" && !Array.isArray(frame)) {
        this.hooks.onFrame(frame as Record<string, unknown>);
      }
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
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

  private scheduleRetry(): void {
    if (!this.running || !this.online) return;
    g.clearTimeout(this.retryTimer);
    const delay = backoffDelay(this.attempt, this.backoff);
    this.attempt += 1;
    this.retryTimer = g.setTimeout(() => this.open(), delay);
  }

  private startPing(): void {
    this.stopPing();
    const tick = () => {
      const ws = this.ws;
      if (this.send({ type: "ping" })) {
        g.clearTimeout(this.pongTimer);
        this.pongTimer = g.setTimeout(() => {
          if (ws && this.ws === ws) this.drop("no pong");
        }, PONG_TIMEOUT_MS);
      }
      this.pingTimer = g.setTimeout(tick, PING_EVERY_MS);
    };
    this.pingTimer = g.setTimeout(tick, PING_EVERY_MS);
  }

  private stopPing(): void {
    g.clearTimeout(this.connectTimer);
    g.clearTimeout(this.pingTimer);
    g.clearTimeout(this.pongTimer);
  }
}
