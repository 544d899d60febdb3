// The catch-up engine: the recipe of docs/protocol.md (and im_server/client/sync.py).
// 1. open the WebSocket first; 2. GET /v1/sync from the last version (looping while
// has_more) and adopt each conversation's state and newest messages; 3. pull the seq
// ranges the client lacks with history; a pushed message that skips seqs triggers a
// pull of the gap. Messages are stored once per (conv_id, seq) by the Store.
// A long-polling sync runs all along: it keeps states (new conversations, cursors,
// unread counts) fresh, and carries the page while the WebSocket is down. Friend
// requests are polled (the server pushes none).
// The protocol steps are the SDK's (./sdk, compiled from sdk/typescript): REST, the
// socket, sync pages, range pulls, sends until acked, batched reports, typing. This file
// keeps what the views need on top: when to pull each conversation's gaps and older
// pages and jump to a search hit (the segment arithmetic is the SDK's Segment), pending
// messages, quotes, reactions, presence.

import {
  GAP_RETRY_MS, Outbox, Reporter, backoffDelay, newId, pullPages, sendBody, syncPages,
} from './sdk/index.js';
import { COUNTABLE } from './store.js';
import { IMAGE_TYPES, Media, imageSize, mimeOf, nameOf, putBytes } from './uploads.js';

const PAGE = 200;
const MAX_GAP = 1000;          // beyond this, restart the segment at the newest seqs
const LONG_POLL_S = 25;
const REQUESTS_EVERY_MS = 30000; // a fallback: the contacts frame tells of each change
const PRESENCE_TEXT_EVERY_MS = 30000; // "last seen 3 min ago" ages on screen
const ACK_TIMEOUT_MS = 8000;
const REPORT_DELAY_MS = 150;  // read and delivered reports are sent in batches
const PRESENCE_BATCH = 200;    // ids per GET /v1/presence
const MAX_MENTIONS = 100;
const QUOTE_RETRY_MS = 10000;  // a quote whose read failed is read again after this
const SEARCH_PAGE = 20;
const REVEAL_MARGIN = 10;      // a message jumped to is held with a few older ones above it

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export { newId };

export class Engine {
  constructor(api, store, socket) {
    this.api = api;
    this.store = store;
    this.socket = socket;
    this.running = false;
    this.pulling = new Map();      // conv_id -> promise of the running gap pull
    this.pullAgain = new Set();
    this.pullTimers = new Map();
    // sends until acked, and the read/delivered/typing reports: the SDK's (same protocol
    // as its ImClient); the engine keeps the pending messages the views show
    const write = (frame) => this.socket.send(frame);
    this.outbox = new Outbox(write, { ackTimeoutMs: ACK_TIMEOUT_MS, sendTimeoutMs: 0 });
    this.reports = new Reporter(write, (convId, seq) => this.api.readRest(convId, seq),
      { reportDelayMs: REPORT_DELAY_MS });
    this.pollAbort = null;
    this.wake = null;
    this.friendsAt = 0;
    this.longPolling = false;
    this.refetching = new Map();   // `${conv}|${seq}` -> running refetch of one message
    this.refetchAgain = new Set();
    this.presenceTick = 0;         // counts presence frames
    this.presenceAt = new Map();   // user_id -> the tick of its last presence frame
    this.onFrame = (e) => this.frame(e.detail);
    this.onOpen = () => this.connected();
    this.onStatus = (e) => {
      this.store.connection = e.detail;
      // the socket dropped: a long poll in flight may hang on the same dead network
      if (e.detail === 'closed' && this.pollAbort && this.longPolling) this.pollAbort.abort();
      this.store.changed('connection');
    };
    this.onVisible = () => this.readOpen();
    // the highest seq on screen in the open chat (Infinity: the newest is in view; 0:
    // nothing yet); the chat view sets it: only what was on screen is ever marked read
    this.seenUpTo = () => 0;
    store.fetchUser = (id) => api.user(id); // names the store does not know yet
    this.media = new Media(api);   // download links of pictures and files
  }

  start() {
    this.running = true;
    this.socket.addEventListener('frame', this.onFrame);
    this.socket.addEventListener('open', this.onOpen);
    this.socket.addEventListener('status', this.onStatus);
    document.addEventListener('visibilitychange', this.onVisible);
    window.addEventListener('focus', this.onVisible);
    this.socket.start();
    this.loadFriends().catch(() => {});
    this.loadRequests().catch(() => {});
    this.syncLoop();
    this.requestsTimer = setInterval(() => {
      if (this.store.connection === 'open') this.loadRequests().catch(() => {});
    }, REQUESTS_EVERY_MS);
    this.presenceTimer = setInterval(() => this.store.changed('presence'), PRESENCE_TEXT_EVERY_MS);
    this.typingTimer = setInterval(() => this.expireTyping(), 1000);
  }

  stop() {
    this.running = false;
    if (this.wake) this.wake();
    this.socket.removeEventListener('frame', this.onFrame);
    this.socket.removeEventListener('open', this.onOpen);
    this.socket.removeEventListener('status', this.onStatus);
    document.removeEventListener('visibilitychange', this.onVisible);
    window.removeEventListener('focus', this.onVisible);
    this.socket.stop();
    clearInterval(this.requestsTimer);
    clearInterval(this.presenceTimer);
    clearInterval(this.typingTimer);
    if (this.pollAbort) this.pollAbort.abort();
    this.reports.stop();
    this.outbox.rejectAll(new Error('stopped'));
    for (const t of this.pullTimers.values()) clearTimeout(t); // no request after the end
  }

  // ---- connection ----------------------------------------------------------------

  connected() {
    // resend what was never acked (same client_msg_id: the server dedupes), and the
    // reports the last socket may have lost
    this.outbox.resendAll();
    this.reports.reopened();
    this.kickSync();
    this.loadRequests().catch(() => {});
    // presence frames missed while the socket was down: read the truth again
    this.loadFriends().catch(() => {}).then(() => this.loadPresence()).catch(() => {});
  }

  /** Run a sync now (abort the long poll in flight). */
  kickSync() {
    this.immediate = true;
    if (this.pollAbort && this.longPolling) this.pollAbort.abort(); // a short one just runs again
    if (this.wake) this.wake();
  }

  async syncLoop() {
    let failures = 0;
    this.immediate = true;
    while (this.running) {
      // Without a socket this long poll is what keeps the page current (the recipe's
      // step 6); every (re)opened socket is followed by a sync (connected()), so nothing
      // sent between the two is missed.
      const wait = this.immediate ? 0 : LONG_POLL_S;
      this.immediate = false;
      try {
        await this.syncOnce(wait);
        failures = 0;
        if (wait > 0) await sleep(300); // at most a few long polls a second under load
      } catch (e) {
        if (e && e.name === 'AbortError') continue;
        failures += 1;
        await new Promise((r) => {
          this.wake = r;
          setTimeout(r, backoffDelay(failures, { baseMs: 500, maxMs: 10000 }));
        });
        this.wake = null;
      }
    }
  }

  async syncOnce(wait) {
    const ctrl = new AbortController();
    this.pollAbort = ctrl;
    try {
      await syncPages(this.api, () => this.store.version, (ans) => this.applySync(ans), {
        wait, recent: 20, limit: 100, signal: ctrl.signal, maxPages: 50,
        onLongPoll: (on) => { this.longPolling = on; },
      });
    } finally {
      this.longPolling = false;
      if (this.pollAbort === ctrl) this.pollAbort = null;
    }
  }

  applySync(ans) {
    let unknownPeer = false;
    for (const st of ans.conversations || []) {
      const c = this.store.conv(st.conv_id);
      const news = !c.known;
      c.applyState(st);
      // a single chat new to me, with someone not (yet) among my friends: the friend
      // list has news too (a request of mine was accepted)
      if (c.type === 'single' && (!this.store.names.has(c.peerId)
        || (news && !this.store.friends.some((f) => f.user_id === c.peerId)))) unknownPeer = true;
      this.received(c, st.messages || [], false);
      this.schedulePull(c, 0);
    }
    if (typeof ans.version === 'number') this.store.version = Math.max(this.store.version, ans.version);
    if (unknownPeer) this.refreshContacts();
    this.store.changed('sync');
  }

  // ---- messages ------------------------------------------------------------------

  /** Store messages of one conversation, then report delivered/read as needed. */
  received(c, msgs, push) {
    const fresh = c.add(msgs);
    this.refetchStale(c);
    if (!fresh.length) return fresh;
    if (fresh.some((m) => m.sender_id !== this.store.me.user_id && COUNTABLE(m))) {
      this.scheduleDelivered(c);
      this.readOpen();
    }
    if (push) this.schedulePull(c, 250); // pushes may arrive out of order: give them a moment
    return fresh;
  }

  /** Held messages whose reactions changed (a notice came): read each one again. */
  refetchStale(c) {
    for (const seq of c.staleReactions) this.refetch(c, seq);
    c.staleReactions.clear();
  }

  schedulePull(c, delay) {
    if (!c.gap()) return;
    if (this.pullTimers.has(c.id)) return;
    this.pullTimers.set(c.id, setTimeout(() => {
      this.pullTimers.delete(c.id);
      this.pullGap(c).catch(() => {});
    }, delay));
  }

  async pullGap(c) {
    if (this.pulling.has(c.id)) { this.pullAgain.add(c.id); return this.pulling.get(c.id); }
    const run = (async () => {
      let retries = 0;
      for (;;) {
        // far behind (more than MAX_GAP seqs): keep only the newest page
        const range = c.seg.nextPull(c.newest, PAGE, MAX_GAP, () => c.msgs.clear());
        if (!range) break;
        const [begin, end] = range;
        const rest = await pullPages(this.api, c.id, begin, end, (ans, from, covered) => {
          c.setWindow(ans.min_seq, null);
          if (ans.max_seq > c.maxSeq) c.maxSeq = ans.max_seq;
          this.received(c, ans.messages || [], false);
          if (covered >= from) c.resolveTo(covered);
          this.store.changed('messages', c.id);
        }, PAGE);
        if (rest !== null) {
          // allocated but not persisted yet (a push outran the writer): try again soon
          if (retries >= GAP_RETRY_MS.length) break;
          await sleep(GAP_RETRY_MS[retries]);
          retries += 1;
        }
      }
    })();
    this.pulling.set(c.id, run);
    try {
      await run;
    } finally {
      this.pulling.delete(c.id);
      if (this.pullAgain.delete(c.id)) this.schedulePull(c, 0);
    }
    return run;
  }

  /** Scrolling up: the page of seqs just below the segment. Returns how many came. */
  async loadOlder(c) {
    if (c.olderEnd || c.loadingOlder) return 0;
    const page = c.seg.olderPage(50);
    if (!page) { this.store.changed('messages', c.id); return 0; }
    const [begin, end] = page;
    c.loadingOlder = true;
    this.store.changed('messages', c.id);
    try {
      const ans = await this.api.history(c.id, { end, limit: 50, order: 'desc' });
      c.setWindow(ans.min_seq, null);
      const fresh = c.add(ans.messages || []);
      this.refetchStale(c);
      c.seg.coveredOlder(begin, ans.min_seq, ans.is_end);
      return fresh.length;
    } finally {
      c.loadingOlder = false;
      this.store.changed('messages', c.id);
    }
  }

  /**
   * Make the held segment reach a message (a search hit, maybe far back): pull the gap
   * up to it when it is newer than the held ones, else page older history down to it.
   * True when the message is held afterwards (false: outside my window, or gone).
   */
  async reveal(c, seq) {
    if (!Number.isInteger(seq) || seq < 1) return false;
    const session = this.store.session;
    if (!c.segment) c.seg.start(c.seg.revealFloor(seq, REVEAL_MARGIN));
    if (seq > c.top) {
      if (seq > c.maxSeq) c.maxSeq = seq; // persisted: search found it
      await this.pullGap(c);
    }
    const want = c.seg.revealFloor(seq, REVEAL_MARGIN);
    while (this.running && session === this.store.session) {
      const range = c.seg.towards(want, PAGE);
      if (!range) break;
      if (c.loadingOlder) { await sleep(50); continue; } // a scroll-up page is on its way
      c.loadingOlder = true;
      this.store.changed('messages', c.id);
      try {
        const [begin, end] = range;
        const ans = await this.api.history(c.id, { begin, end, limit: PAGE, order: 'desc' });
        c.setWindow(ans.min_seq, null);
        c.add(ans.messages || []);
        this.refetchStale(c);
        c.seg.coveredOlder(begin, ans.min_seq);
      } finally {
        c.loadingOlder = false;
        this.store.changed('messages', c.id);
      }
    }
    const m = c.msgs.get(seq);
    return !!m && !m.recalled;
  }

  // ---- search --------------------------------------------------------------------

  /** One page of the messages I can see containing q, newest first: {results, next}. */
  async search(q, { before = null, signal } = {}) {
    const ans = await this.api.search(q, { before, limit: SEARCH_PAGE, signal });
    const results = (ans && ans.results) || [];
    return { results, next: (ans && ans.next_before) || null };
  }

  // ---- cursors -------------------------------------------------------------------

  scheduleDelivered(c) {
    this.reports.delivered(c.id, c.maxHeld);
  }

  /**
   * Report read for the open conversation, up to what is on screen, when the page is
   * visible and its window focused: a message scrolled past unseen, or one that came
   * while the reader was in another window, stays unread.
   */
  readOpen() {
    const c = this.store.open;
    if (!c || document.visibilityState !== 'visible' || !document.hasFocus()) return;
    const onScreen = this.seenUpTo(c);
    if (!onScreen) return;
    if (!c.hasUnreadFromOthers()) {
      if (c.unreadBase && onScreen === Infinity) { c.unreadBase = 0; this.store.changed('read', c.id); }
      return;
    }
    const seq = Math.min(Math.max(c.maxHeld, c.maxSeq), onScreen);
    if (!c.markRead(seq)) return; // not past the cursor: nothing to report
    this.reportRead(c, seq);
    this.store.changed('read', c.id);
  }

  /** Batched: over the socket, else REST; what neither took is reported again. */
  reportRead(c, seq) {
    this.reports.read(c.id, seq).catch(() => {});
  }

  open(convId) {
    this.store.openId = convId;
    const c = convId ? this.store.conv(convId, false) : null;
    this.store.changed('open', convId);
    if (!c) return;
    this.readOpen();
    if (c.type === 'group') {
      this.refreshReceipts(c).catch(() => {});
      this.loadMembers(c).catch(() => {});
    }
  }

  async refreshReceipts(c) {
    const me = this.store.me.user_id;
    const mine = [...c.msgs.values()].filter((m) => m.sender_id === me && COUNTABLE(m) && !m.recalled)
      .sort((a, b) => b.seq - a.seq).slice(0, 8);
    await Promise.all(mine.map(async (m) => {
      try {
        const r = await this.api.receipts(c.id, m.seq);
        c.receipts.set(m.seq, r.read_count);
      } catch { /* not persisted yet, or receipts disabled */ }
    }));
    this.store.changed('receipts', c.id);
  }

  // ---- frames --------------------------------------------------------------------

  frame(f) {
    const me = this.store.me && this.store.me.user_id;
    switch (f.type) {
      case 'message': {
        const m = f.message;
        if (!m || !m.conv_id) return;
        const c = this.store.conv(m.conv_id);
        this.received(c, [m], true);
        if (!c.known) this.kickSync();   // a conversation new to me: fetch its state
        if (c.hidden && m.content_type !== 'recall') c.hidden = false;
        // the members changed: the mention list (and the panel) follow
        if (m.content_type === 'system' && c.members) this.loadMembers(c).catch(() => {});
        this.store.changed('messages', c.id);
        if (this.onLiveMessage) this.onLiveMessage(c, m);
        return;
      }
      case 'ack': this.outbox.onAck(f); return;
      case 'read': {
        const c = this.store.conv(f.conv_id, false);
        if (!c) return;
        if (f.user_id === me) c.markRead(f.seq);
        else if (c.type === 'single') c.peerReadSeq = Math.max(c.peerReadSeq, f.seq);
        this.store.changed('read', c.id);
        return;
      }
      case 'delivered': {
        const c = this.store.conv(f.conv_id, false);
        if (!c || f.user_id === me) return;
        c.peerDeliveredSeq = Math.max(c.peerDeliveredSeq, f.seq);
        this.store.changed('read', c.id);
        return;
      }
      case 'receipt': {
        const c = this.store.conv(f.conv_id, false);
        if (!c) return;
        c.receipts.set(f.seq, f.read_count);
        this.store.changed('receipts', c.id);
        return;
      }
      case 'typing': {
        const c = this.store.conv(f.conv_id, false);
        if (!c || f.user_id === me) return;
        c.typing.set(f.user_id, Date.now() + 4000);
        this.store.changed('typing', c.id);
        return;
      }
      case 'presence': {
        if (!Number.isInteger(f.user_id)) return;
        this.presenceTick += 1;
        this.presenceAt.set(f.user_id, this.presenceTick);
        this.store.presence.set(f.user_id, { online: f.online, last_seen: f.last_seen });
        this.store.changed('presence');
        return;
      }
      case 'contacts': this.refreshContacts(); return;
      case 'error':
        console.warn('server error frame', f.code, f.message);
        return;
      default:
    }
  }

  expireTyping() {
    const now = Date.now();
    for (const c of this.store.convs.values()) {
      let changed = false;
      for (const [u, t] of c.typing) if (t <= now) { c.typing.delete(u); changed = true; }
      if (changed) this.store.changed('typing', c.id);
    }
  }

  // ---- sending -------------------------------------------------------------------

  /** extras: {mentions: [user_id], mention_all, reply_to} (mentions: groups only). */
  send(c, text, extras = {}) {
    const me = this.store.me.user_id;
    const mentions = c.type === 'group' ? [...new Set(extras.mentions || [])].slice(0, MAX_MENTIONS) : [];
    const p = {
      client_msg_id: newId(), conv_id: c.id, sender_id: me, content_type: 'text',
      content: { text }, created: Date.now(), server_time: Date.now(), state: 'sending', recalled: false,
      mentions, mention_all: c.type === 'group' && !!extras.mention_all,
      reply_to: Number.isInteger(extras.reply_to) ? extras.reply_to : null, edited_at: null, reactions: [],
    };
    c.pending.set(p.client_msg_id, p);
    c.hidden = false;
    this.reports.typingEnded(c.id); // the peer clears my typing line on this message
    this.store.changed('messages', c.id);
    this.transmit(p);
    return p;
  }

  /**
   * A picture or file: a pending message shows it (with the upload's progress) while the
   * bytes go to the object store, then it is sent like a text. Rejects (and drops the
   * pending message) when the upload is refused or fails: nothing is sent then.
   * extras: {reply_to}.
   */
  async sendAttachment(c, file, caption = '', extras = {}) {
    if (!file.size) throw new Error(`"${file.name || 'file'}" is empty`);
    const me = this.store.me.user_id;
    const mime = mimeOf(file);
    const kind = IMAGE_TYPES.has(mime) ? 'image' : 'file';
    const content = { upload_id: null, name: nameOf(file, mime), size: file.size, mime };
    if (caption) content.caption = caption;
    if (kind === 'image') Object.assign(content, await imageSize(file));
    const p = {
      client_msg_id: newId(), conv_id: c.id, sender_id: me, content_type: kind, content,
      created: Date.now(), server_time: Date.now(), state: 'uploading', progress: 0, recalled: false,
      mentions: [], mention_all: false, reply_to: Number.isInteger(extras.reply_to) ? extras.reply_to : null,
      edited_at: null, reactions: [], preview: kind === 'image' ? URL.createObjectURL(file) : null,
    };
    c.pending.set(p.client_msg_id, p);
    c.hidden = false;
    this.store.changed('messages', c.id);
    try {
      const ticket = await this.api.createUpload(mime, file.size, content.name);
      p.content = { ...content, upload_id: ticket.upload_id };
      await putBytes(ticket, file, (f) => { p.progress = f; this.store.changed('messages', c.id); });
    } catch (e) {
      c.pending.delete(p.client_msg_id);
      if (p.preview) URL.revokeObjectURL(p.preview);
      this.store.changed('messages', c.id);
      throw e;
    }
    if (p.preview) this.media.previews.set(p.content.upload_id, p.preview); // no download for mine
    p.wire = { upload_id: p.content.upload_id };
    if (caption) p.wire.caption = caption;
    p.progress = 1;
    p.state = 'sending';
    this.store.changed('messages', c.id);
    this.transmit(p);
    return p;
  }

  retry(c, cmid) {
    const p = c.pending.get(cmid);
    if (!p) return;
    p.state = 'sending';
    p.error = null;
    this.store.changed('messages', c.id);
    this.transmit(p);
  }

  transmit(p) {
    const frame = {
      type: 'send', conv_id: p.conv_id,
      ...sendBody(p.wire || p.content, p.client_msg_id, {
        contentType: p.content_type, mentions: p.mentions, mentionAll: p.mention_all,
        replyTo: p.reply_to ?? undefined,
      }),
    };
    this.outbox.send(frame, { onAck: (f) => this.acked(p, f) }).catch((e) => {
      const c = this.store.conv(p.conv_id, false);
      if (!this.running || !c || c.pending.get(p.client_msg_id) !== p) return;
      p.state = 'failed';
      p.error = e.detail || e.code || e.message;
      this.store.changed('messages', c.id);
    });
  }

  /** My message was acked: it leaves the pending ones for its place in the history. */
  acked(p, f) {
    const c = this.store.conv(p.conv_id, false);
    if (!c || c.pending.get(p.client_msg_id) !== p) return;
    c.pending.delete(p.client_msg_id);
    const target = this.store.conv(f.conv_id || c.id);
    this.received(target, [{
      conv_id: target.id, seq: f.seq, sender_id: p.sender_id, client_msg_id: p.client_msg_id,
      content_type: p.content_type, content: p.content, server_time: f.server_time, recalled: false,
      mentions: p.mentions || [], mention_all: !!p.mention_all, reply_to: p.reply_to ?? null,
      edited_at: null, reactions: [],
    }], true);
    // an attachment's content is the server's (name, size, type, picture size)
    if (p.wire) this.refetch(target, f.seq);
    this.store.changed('messages', target.id);
  }

  typing(c) {
    this.reports.typing(c.id);
  }

  async recall(c, seq) {
    await this.api.recall(c.id, seq);
    c.markRecalled(seq);
    this.store.changed('messages', c.id);
  }

  /** Edit my text message; the original shows the new text at once. */
  async edit(c, seq, text) {
    const r = await this.api.edit(c.id, seq, { text });
    const m = c.msgs.get(seq);
    if (m && !m.recalled && r && r.edited_at != null && r.edited_at >= (m.edited_at || 0)) {
      m.content = { ...(m.content || {}), text };
      m.edited_at = r.edited_at;
      c.edits.set(seq, { at: r.edited_at, content: m.content });
      if (c.lastMessage && c.lastMessage.seq === seq) c.lastMessage = c.edited({ ...c.lastMessage });
    }
    this.store.changed('messages', c.id);
    return r;
  }

  /** Put (on) or take back (off) my reaction; the chips come from the server's copy. */
  async react(c, seq, emoji, on) {
    if (on) await this.api.react(c.id, seq, emoji);
    else await this.api.unreact(c.id, seq, emoji);
    await this.refetch(c, seq);
  }

  /**
   * Read one message again (history begin=end=seq) and take its reactions and content.
   * A reaction is committed before its notice is sent, so a read started after the
   * notice arrived sees it: one read per message at a time, run again when another
   * notice came meanwhile, so the last read always starts after the last notice.
   */
  refetch(c, seq) {
    const key = `${c.id}|${seq}`;
    if (this.refetching.has(key)) { this.refetchAgain.add(key); return this.refetching.get(key); }
    const session = this.store.session;
    const run = (async () => {
      do {
        this.refetchAgain.delete(key);
        try {
          const ans = await this.api.history(c.id, { begin: seq, end: seq, limit: 1 });
          if (session !== this.store.session) return;
          const m = (ans.messages || []).find((x) => x.seq === seq);
          if (m) { c.refresh(m); this.store.changed('messages', c.id); }
        } catch { /* the next notice or reload reads it again */ }
      } while (this.refetchAgain.has(key) && this.running);
    })();
    this.refetching.set(key, run);
    run.finally(() => { if (this.refetching.get(key) === run) this.refetching.delete(key); });
    return run;
  }

  /**
   * The original of a reply: {state: 'ok', m} from the messages held or one history read
   * of that seq; 'unavailable' when I cannot see it (outside my window, recalled, or not
   * returned); 'loading' while the read runs (the views re-render when it ends).
   */
  quote(c, seq) {
    if (!Number.isInteger(seq) || seq < c.minSeq || seq < 1) return { state: 'unavailable' };
    const held = c.msgs.get(seq);
    if (held) return held.recalled || !COUNTABLE(held) ? { state: 'unavailable' } : { state: 'ok', m: held };
    const q = c.quotes.get(seq);
    if (q) {
      if (q.state === 'ok' && (q.m.recalled || c.recalledSeqs.has(seq))) return { state: 'unavailable' };
      return q;
    }
    c.quotes.set(seq, { state: 'loading' });
    const session = this.store.session;
    (async () => {
      let answer = { state: 'unavailable' };
      let failed = false;
      for (let attempt = 0; ; attempt += 1) {
        try {
          const ans = await this.api.history(c.id, { begin: seq, end: seq, limit: 1 });
          const m = (ans.messages || []).find((x) => x.seq === seq);
          if (m && !m.recalled && COUNTABLE(m)) answer = { state: 'ok', m: c.edited({ ...m }) };
          // handed out but not stored yet: ask again shortly
          else if (!m && ans.max_seq < seq && attempt < GAP_RETRY_MS.length) { await sleep(GAP_RETRY_MS[attempt]); continue; }
        } catch {
          failed = true; // unavailable for now; asked again after a while
        }
        break;
      }
      if (session !== this.store.session) return;
      c.quotes.set(seq, answer);
      if (failed) setTimeout(() => { if (c.quotes.get(seq) === answer) c.quotes.delete(seq); }, QUOTE_RETRY_MS);
      this.store.changed('messages', c.id);
    })();
    return { state: 'loading' };
  }

  // ---- presence ------------------------------------------------------------------

  /** Friends' and single-chat peers' presence, the truth from GET /v1/presence. */
  async loadPresence() {
    const ids = new Set(this.store.friends.map((f) => f.user_id));
    for (const c of this.store.convs.values()) if (c.type === 'single' && c.peerId != null) ids.add(c.peerId);
    const all = [...ids].filter((u) => Number.isInteger(u) && u > 0);
    const session = this.store.session;
    for (let i = 0; i < all.length; i += PRESENCE_BATCH) {
      const asked = this.presenceTick;
      const ans = await this.api.presence(all.slice(i, i + PRESENCE_BATCH));
      if (session !== this.store.session) return;
      for (const p of ans || []) {
        // a frame that came while this answer was on its way is newer: it stays
        if ((this.presenceAt.get(p.user_id) || 0) > asked) continue;
        this.store.presence.set(p.user_id, { online: p.online, last_seen: p.last_seen });
      }
    }
    if (all.length) this.store.changed('presence');
  }

  // ---- contacts and groups -------------------------------------------------------

  async loadFriends() {
    const now = Date.now();
    if (now - this.friendsAt < 1000) return;
    this.friendsAt = now;
    const friends = await this.api.friends();
    const before = JSON.stringify(this.store.friends.map((f) => f.user_id));
    this.store.friends = friends;
    for (const f of friends) this.store.learn(f.user_id, f.username);
    this.store.changed('friends');
    // a new friend: no presence frame tells about it (docs/protocol.md §3), ask
    if (JSON.stringify(friends.map((f) => f.user_id)) !== before) this.loadPresence().catch(() => {});
  }

  /**
   * Friends and requests read again (a contacts frame, a single chat new to me). Asked
   * while a read is on its way, it runs once more after it: the last change is never
   * missed, and a burst costs two reads.
   */
  refreshContacts() {
    if (this.contactsBusy) { this.contactsAgain = true; return; }
    this.contactsBusy = true;
    this.friendsAt = 0;
    Promise.all([this.loadRequests(), this.loadFriends()]).catch(() => {}).finally(() => {
      this.contactsBusy = false;
      if (this.contactsAgain && this.running) { this.contactsAgain = false; this.refreshContacts(); }
    });
  }

  async declineRequest(requestId) {
    await this.api.declineFriend(requestId);
    await this.loadRequests();
  }

  async cancelRequest(requestId) {
    await this.api.cancelFriendRequest(requestId);
    await this.loadRequests();
  }

  /** Block a user (their pending request to me is declined with it). */
  async block(userId) {
    await this.api.block(userId);
    this.friendsAt = 0;
    await Promise.all([this.loadRequests(), this.loadFriends()]);
  }

  async loadRequests() {
    const r = await this.api.friendRequests();
    for (const q of [...(r.incoming || []), ...(r.outgoing || [])]) {
      this.store.learn(q.from_user_id, q.from_username);
      this.store.learn(q.to_user_id, q.to_username);
    }
    const before = JSON.stringify(this.store.requests);
    this.store.requests = r;
    if (JSON.stringify(r) !== before) this.store.changed('requests');
  }

  async accept(requestId) {
    const r = await this.api.acceptFriend(requestId);
    this.friendsAt = 0;
    await Promise.all([this.loadRequests(), this.loadFriends()]);
    this.kickSync();
    return r;
  }

  /** A user by username, as the server compares them (case and width do not matter). */
  async lookupUser(username) {
    const u = await this.api.lookupUser(username);
    if (this.store.learn(u.user_id, u.username)) this.store.changed('names');
    return u;
  }

  async requestFriend(userId, note) {
    const r = await this.api.requestFriend(userId, note);
    await this.loadRequests();
    if (r.accepted) { this.friendsAt = 0; await this.loadFriends(); this.kickSync(); }
    return r;
  }

  async createGroup(name, ids) {
    const r = await this.api.createGroup(name, ids);
    this.kickSync();
    return r;
  }

  /** Mute or pin (PUT settings); the answer is the server's word for this device. */
  async setSettings(c, body) {
    const r = await this.api.settings(c.id, body);
    c.muted = !!r.muted;
    c.pinned = !!r.pinned;
    this.store.changed('settings', c.id);
    return r;
  }

  async loadMembers(c) {
    c.members = await this.api.members(c.groupId);
    for (const m of c.members) this.store.learn(m.user_id, m.username);
    this.store.changed('members', c.id);
    return c.members;
  }
}
