// The WebSocket: the SDK's ReconnectingSocket (reconnect with jittered back-off, the
// application ping, close 4401) wired to the browser's online/offline events (a socket
// does not always notice that the network went away) and dispatched as DOM events.
//
// Events (EventTarget): "status" (detail: "connecting" | "open" | "closed"),
// "frame" (detail: the parsed frame), "open", "unauthorized" (close 4401).

import { ReconnectingSocket } from './sdk/index.js';

export class Socket extends EventTarget {
  constructor(urlFor) {
    super();
    this.ws = new ReconnectingSocket(urlFor, WebSocket, {
      onStatus: (s) => this.dispatchEvent(new CustomEvent('status', { detail: s })),
      onOpen: () => this.dispatchEvent(new Event('open')),
      onFrame: (f) => { if (f.type !== 'pong') this.dispatchEvent(new CustomEvent('frame', { detail: f })); },
      onUnauthorized: () => this.dispatchEvent(new Event('unauthorized')),
    });
    // the "offline" event drops the connection (its closing handshake would never end)
    // but attempts go on with back-off: navigator.onLine is not trusted (it can be false
    // with a server on localhost); the "online" event retries at once
    this.onOnline = () => this.ws.setOnline(true);
    this.onOffline = () => this.ws.drop('offline');
  }

  get status() { return this.ws.status; }
  get isOpen() { return this.ws.isOpen; }

  start() {
    window.addEventListener('online', this.onOnline);
    window.addEventListener('offline', this.onOffline);
    this.ws.start();
  }

  stop() {
    window.removeEventListener('online', this.onOnline);
    window.removeEventListener('offline', this.onOffline);
    this.ws.stop();
  }

  send(frame) { return this.ws.send(frame); }

  /** Give up on the current connection now and reconnect (with back-off). */
  drop(reason) { this.ws.drop(reason); }
}
