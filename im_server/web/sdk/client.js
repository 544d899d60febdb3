// ImClient: a session, its WebSocket, the catch-up recipe of docs/sync.md and the local
// state per conversation. The logic is the Python client's (im_server/client: Device,
// SyncState) and the web client's (reconnect, resends, batched read/delivered reports).
import { g, platformWebSocket, newId, sleep, } from "./env.js";
import { ApiError, ImTimeoutError } from "./errors.js";
import { Http, sendBody } from "./http.js";
import { ReconnectingSocket, backoffDelay } from "./socket.js";
import { Outbox } from "./outbox.js";
import { GAP_RETRY_MS, pullPages, syncPages } from "./recipe.js";
import { Reporter } from "./reports.js";
import { MemoryStorage } from "./storage.js";
import { SyncState } from "./syncstate.js";
const COUNTABLE_EXCLUDED = new Set(["recall", "edit", "reaction"]);
/** A message that counts toward unread when someone else sent it. */
export const countable = (m) => !COUNTABLE_EXCLUDED.has(m.content_type);
export class ImClient {
    baseUrl;
    token;
    userId;
    deviceId;
    api;
    state = new Map();
    sync_ = new SyncState();
    status = "closed";
    opts;
    storage;
    listeners = new Map();
    socket = null;
    running = false;
    outbox;
    reports;
    syncChain = Promise.resolve();
    pulls = new Set();
    gapTimers = new Map();
    poller = null;
    pollAbort = null;
    pollWake = null;
    online = true;
    saveTimer = null;
    restored = false;
    /** per conversation: the highest seq whose unread count is in ConvState.unread */
    counted = new Map();
    constructor(baseUrl, token, userId, deviceId, opts = {}) {
        this.baseUrl = baseUrl;
        this.token = token;
        this.userId = userId;
        this.deviceId = deviceId;
        this.opts = opts;
        this.storage = opts.storage ?? new MemoryStorage();
        this.api = new Http(baseUrl, token, opts.fetch);
        const write = (frame) => this.socket?.send(frame) ?? false;
        this.outbox = new Outbox(write, opts);
        this.reports = new Reporter(write, (conv, seq) => this.api.readRest(conv, seq), opts);
    }
    // ---- sessions ------------------------------------------------------------------
    static async login(baseUrl, username, password, opts = {}) {
        const s = await Http.login(baseUrl, username, password, opts.deviceId, opts.fetch);
        const c = new ImClient(baseUrl, s.token, s.user_id, s.device_id, opts);
        await c.restore();
        return c;
    }
    /** Create the account, then log in. */
    static async register(baseUrl, username, password, opts = {}) {
        await Http.register(baseUrl, username, password, opts.displayName, opts.fetch);
        return ImClient.login(baseUrl, username, password, opts);
    }
    /** Resume a session from a kept token. */
    static async fromToken(baseUrl, token, userId, deviceId, opts = {}) {
        const c = new ImClient(baseUrl, token, userId, deviceId, opts);
        await c.restore();
        return c;
    }
    // ---- events --------------------------------------------------------------------
    on(event, fn) {
        let set = this.listeners.get(event);
        if (!set)
            this.listeners.set(event, (set = new Set()));
        set.add(fn);
        return () => this.off(event, fn);
    }
    off(event, fn) {
        this.listeners.get(event)?.delete(fn);
    }
    emit(event, payload) {
        const set = this.listeners.get(event);
        if (!set)
            return;
        for (const fn of [...set]) {
            try {
                fn(payload);
            }
            catch (e) {
                // a listener's bug must not break the client
                g.console?.error("im-server-client: a listener failed", e);
            }
        }
    }
    // ---- connection ----------------------------------------------------------------
    /** Open the WebSocket (resolves once open, or once the first attempt failed: it keeps
     * retrying with back-off either way), then catch up (the recipe's step 1, then 2-4). */
    async connect(opts = {}) {
        const Ctor = this.opts.WebSocket ?? (await platformWebSocket());
        if (!Ctor) {
            throw new Error("no WebSocket: this platform has no global WebSocket and the `ws` package is not installed (npm install ws), or pass the `WebSocket` option");
        }
        this.running = true;
        if (!this.socket) {
            const wsUrl = this.baseUrl.replace(/^http/i, "ws").replace(/\/+$/, "") + "/v1/ws?token=" + encodeURIComponent(this.token);
            this.socket = new ReconnectingSocket(() => wsUrl, Ctor, {
                onStatus: (s) => this.onStatus(s),
                onOpen: () => this.onOpen(),
                onFrame: (f) => this.onFrame(f),
                onUnauthorized: () => this.onUnauthorized(),
            }, this.opts.backoff);
        }
        const opened = new Promise((resolve, reject) => {
            if (this.socket?.isOpen)
                return resolve();
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
    startPolling() {
        this.running = true;
        this.startLoop();
    }
    /** Network hooks: wire the browser's online/offline events or NetInfo to this. */
    setOnline(online) {
        this.online = online;
        this.socket?.setOnline(online);
        if (online)
            this.pollWake?.();
        else
            this.pollAbort?.abort();
    }
    get connected() {
        return this.socket?.isOpen ?? false;
    }
    /** Stop everything: socket, long polls, timers. Unacked sends are rejected. */
    async close(opts = {}) {
        this.running = false;
        await this.flushReports().catch(() => undefined);
        this.reports.stop();
        this.socket?.stop();
        this.socket = null;
        this.pollAbort?.abort();
        this.pollWake?.();
        for (const t of this.gapTimers.values())
            g.clearTimeout(t);
        this.gapTimers.clear();
        this.outbox.rejectAll(new ImTimeoutError("the client was closed before the ack"));
        await Promise.allSettled([...this.pulls]);
        if (this.poller)
            await this.poller.catch(() => undefined);
        g.clearTimeout(this.saveTimer);
        await this.save();
        if (opts.logout)
            await this.api.logout();
    }
    onStatus(s) {
        this.status = s;
        if (s === "closed")
            this.pollWake?.(); // the long poll takes over
        this.emit("connection", s);
    }
    onOpen() {
        // a long poll in flight is not needed any more; catch up after every (re)open,
        // then resend what was never acked (same client_msg_id: the server dedupes)
        this.pollAbort?.abort();
        this.outbox.resendAll();
        // reports written to the last socket may have died with it: sent again
        this.reports.reopened();
        this.sync().catch(() => undefined);
    }
    onUnauthorized() {
        this.running = false;
        this.emit("unauthorized", undefined);
    }
    /** The background loop: long polls while the socket is down (or absent). */
    startLoop() {
        if (this.poller || this.opts.longPoll === false)
            return;
        this.poller = (async () => {
            let failures = 0;
            while (this.running) {
                if (this.connected || !this.online) {
                    await new Promise((r) => {
                        this.pollWake = r;
                        if (!this.running)
                            r();
                    });
                    this.pollWake = null;
                    continue;
                }
                try {
                    await this.sync({ wait: Math.min(30, this.opts.longPollWaitS ?? 25) });
                    failures = 0;
                    await sleep(200);
                }
                catch (e) {
                    if (!this.running)
                        break;
                    failures += 1;
                    await new Promise((r) => {
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
    onFrame(raw) {
        const f = raw;
        if (f.type === "pong")
            return;
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
    onRead(f) {
        const c = this.state.get(f.conv_id);
        if (!c)
            return;
        if (f.user_id === this.userId)
            this.moveReadCursor(c, f.seq);
        else if (f.seq > c.peer_read_seq) {
            c.peer_read_seq = f.seq;
            this.changed(c);
        }
    }
    onPush(m) {
        const fresh = this.sync_.add([m]);
        this.deliver(fresh);
        // a push that skips seqs: pull the gap shortly (pushes may race each other)
        if (m.seq > this.sync_.contiguous(m.conv_id) + 1)
            this.scheduleGapPull(m.conv_id, m.seq - 1, 100);
    }
    /** New messages: local state, events, delivered reports. */
    deliver(msgs) {
        const touched = new Set();
        for (const m of msgs) {
            const c = this.conv(m.conv_id);
            if (m.seq > c.max_seq)
                c.max_seq = m.seq;
            if (!c.last_message || m.seq > c.last_message.seq)
                c.last_message = m;
            c.hidden = false;
            if (m.sender_id !== this.userId && countable(m) && m.content_type !== "system" && m.seq > c.read_seq) {
                // counted here only when the sync state did not count it already
                if (m.seq > (this.counted.get(m.conv_id) ?? 0)) {
                    c.unread += 1;
                    if (m.mention_all || m.mentions.includes(this.userId))
                        c.mention_unread += 1;
                }
                if (this.opts.autoDelivered !== false)
                    this.reports.delivered(m.conv_id, m.seq);
            }
            if (m.seq > (this.counted.get(m.conv_id) ?? 0))
                this.counted.set(m.conv_id, m.seq);
            touched.add(c);
            this.emit("message", m);
        }
        for (const c of touched)
            this.changed(c);
        return msgs.length;
    }
    conv(convId) {
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
            if (c.type === "group")
                c.group_id = Number(convId.slice(2));
            else {
                const [, a, b] = convId.split(":");
                c.peer_id = Number(a) === this.userId ? Number(b) : Number(a);
            }
            this.state.set(convId, c);
        }
        return c;
    }
    changed(c) {
        this.emit("state", c);
        this.scheduleSave();
    }
    moveReadCursor(c, seq) {
        if (seq <= c.read_seq)
            return;
        const old = c.read_seq;
        c.read_seq = seq;
        if (seq >= c.max_seq) {
            c.unread = 0;
            c.mention_unread = 0;
        }
        else {
            // messages of others in (old, seq] held here stop counting; a sync corrects the rest
            let gone = 0;
            const cur = this.sync_.convs.get(c.conv_id);
            if (cur)
                for (let s = Math.max(old + 1, c.min_seq); s <= seq; s++)
                    if (cur.holds(s))
                        gone += 1;
            c.unread = Math.max(0, c.unread - gone);
        }
        this.changed(c);
    }
    applyState(st) {
        const c = this.conv(st.conv_id);
        const { messages: _m, ...rest } = st;
        Object.assign(c, rest);
        c.peer_read_seq = st.peer_read_seq ?? 0;
        c.peer_delivered_seq = st.peer_delivered_seq ?? 0;
        // the server counted everything up to its max_seq
        this.counted.set(st.conv_id, Math.max(this.counted.get(st.conv_id) ?? 0, st.max_seq));
        this.changed(c);
    }
    // ---- sending -------------------------------------------------------------------
    /** Send a message; resolves with the ack. The client_msg_id is made here (or taken
     * from `opts.clientMsgId`) and the frame is sent again, with the same id, after a
     * reconnect or an ack timeout, until acked: the server dedupes. Without a socket the
     * REST call is used. A refusal rejects with SendError. */
    async send(convId, content, opts = {}) {
        const body = typeof content === "string" ? { text: content } : content;
        const clientMsgId = opts.clientMsgId ?? newId();
        if (!this.socket) {
            // no socket at all: REST, retried on network errors and 5xx with the same id
            for (let attempt = 0;; attempt++) {
                try {
                    const ack = await this.api.sendRest(convId, body, clientMsgId, opts);
                    this.ownMessage(ack, body, opts);
                    return ack;
                }
                catch (e) {
                    const retry = !(e instanceof ApiError) || e.status >= 500 || e.status === 429;
                    if (!retry || attempt >= 5)
                        throw e;
                    await sleep(backoffDelay(attempt));
                }
            }
        }
        const frame = { type: "send", conv_id: convId, ...sendBody(body, clientMsgId, opts) };
        this.reports.typingEnded(convId);
        return this.outbox.send(frame, {
            timeoutMs: opts.timeoutMs,
            onAck: (ack) => this.ownMessage(ack, body, opts),
        });
    }
    /** Messages sent but not acked yet (they are sent again after a reconnect). */
    get unacked() {
        return this.outbox.size;
    }
    /** My own acked message: held here (so it is not pulled again) and reported once. */
    ownMessage(ack, content, opts) {
        const m = {
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
    read(convId, seq) {
        const c = this.conv(convId);
        this.moveReadCursor(c, seq);
        return this.reports.read(convId, seq);
    }
    /** Report delivered up to `seq` (done by itself for arriving messages unless
     * `autoDelivered: false`). */
    delivered(convId, seq) {
        this.reports.delivered(convId, seq);
    }
    /** Tell the others I am typing (at most once per 3 s per conversation). */
    typing(convId) {
        return this.reports.typing(convId);
    }
    /** Send the batched read and delivered reports now. */
    flushReports() {
        return this.reports.flush();
    }
    // ---- the sync recipe -----------------------------------------------------------
    /** Catch up: sync pages from the last version while has_more, then pull the seq
     * ranges this device lacks, ascending. Every new message goes to "message" once. */
    sync(opts = {}) {
        // a long poll parked in the chain would hold this call for up to its wait
        if (!opts.wait)
            this.pollAbort?.abort();
        const run = this.syncChain.then(() => this.syncNow(opts.wait ?? 0));
        this.syncChain = run.catch(() => undefined);
        return run;
    }
    async syncNow(wait) {
        await this.restore();
        let messages = 0;
        let conversations = 0;
        const ranges = [];
        const ctrl = wait > 0 && g.AbortController ? new g.AbortController() : null;
        try {
            await syncPages(this.api, () => this.sync_.version, (ans) => {
                ranges.push(...this.sync_.apply(ans));
                for (const st of ans.conversations) {
                    conversations += 1;
                    this.applyState(st);
                    messages += this.deliver(this.sync_.add(st.messages ?? []));
                }
            }, {
                wait,
                recent: this.opts.recent,
                signal: ctrl?.signal,
                // only the long poll is cut short (by sync(), a reopened socket, close)
                onLongPoll: (on) => {
                    if (on)
                        this.pollAbort = ctrl;
                    else if (this.pollAbort === ctrl)
                        this.pollAbort = null;
                },
            });
        }
        catch (e) {
            if (ctrl?.signal.aborted) {
                for (const r of ranges)
                    this.sync_.release(...r);
                return { messages, conversations, version: this.sync_.version };
            }
            throw e;
        }
        messages += await this.pullAll(ranges);
        await this.save();
        return { messages, conversations, version: this.sync_.version };
    }
    async pullAll(ranges) {
        let total = 0;
        let i = 0;
        let error = null;
        const worker = async () => {
            while (i < ranges.length) {
                const r = ranges[i++];
                if (error !== null) {
                    this.sync_.release(...r);
                    continue;
                }
                try {
                    const [got] = await this.pull(...r);
                    total += got;
                }
                catch (e) {
                    error = e;
                }
            }
        };
        const n = Math.max(1, this.opts.pullConcurrency ?? 4);
        await Promise.all(Array.from({ length: Math.min(n, ranges.length) }, worker));
        if (error !== null)
            throw error;
        return total;
    }
    /** Fetch [begin, end] in ascending pages; returns [new messages, first seq not
     * available yet or null]. A page spans at most `limit` seqs (the server keeps the
     * seqs nearest `end`). */
    async pull(convId, begin, end) {
        let cur = begin;
        let fresh = 0;
        try {
            const rest = await pullPages(this.api, convId, begin, end, (ans, from, covered) => {
                this.sync_.observeWindow(convId, ans.min_seq);
                fresh += this.deliver(this.sync_.add(ans.messages));
                this.sync_.markPulled(convId, from, covered);
                cur = Math.max(cur, covered + 1);
            }, this.opts.pageSize ?? 200);
            if (rest !== null)
                this.sync_.release(convId, rest, end);
            return [fresh, rest];
        }
        catch (e) {
            this.sync_.release(convId, cur, end);
            throw e;
        }
    }
    scheduleGapPull(convId, upTo, delay) {
        if (this.gapTimers.has(convId) || !this.running)
            return;
        const t = g.setTimeout(() => {
            this.gapTimers.delete(convId);
            const gap = this.sync_.claim(convId, 1, upTo);
            if (!gap)
                return;
            const job = this.pullGap(...gap).catch(() => undefined);
            this.pulls.add(job);
            void job.finally(() => this.pulls.delete(job));
        }, delay);
        this.gapTimers.set(convId, t);
    }
    async pullGap(convId, begin, end) {
        let [, rest] = await this.pull(convId, begin, end);
        for (const delay of GAP_RETRY_MS) {
            if (rest === null || !this.running)
                return;
            await sleep(delay);
            const claimed = this.sync_.claim(convId, rest, end);
            if (!claimed)
                return;
            [, rest] = await this.pull(...claimed);
        }
    }
    /** Wait for the background gap pulls started by pushes. */
    async drain() {
        while (this.pulls.size || this.gapTimers.size) {
            await Promise.allSettled([...this.pulls]);
            if (this.gapTimers.size)
                await sleep(50);
        }
    }
    // ---- history -------------------------------------------------------------------
    /** A page of history, ascending. `{before, limit}`: the `limit` seqs below `before`
     * (the newest page without `before`); `{after, limit}`: the ones above `after`. */
    async history(convId, opts = {}) {
        const limit = opts.limit ?? 50;
        let q;
        if (opts.after !== undefined)
            q = { begin: opts.after + 1, end: opts.end, limit, order: "asc" };
        else if (opts.before !== undefined) {
            if (opts.before <= 1) {
                const c = this.state.get(convId);
                return { messages: [], min_seq: c?.min_seq ?? 1, max_seq: c?.max_seq ?? 0, is_end: true, next_before: null };
            }
            q = { begin: opts.begin, end: opts.before - 1, limit, order: "desc" };
        }
        else
            q = { begin: opts.begin, end: opts.end, limit, order: opts.order ?? "desc" };
        const ans = await this.api.history(convId, q);
        this.sync_.observeWindow(convId, ans.min_seq);
        const messages = [...ans.messages].sort((a, b) => a.seq - b.seq);
        let nextBefore = null;
        if (q.order === "desc" && !ans.is_end) {
            nextBefore = messages.length ? messages[0].seq : Math.max(1, (q.end ?? ans.max_seq) - limit + 1);
        }
        return { messages, min_seq: ans.min_seq, max_seq: ans.max_seq, is_end: ans.is_end, next_before: nextBefore };
    }
    // ---- local state ---------------------------------------------------------------
    /** Local conversation states, pinned first, then by last message. */
    conversations() {
        return [...this.state.values()]
            .filter((c) => !c.hidden)
            .sort((a, b) => Number(b.pinned) - Number(a.pinned) ||
            (b.last_message?.server_time ?? 0) - (a.last_message?.server_time ?? 0));
    }
    /** Unread over all conversations held here. */
    get totalUnread() {
        let n = 0;
        for (const c of this.state.values())
            n += c.unread;
        return n;
    }
    /** The seqs held per conversation's window: [contiguous top, seqs above it]. */
    holds(convId, seq) {
        return this.sync_.held(convId, seq);
    }
    get storageKey() {
        return `im-server-client:${this.userId}:${this.deviceId}`;
    }
    async restore() {
        if (this.restored)
            return;
        this.restored = true;
        const text = await this.storage.get(this.storageKey);
        if (!text)
            return;
        try {
            const snap = JSON.parse(text);
            this.sync_ = SyncState.restore(snap.sync);
            for (const c of snap.convs)
                this.state.set(c.conv_id, c);
        }
        catch {
            /* unreadable: start afresh */
        }
    }
    scheduleSave() {
        if (this.saveTimer !== null)
            return;
        this.saveTimer = g.setTimeout(() => {
            this.saveTimer = null;
            this.save().catch(() => undefined);
        }, 1000);
    }
    /** Write the local state to the storage now. */
    async save() {
        g.clearTimeout(this.saveTimer);
        this.saveTimer = null;
        const snap = { sync: this.sync_.snapshot(), convs: [...this.state.values()] };
        await this.storage.set(this.storageKey, JSON.stringify(snap));
    }
}
