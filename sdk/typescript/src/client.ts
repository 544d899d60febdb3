// ImClient: a session, its WebSocket, the catch-up recipe of docs/sync.md and the local
// state per conversation. The logic is the Python client's (im_server/client: Device,
// SyncState) and the web client's (reconnect, resends, batched read/delivered reports).

import {
  type AbortControllerLike,
  type FetchLike,
  type WebSocketConstructor,
  g,
  platformWebSocket,
  newId,
  sleep,
} from "./env.js";
import { ApiError, ImTimeoutError } from "./errors.js";
import { type HistoryQuery, Http, type SendOptions, sendBody } from "./http.js";
import { type BackoffOptions, type ConnectionStatus, ReconnectingSocket, backoffDelay } from "./socket.js";
import { Outbox } from "./outbox.js";
import { GAP_RETRY_MS, pullPages, syncPages } from "./recipe.js";
import { Reporter } from "./reports.js";
import { MemoryStorage, type StateStorage } from "./storage.js";
import { type SeqRange, SyncState, type SyncStateSnapshot } from "./syncstate.js";
import type {
  AckOk,
  AckRefused,
  ContactsPush,
  DeliveredPush,
  Edited,
  ErrorFrame,
  Message,
  PresencePush,
  ReadPush,
  ReceiptPush,
  ServerFrame,
  SyncedGroupState,
  SyncedSingleState,
  TypingPush,
} from "./wire.js";

export interface ImClientOptions {
  /** WebSocket constructor; default the global one, else the `ws` package's when it is
   * installed (Node 20 has no global WebSocket). */
  WebSocket?: WebSocketConstructor;
  /** fetch; default the global one. */
  fetch?: FetchLike;
  /** Where the local state is kept; default in memory. */
  storage?: StateStorage;
  /** Newest messages embedded per conversation in a sync answer (server default 20). */
  recent?: number;
  /** Seqs per history page when pulling ranges (at most 200). Default 200. */
  pageSize?: number;
  /** Parallel range pulls during a catch-up. Default 4. */
  pullConcurrency?: number;
  /** Read and delivered reports are gathered this long, then sent (ms). Default 250. */
  reportDelayMs?: number;
  /** Report `delivered` for messages of others as they arrive. Default true. */
  autoDelivered?: boolean;
  /** Time to wait for one ack before sending the frame again (ms). Default 10000. */
  ackTimeoutMs?: number;
  /** Give up on a send after this long without an ack (ms). Default 120000. */
  sendTimeoutMs?: number;
  /** Long-poll the sync while the socket is down (docs/sync.md step 6). Default true. */
  longPoll?: boolean;
  /** Seconds of one long poll (at most 30). Default 25. */
  longPollWaitS?: number;
  backoff?: BackoffOptions;
}

/** What the client knows of one conversation, kept consistent with pushes. */
export interface ConvState {
  conv_id: string;
  type: "single" | "group";
  peer_id?: number | null;
  group_id?: number;
  name?: string;
  /** my visible window */
  min_seq: number;
  max_seq: number;
  read_seq: number;
  unread: number;
  mention_unread: number;
  peer_read_seq: number;
  peer_delivered_seq: number;
  muted: boolean;
  pinned: boolean;
  hidden: boolean;
  active?: boolean;
  last_message: Message | null;
  version: number;
}

export interface HistoryOptions extends HistoryQuery {
  /** Only seqs below this one (newest first on the server, returned ascending). */
  before?: number;
  /** Only seqs above this one (oldest first). */
  after?: number;
}

export interface HistoryResult {
  /** ascending by seq */
  messages: Message[];
  min_seq: number;
  max_seq: number;
  /** nothing further in the paging direction */
  is_end: boolean;
  /** pass as `before` for the next older page (null at the start) */
  next_before: number | null;
}

export interface SyncResult {
  /** messages new to this device (each also went to the "message" event) */
  messages: number;
  /** conversation states that changed */
  conversations: number;
  version: number;
}

export interface ImEvents {
  /** a message new to this device, once per (conv_id, seq): pushes, catch-up, own acked sends */
  message: Message;
  read: ReadPush;
  delivered: DeliveredPush;
  typing: TypingPush;
  presence: PresencePush;
  /** my friends or pending friend requests changed: read them again */
  contacts: ContactsPush;
  receipt: ReceiptPush;
  edited: Edited;
  error: ErrorFrame;
  ack: AckOk | AckRefused;
  /** every frame the server sent, known type or not */
  frame: ServerFrame;
  /** a conversation's local state changed */
  state: ConvState;
  connection: ConnectionStatus;
  /** the token was revoked (close 4401): the client stopped */
  unauthorized: undefined;
}

type Listener<T> = (payload: T) => void;

const COUNTABLE_EXCLUDED = new Set(["recall", "edit", "reaction"]);

/** A message that counts toward unread when someone else sent it. */
export const countable = (m: Message): boolean => !COUNTABLE_EXCLUDED.has(m.content_type);

interface Snapshot {
  sync: SyncStateSnapshot;
  convs: ConvState[];
}

export class ImClient {
  readonly api: Http;
  readonly state = new Map<string, ConvState>();
  sync_: SyncState = new SyncState();
  status: ConnectionStatus = "closed";

  private readonly opts: ImClientOptions;
  private readonly storage: StateStorage;
  private readonly listeners = new Map<keyof ImEvents, Set<Listener<never>>>();
  private socket: ReconnectingSocket | null = null;
  private running = false;
  private readonly outbox: Outbox;
  private readonly reports: Reporter;
  private syncChain: Promise<unknown> = Promise.resolve();
  private pulls = new Set<Promise<unknown>>();
  private gapTimers = new Map<string, unknown>();
  private poller: Promise<void> | null = null;
  private pollAbort: AbortControllerLike | null = null;
  private pollWake: (() => void) | null = null;
  private online = true;
  private saveTimer: unknown = null;
  private restored = false;
  /** per conversation: the highest seq whose unread count is in ConvState.unread */
  private counted = new Map<string, number>();

  constructor(
    readonly baseUrl: string,
    readonly token: string,
    readonly userId: number,
    readonly deviceId: string,
    opts: ImClientOptions = {},
  ) {
    this.opts = opts;
    this.storage = opts.storage ?? new MemoryStorage();
    this.api = new Http(baseUrl, token, opts.fetch);
    const write = (frame: Record<string, unknown>): boolean => this.socket?.send(frame) ?? false;
    this.outbox = new Outbox(write, opts);
    this.reports = new Reporter(write, (conv, seq) => this.api.readRest(conv, seq), opts);
  }

  // ---- sessions ------------------------------------------------------------------

  static async login(
    baseUrl: string,
    username: string,
    password: string,
    opts: ImClientOptions & { deviceId?: string } = {},
  ): Promise<ImClient> {
    const s = await Http.login(baseUrl, username, password, opts.deviceId, opts.fetch);
    const c = new ImClient(baseUrl, s.token, s.user_id, s.device_id, opts);
    await c.restore();
    return c;
  }

  /** Create the account, then log in. */
  static async register(
    baseUrl: string,
    username: string,
    password: string,
    opts: ImClientOptions & { deviceId?: string; displayName?: string } = {},
  ): Promise<ImClient> {
    await Http.register(baseUrl, username, password, opts.displayName, opts.fetch);
    return ImClient.login(baseUrl, username, password, opts);
  }

  /** Resume a session from a kept token. */
  static async fromToken(
    baseUrl: string,
    token: string,
    userId: number,
    deviceId: string,
    opts: ImClientOptions = {},
  ): Promise<ImClient> {
    const c = new ImClient(baseUrl, token, userId, deviceId, opts);
    await c.restore();
    return c;
  }

  // ---- events --------------------------------------------------------------------

  on<K extends keyof ImEvents>(event: K, fn: Listener<ImEvents[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(fn as Listener<never>);
    return () => this.off(event, fn);
  }

  off<K extends keyof ImEvents>(event: K, fn: Listener<ImEvents[K]>): void {
    this.listeners.get(event)?.delete(fn as Listener<never>);
  }

  private emit<K extends keyof ImEvents>(event: K, payload: ImEvents[K]): void {
    const set = this.listeners.get(event);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        (fn as Listener<ImEvents[K]>)(payload);
      } catch (e) {
        // a listener's bug must not break the client
        g.console?.error("im-server-client: a listener failed", e);
      }
    }
  }

  // ---- connection ----------------------------------------------------------------

  /** Open the WebSocket (resolves once open, or once the first attempt failed: it keeps
   * retrying with back-off either way), then catch up (the recipe's step 1, then 2-4). */
  async connect(opts: { timeoutMs?: number } = {}): Promise<void> {
    const Ctor = this.opts.WebSocket ?? (await platformWebSocket());
    if (!Ctor) {
      throw new Error(
        "no WebSocket: this platform has no global WebSocket and the `ws` package is not installed (npm install ws), or pass the `WebSocket` option",
      );
    }
    this.running = true;
    if (!this.socket) {
      const wsUrl = this.baseUrl.replace(/^http/i, "ws").replace(/\/+$/, "") + "/v1/ws?token=" + encodeURIComponent(this.token);
      this.socket = new ReconnectingSocket(
        () => wsUrl,
        Ctor,
        {
          onStatus: (s) => this.onStatus(s),
          onOpen: () => this.onOpen(),
          onFrame: (f) => this.onFrame(f),
          onUnauthorized: () => this.onUnauthorized(),
        },
        this.opts.backoff,
      );
    }
    const opened = new Promise<void>((resolve, reject) => {
      if (this.socket?.isOpen) return resolve();
      const t = g.setTimeout(() => {
        off();
        reject(new ImTimeoutError("the WebSocket did not open in time"));
      }, opts.timeoutMs ?? 15000);
      const off = this.on("connection", (s) => {
        if (s === "open") {
          g.clearTimeout(t);
          off();
          resolve();
        }
      });
    });
    this.socket.start();
    this.socket.setOnline(this.online);
    this.startLoop();
    await opened;
    await this.sync();
  }

  /** Without a socket: keep the state current with long polls (bots, background pages). */
  startPolling(): void {
    this.running = true;
    this.startLoop();
  }

  /** Network hooks: wire the browser's online/offline events or NetInfo to this. */
  setOnline(online: boolean): void {
    this.online = online;
    this.socket?.setOnline(online);
    if (online) this.pollWake?.();
    else this.pollAbort?.abort();
  }

  get connected(): boolean {
    return this.socket?.isOpen ?? false;
  }

  /** Stop everything: socket, long polls, timers. Unacked sends are rejected. */
  async close(opts: { logout?: boolean } = {}): Promise<void> {
    this.running = false;
    await this.flushReports().catch(() => undefined);
    this.reports.stop();
    this.socket?.stop();
    this.socket = null;
    this.pollAbort?.abort();
    this.pollWake?.();
    for (const t of this.gapTimers.values()) g.clearTimeout(t);
    this.gapTimers.clear();
    this.outbox.rejectAll(new ImTimeoutError("the client was closed before the ack"));
    await Promise.allSettled([...this.pulls]);
    if (this.poller) await this.poller.catch(() => undefined);
    g.clearTimeout(this.saveTimer);
    await this.save();
    if (opts.logout) await this.api.logout();
  }

  private onStatus(s: ConnectionStatus): void {
    this.status = s;
    if (s === "closed") this.pollWake?.(); // the long poll takes over
    this.emit("connection", s);
  }

  private onOpen(): void {
    // a long poll in flight is not needed any more; catch up after every (re)open,
    // then resend what was never acked (same client_msg_id: the server dedupes)
    this.pollAbort?.abort();
    this.outbox.resendAll();
    // reports written to the last socket may have died with it: sent again
    this.reports.reopened();
    this.sync().catch(() => undefined);
  }

  private onUnauthorized(): void {
    this.running = false;
    this.emit("unauthorized", undefined);
  }

  /** The background loop: long polls while the socket is down (or absent). */
  private startLoop(): void {
    if (this.poller || this.opts.longPoll === false) return;
    this.poller = (async () => {
      let failures = 0;
      while (this.running) {
        if (this.connected || !this.online) {
          await new Promise<void>((r) => {
            this.pollWake = r;
            if (!this.running) r();
          });
          this.pollWake = null;
          continue;
        }
        try {
          await this.sync({ wait: Math.min(30, this.opts.longPollWaitS ?? 25) });
          failures = 0;
          await sleep(200);
        } catch (e) {
          if (!this.running) break;
          failures += 1;
          await new Promise<void>((r) => {
            this.pollWake = r;
            g.setTimeout(r, backoffDelay(failures, { baseMs: 500, maxMs: 10000 }));
          });
          this.pollWake = null;
        }
      }
      this.poller = null;
    })();
  }

  // ---- frames --------------------------------------------------------------------

  private onFrame(raw: Record<string, unknown>): void {
    const f = raw as unknown as ServerFrame;
    if (f.type === "pong") return;
    this.emit("frame", f);
    switch (f.type) {
      case "ack":
        this.outbox.onAck(f);
        this.emit("ack", f);
        break;
      case "message":
        this.onPush(f.message);
        break;
      case "read":
        this.onRead(f);
        this.emit("read", f);
        break;
      case "delivered": {
        const c = this.state.get(f.conv_id);
        if (c && f.user_id !== this.userId && f.seq > c.peer_delivered_seq) {
          c.peer_delivered_seq = f.seq;
          this.changed(c);
        }
        this.emit("delivered", f);
        break;
      }
      case "typing":
        this.emit("typing", f);
        break;
      case "presence":
        this.emit("presence", f);
        break;
      case "contacts":
        this.emit("contacts", f);
        break;
      case "receipt":
        this.emit("receipt", f);
        break;
      case "edited":
        this.emit("edited", f);
        break;
      case "error":
        this.emit("error", f);
        break;
    }
  }

  private onRead(f: ReadPush): void {
    const c = this.state.get(f.conv_id);
    if (!c) return;
    if (f.user_id === this.userId) this.moveReadCursor(c, f.seq);
    else if (f.seq > c.peer_read_seq) {
      c.peer_read_seq = f.seq;
      this.changed(c);
    }
  }

  private onPush(m: Message): void {
    const fresh = this.sync_.add([m]);
    this.deliver(fresh);
    // a push that skips seqs: pull the gap shortly (pushes may race each other)
    if (m.seq > this.sync_.contiguous(m.conv_id) + 1) this.scheduleGapPull(m.conv_id, m.seq - 1, 100);
  }

  /** New messages: local state, events, delivered reports. */
  private deliver(msgs: Message[]): number {
    const touched = new Set<ConvState>();
    for (const m of msgs) {
      const c = this.conv(m.conv_id);
      if (m.seq > c.max_seq) c.max_seq = m.seq;
      if (!c.last_message || m.seq > c.last_message.seq) c.last_message = m;
      c.hidden = false;
      if (m.sender_id !== this.userId && countable(m) && m.content_type !== "system" && m.seq > c.read_seq) {
        // counted here only when the sync state did not count it already
        if (m.seq > (this.counted.get(m.conv_id) ?? 0)) {
          c.unread += 1;
          if (m.mention_all || m.mentions.includes(this.userId)) c.mention_unread += 1;
        }
        if (this.opts.autoDelivered !== false) this.reports.delivered(m.conv_id, m.seq);
      }
      if (m.seq > (this.counted.get(m.conv_id) ?? 0)) this.counted.set(m.conv_id, m.seq);
      touched.add(c);
      this.emit("message", m);
    }
    for (const c of touched) this.changed(c);
    return msgs.length;
  }

  private conv(convId: string): ConvState {
    let c = this.state.get(convId);
    if (!c) {
      c = {
        conv_id: convId,
        type: convId.startsWith("g:") ? "group" : "single",
        min_seq: 1,
        max_seq: 0,
        read_seq: 0,
        unread: 0,
        mention_unread: 0,
        peer_read_seq: 0,
        peer_delivered_seq: 0,
        muted: false,
        pinned: false,
        hidden: false,
        last_message: null,
        version: 0,
      };
      if (c.type === "group") c.group_id = Number(convId.slice(2));
      else {
        const [, a, b] = convId.split(":");
        c.peer_id = Number(a) === this.userId ? Number(b) : Number(a);
      }
      this.state.set(convId, c);
    }
    return c;
  }

  private changed(c: ConvState): void {
    this.emit("state", c);
    this.scheduleSave();
  }

  private moveReadCursor(c: ConvState, seq: number): void {
    if (seq <= c.read_seq) return;
    const old = c.read_seq;
    c.read_seq = seq;
    if (seq >= c.max_seq) {
      c.unread = 0;
      c.mention_unread = 0;
    } else {
      // messages of others in (old, seq] held here stop counting; a sync corrects the rest
      let gone = 0;
      const cur = this.sync_.convs.get(c.conv_id);
      if (cur) for (let s = Math.max(old + 1, c.min_seq); s <= seq; s++) if (cur.holds(s)) gone += 1;
      c.unread = Math.max(0, c.unread - gone);
    }
    this.changed(c);
  }

  private applyState(st: SyncedSingleState | SyncedGroupState): void {
    const c = this.conv(st.conv_id);
    const { messages: _m, ...rest } = st;
    Object.assign(c, rest);
    c.peer_read_seq = (st as SyncedSingleState).peer_read_seq ?? 0;
    c.peer_delivered_seq = (st as SyncedSingleState).peer_delivered_seq ?? 0;
    // the server counted everything up to its max_seq
    this.counted.set(st.conv_id, Math.max(this.counted.get(st.conv_id) ?? 0, st.max_seq));
    this.changed(c);
  }

  // ---- sending -------------------------------------------------------------------

  /** Send a message; resolves with the ack. The client_msg_id is made here (or taken
   * from `opts.clientMsgId`) and the frame is sent again, with the same id, after a
   * reconnect or an ack timeout, until acked: the server dedupes. Without a socket the
   * REST call is used. A refusal rejects with SendError. */
  async send(convId: string, content: Record<string, unknown> | string, opts: SendOptions & { timeoutMs?: number } = {}): Promise<AckOk> {
    const body = typeof content === "string" ? { text: content } : content;
    const clientMsgId = opts.clientMsgId ?? newId();
    if (!this.socket) {
      // no socket at all: REST, retried on network errors and 5xx with the same id
      for (let attempt = 0; ; attempt++) {
        try {
          const ack = await this.api.sendRest(convId, body, clientMsgId, opts);
          this.ownMessage(ack, body, opts);
          return ack;
        } catch (e) {
          const retry = !(e instanceof ApiError) || e.status >= 500 || e.status === 429;
          if (!retry || attempt >= 5) throw e;
          await sleep(backoffDelay(attempt));
        }
      }
    }
    const frame = { type: "send", conv_id: convId, ...sendBody(body, clientMsgId, opts) };
    this.reports.typingEnded(convId);
    return this.outbox.send(frame as typeof frame & { client_msg_id: string }, {
      timeoutMs: opts.timeoutMs,
      onAck: (ack) => this.ownMessage(ack, body, opts),
    });
  }

  /** Messages sent but not acked yet (they are sent again after a reconnect). */
  get unacked(): number {
    return this.outbox.size;
  }

  /** My own acked message: held here (so it is not pulled again) and reported once. */
  private ownMessage(ack: AckOk, content: Record<string, unknown>, opts: SendOptions): void {
    const m: Message = {
      conv_id: ack.conv_id,
      seq: ack.seq,
      sender_id: this.userId,
      client_msg_id: ack.client_msg_id,
      content_type: opts.contentType ?? "text",
      content,
      server_time: ack.server_time,
      recalled: false,
      mentions: opts.mentions ?? [],
      mention_all: opts.mentionAll ?? false,
      reply_to: opts.replyTo ?? null,
      edited_at: null,
      reactions: [],
    };
    this.deliver(this.sync_.add([m]));
  }

  // ---- reports: read, delivered, typing --------------------------------------------

  /** Move my read cursor (forward only). Local state and events change at once; the
   * report is batched with others and resolves once sent. */
  read(convId: string, seq: number): Promise<void> {
    const c = this.conv(convId);
    this.moveReadCursor(c, seq);
    return this.reports.read(convId, seq);
  }

  /** Report delivered up to `seq` (done by itself for arriving messages unless
   * `autoDelivered: false`). */
  delivered(convId: string, seq: number): void {
    this.reports.delivered(convId, seq);
  }

  /** Tell the others I am typing (at most once per 3 s per conversation). */
  typing(convId: string): boolean {
    return this.reports.typing(convId);
  }

  /** Send the batched read and delivered reports now. */
  flushReports(): Promise<void> {
    return this.reports.flush();
  }

  // ---- the sync recipe -----------------------------------------------------------

  /** Catch up: sync pages from the last version while has_more, then pull the seq
   * ranges this device lacks, ascending. Every new message goes to "message" once. */
  sync(opts: { wait?: number } = {}): Promise<SyncResult> {
    // a long poll parked in the chain would hold this call for up to its wait
    if (!opts.wait) this.pollAbort?.abort();
    const run = this.syncChain.then(() => this.syncNow(opts.wait ?? 0));
    this.syncChain = run.catch(() => undefined);
    return run;
  }

  private async syncNow(wait: number): Promise<SyncResult> {
    await this.restore();
    let messages = 0;
    let conversations = 0;
    const ranges: SeqRange[] = [];
    const ctrl = wait > 0 && g.AbortController ? new g.AbortController() : null;
    try {
      await syncPages(
        this.api,
        () => this.sync_.version,
        (ans) => {
          ranges.push(...this.sync_.apply(ans));
          for (const st of ans.conversations) {
            conversations += 1;
            this.applyState(st);
            messages += this.deliver(this.sync_.add(st.messages ?? []));
          }
        },
        {
          wait,
          recent: this.opts.recent,
          signal: ctrl?.signal,
          // only the long poll is cut short (by sync(), a reopened socket, close)
          onLongPoll: (on) => {
            if (on) this.pollAbort = ctrl;
            else if (this.pollAbort === ctrl) this.pollAbort = null;
          },
        },
      );
    } catch (e) {
      if (ctrl?.signal.aborted) {
        for (const r of ranges) this.sync_.release(...r);
        return { messages, conversations, version: this.sync_.version };
      }
      throw e;
    }
    messages += await this.pullAll(ranges);
    await this.save();
    return { messages, conversations, version: this.sync_.version };
  }

  private async pullAll(ranges: SeqRange[]): Promise<number> {
    let total = 0;
    let i = 0;
    let error: unknown = null;
    const worker = async (): Promise<void> => {
      while (i < ranges.length) {
        const r = ranges[i++]!;
        if (error !== null) {
          this.sync_.release(...r);
          continue;
        }
        try {
          const [got] = await this.pull(...r);
          total += got;
        } catch (e) {
          error = e;
        }
      }
    };
    const n = Math.max(1, this.opts.pullConcurrency ?? 4);
    await Promise.all(Array.from({ length: Math.min(n, ranges.length) }, worker));
    if (error !== null) throw error;
    return total;
  }

  /** Fetch [begin, end] in ascending pages; returns [new messages, first seq not
   * available yet or null]. A page spans at most `limit` seqs (the server keeps the
   * seqs nearest `end`). */
  private async pull(convId: string, begin: number, end: number): Promise<[number, number | null]> {
    let cur = begin;
    let fresh = 0;
    try {
      const rest = await pullPages(
        this.api,
        convId,
        begin,
        end,
        (ans, from, covered) => {
          this.sync_.observeWindow(convId, ans.min_seq);
          fresh += this.deliver(this.sync_.add(ans.messages));
          this.sync_.markPulled(convId, from, covered);
          cur = Math.max(cur, covered + 1);
        },
        this.opts.pageSize ?? 200,
      );
      if (rest !== null) this.sync_.release(convId, rest, end);
      return [fresh, rest];
    } catch (e) {
      this.sync_.release(convId, cur, end);
      throw e;
    }
  }

  private scheduleGapPull(convId: string, upTo: number, delay: number): void {
    if (this.gapTimers.has(convId) || !this.running) return;
    const t = g.setTimeout(() => {
      this.gapTimers.delete(convId);
      const gap = this.sync_.claim(convId, 1, upTo);
      if (!gap) return;
      const job = this.pullGap(...gap).catch(() => undefined);
      this.pulls.add(job);
      void job.finally(() => this.pulls.delete(job));
    }, delay);
    this.gapTimers.set(convId, t);
  }

  private async pullGap(convId: string, begin: number, end: number): Promise<void> {
    let [, rest] = await this.pull(convId, begin, end);
    for (const delay of GAP_RETRY_MS) {
      if (rest === null || !this.running) return;
      await sleep(delay);
      const claimed = this.sync_.claim(convId, rest, end);
      if (!claimed) return;
      [, rest] = await this.pull(...claimed);
    }
  }

  /** Wait for the background gap pulls started by pushes. */
  async drain(): Promise<void> {
    while (this.pulls.size || this.gapTimers.size) {
      await Promise.allSettled([...this.pulls]);
      if (this.gapTimers.size) await sleep(50);
    }
  }

  // ---- history -------------------------------------------------------------------

  /** A page of history, ascending. `{before, limit}`: the `limit` seqs below `before`
   * (the newest page without `before`); `{after, limit}`: the ones above `after`. */
  async history(convId: string, opts: HistoryOptions = {}): Promise<HistoryResult> {
    const limit = opts.limit ?? 50;
    let q: HistoryQuery;
    if (opts.after !== undefined) q = { begin: opts.after + 1, end: opts.end, limit, order: "asc" };
    else if (opts.before !== undefined) {
      if (opts.before <= 1) {
        const c = this.state.get(convId);
        return { messages: [], min_seq: c?.min_seq ?? 1, max_seq: c?.max_seq ?? 0, is_end: true, next_before: null };
      }
      q = { begin: opts.begin, end: opts.before - 1, limit, order: "desc" };
    } else q = { begin: opts.begin, end: opts.end, limit, order: opts.order ?? "desc" };
    const ans = await this.api.history(convId, q);
    this.sync_.observeWindow(convId, ans.min_seq);
    const messages = [...ans.messages].sort((a, b) => a.seq - b.seq);
    let nextBefore: number | null = null;
    if (q.order === "desc" && !ans.is_end) {
      nextBefore = messages.length ? messages[0]!.seq : Math.max(1, (q.end ?? ans.max_seq) - limit + 1);
    }
    return { messages, min_seq: ans.min_seq, max_seq: ans.max_seq, is_end: ans.is_end, next_before: nextBefore };
  }

  // ---- local state ---------------------------------------------------------------

  /** Local conversation states, pinned first, then by last message. */
  conversations(): ConvState[] {
    return [...this.state.values()]
      .filter((c) => !c.hidden)
      .sort(
        (a, b) =>
          Number(b.pinned) - Number(a.pinned) ||
          (b.last_message?.server_time ?? 0) - (a.last_message?.server_time ?? 0),
      );
  }

  /** Unread over all conversations held here. */
  get totalUnread(): number {
    let n = 0;
    for (const c of this.state.values()) n += c.unread;
    return n;
  }

  /** The seqs held per conversation's window: [contiguous top, seqs above it]. */
  holds(convId: string, seq: number): boolean {
    return this.sync_.held(convId, seq);
  }

  get storageKey(): string {
    return `im-server-client:${this.userId}:${this.deviceId}`;
  }

  private async restore(): Promise<void> {
    if (this.restored) return;
    this.restored = true;
    const text = await this.storage.get(this.storageKey);
    if (!text) return;
    try {
      const snap = JSON.parse(text) as Snapshot;
      this.sync_ = SyncState.restore(snap.sync);
      for (const c of snap.convs) this.state.set(c.conv_id, c);
    } catch {
      /* unreadable: start afresh */
    }
  }

  private scheduleSave(): void {
    if (this.saveTimer !== null) return;
    this.saveTimer = g.setTimeout(() => {
      this.saveTimer = null;
      this.save().catch(() => undefined);
    }, 1000);
  }

  /** Write the local state to the storage now. */
  async save(): Promise<void> {
    g.clearTimeout(this.saveTimer);
    this.saveTimer = null;
    const snap: Snapshot = { sync: this.sync_.snapshot(), convs: [...this.state.values()] };
    await this.storage.set(this.storageKey, JSON.stringify(snap));
  }
}
