// The WebSocket: one JSON object per frame, reconnect with exponential backoff and
// jitter, an application ping to notice dead connections, and the browser's own
// online/offline events (a socket does not always notice that the network went away).
//
// Events (EventTarget): "status" (detail: "connecting" | "open" | "closed"),
// "frame" (detail: the parsed frame), "open", "unauthorized" (close 4401).

const PING_EVERY_MS = 20000;
const PONG_TIMEOUT_MS = 8000;
const BACKOFF_MS = [300, 1000, 2000, 4000, 8000, 15000];

export class Socket extends EventTarget {
  constructor(urlFor) {
    super();
    this.urlFor = urlFor; // () => ws url (with token)
    this.ws = null;
    this.status = 'closed';
    this.attempt = 0;
    this.running = false;
    this.retryTimer = null;
    this.pingTimer = null;
    this.pongTimer = null;
    this.onOnline = () => { if (this.running) this.reconnectNow(); };
    this.onOffline = () => this.drop('offline');
  }

  start() {
    if (this.running) return;
    this.running = true;
    window.addEventListener('online', this.onOnline);
    window.addEventListener('offline', this.onOffline);
    this.connect();
  }

  stop() {
    this.running = false;
    window.removeEventListener('online', this.onOnline);
    window.removeEventListener('offline', this.onOffline);
    clearTimeout(this.retryTimer);
    this.stopPing();
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.onclose = null;
      ws.close(1000, 'bye');
    }
    this.setStatus('closed');
  }

  get isOpen() { return this.status === 'open'; }

  send(frame) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  reconnectNow() {
    clearTimeout(this.retryTimer);
    this.attempt = 0;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN && this.status !== 'closed') return;
    this.connect();
  }

  setStatus(s) {
    if (this.status === s) return;
    this.status = s;
    this.dispatchEvent(new CustomEvent('status', { detail: s }));
  }

  connect() {
    if (!this.running) return;
    clearTimeout(this.retryTimer);
    // navigator.onLine is not trusted (it can be false with a server on localhost):
    // attempts go on with backoff, and the "online" event retries at once
    this.setStatus('connecting');
    let ws;
    try {
      ws = new WebSocket(this.urlFor());
    } catch {
      this.scheduleRetry();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      if (this.ws !== ws) return;
      this.attempt = 0;
      this.setStatus('open');
      this.startPing();
      this.dispatchEvent(new Event('open'));
    };
    ws.onmessage = (ev) => {
      if (this.ws !== ws) return;
      this.gotTraffic();
      let frame;
      try { frame = JSON.parse(ev.data); } catch { return; }
      if (frame && frame.type === 'pong') return;
      this.dispatchEvent(new CustomEvent('frame', { detail: frame }));
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.stopPing();
      this.setStatus('closed');
      if (ev.code === 4401) {
        this.running = false;
        this.dispatchEvent(new Event('unauthorized'));
        return;
      }
      this.scheduleRetry();
    };
    ws.onerror = () => { /* onclose follows */ };
  }

  // Give up on the current connection now, without waiting for a closing handshake that
  // a dead network would never complete, and reconnect (when the browser is online).
  drop(reason) {
    const ws = this.ws;
    if (!ws) return;
    this.ws = null;
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    try { ws.close(4000, reason); } catch { /* already closed */ }
    this.stopPing();
    this.setStatus('closed');
    this.scheduleRetry();
  }

  scheduleRetry() {
    if (!this.running) return;
    const base = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    this.attempt += 1;
    const delay = base / 2 + Math.random() * base / 2;
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  startPing() {
    this.stopPing();
    this.pingTimer = setInterval(() => {
      if (!this.send({ type: 'ping' })) return;
      clearTimeout(this.pongTimer);
      const ws = this.ws;
      this.pongTimer = setTimeout(() => { if (ws && this.ws === ws) this.drop('no pong'); }, PONG_TIMEOUT_MS);
    }, PING_EVERY_MS);
  }

  gotTraffic() { clearTimeout(this.pongTimer); }

  stopPing() {
    clearInterval(this.pingTimer);
    clearTimeout(this.pongTimer);
  }
}
