// Client state: me, names, friends, requests and one Conv per conversation. Messages
// are kept once per (conv_id, seq); each Conv tracks the contiguous segment of seqs it
// holds ([floor, top]: every seq there is held or known not to exist) with the SDK's
// Segment, which is what the engine uses to find the ranges to pull. Names are a cache (user_id -> username)
// filled from friends, group members and friend requests; a miss asks GET /v1/users/{id}
// (one request per id at a time) and the views re-render when the name arrives.

import { Segment } from './sdk/index.js';

const LOOKUP_RETRY_MS = 10000; // a lookup that failed (not a 404) is tried again after this
const DELETED_NAME = 'Deleted account'; // no username can hold a space

// Notices ride the seq stream: a recall, an edit or a reaction changes another message.
// They are never counted as unread and never shown as rows of their own.
export const NOTICE_TYPES = new Set(['recall', 'edit', 'reaction']);
export const COUNTABLE = (m) => m.content_type !== 'system' && !NOTICE_TYPES.has(m.content_type);
// an edit or a reaction notice is no news for a preview
const QUIET = (m) => m.content_type === 'edit' || m.content_type === 'reaction';

export class Conv {
  constructor(id, meId) {
    this.id = id;
    this.type = id.startsWith('g:') ? 'group' : 'single';
    this.groupId = this.type === 'group' ? Number(id.slice(2)) : null;
    this.peerId = null;
    if (this.type === 'single') {
      const [, a, b] = id.split(':').map(Number);
      this.peerId = a === meId ? b : a;
    }
    this.meId = meId;
    this.msgs = new Map();     // seq -> message
    this.seg = new Segment((s) => this.msgs.has(s)); // the held segment [floor, top] and minSeq
    this.name = null;
    this.role = null;
    this.active = true;
    this.hidden = false;
    this.muted = false;        // my settings (§5.5a): muted counts only mentions in the badge
    this.pinned = false;       // pinned conversations are listed first
    this.known = false;        // a server state was applied
    this.maxSeq = 0;           // persisted end of my window, from the server
    this.readSeq = 0;
    this.unreadBase = 0;       // the server's unread count as of baseMax
    this.mentionBase = 0;      // of those, the ones that mention me (or all)
    this.baseMax = 0;
    this.baseRead = 0;         // the server's read cursor behind unreadBase
    this.peerReadSeq = 0;
    this.peerDeliveredSeq = 0;
    this.lastMessage = null;
    this.pending = new Map();  // client_msg_id -> local message not acked yet
    this.recalledSeqs = new Set();
    this.edits = new Map();    // seq -> the newest edit notice seen {at, content}
    this.staleReactions = new Set(); // held seqs whose reactions changed: refetch them
    this.quotes = new Map();   // seq -> {state: 'loading'|'ok'|'unavailable', m?} (replies)
    this.receipts = new Map(); // seq -> read_count (groups, my messages)
    this.typing = new Map();   // user_id -> expiry (ms)
    this.members = null;       // [{user_id, role}] once fetched
    this.createdAt = Date.now();
  }

  applyState(st) {
    this.known = true;
    if (st.name != null) this.name = st.name;
    if (st.role != null) this.role = st.role;
    if (st.active != null) this.active = !!st.active;
    if (st.peer_id != null) this.peerId = st.peer_id;
    this.hidden = !!st.hidden;
    if (st.muted != null) this.muted = !!st.muted;
    if (st.pinned != null) this.pinned = !!st.pinned;
    this.setWindow(st.min_seq, st.max_seq);
    const localRead = this.readSeq;
    this.readSeq = Math.max(this.readSeq, st.read_seq || 0);
    this.unreadBase = st.unread || 0;
    this.mentionBase = st.mention_unread || 0;
    this.baseRead = st.read_seq || 0;
    // a read report of mine still on its way: the server's count is already stale
    if (localRead > (st.read_seq || 0) && localRead >= (st.max_seq || 0)) { this.unreadBase = 0; this.mentionBase = 0; }
    this.baseMax = Math.max(st.max_seq || 0, this.readSeq);
    if (st.peer_read_seq != null) this.peerReadSeq = Math.max(this.peerReadSeq, st.peer_read_seq);
    if (st.peer_delivered_seq != null) this.peerDeliveredSeq = Math.max(this.peerDeliveredSeq, st.peer_delivered_seq);
    if (st.last_message !== undefined) this.lastMessage = st.last_message && this.edited(st.last_message);
    if (!this.segment) {
      // Start the segment just below the newest messages the state carries; older
      // ones are loaded when the user scrolls up.
      const embedded = st.messages || [];
      const first = embedded.length ? embedded[0].seq : (st.max_seq || 0) + 1;
      this.startSegment(Math.max(first, this.minSeq));
    }
  }

  // The segment's state, read by the engine and the views (the arithmetic is the SDK's)
  get minSeq() { return this.seg.minSeq; }
  get segment() { return this.seg.started; }
  get floor() { return this.seg.floor; }
  get top() { return this.seg.top; }
  get olderEnd() { return this.seg.olderEnd; }

  startSegment(floor) {
    this.seg.start(floor);
  }

  setWindow(minSeq, maxSeq) {
    if (minSeq != null && minSeq > this.minSeq) {
      for (const s of [...this.msgs.keys()]) if (s < minSeq) this.msgs.delete(s);
      this.seg.minSeq = minSeq;
    } else if (minSeq != null && !this.known) {
      this.seg.minSeq = minSeq;
    }
    this.seg.clamp();
    if (maxSeq != null) this.maxSeq = maxSeq;
  }

  // Everything in [top+1, seq] that is not held does not exist for me.
  resolveTo(seq) {
    this.seg.resolveTo(seq);
  }

  /** Add messages; returns those not held before. */
  add(list) {
    const fresh = [];
    const before = new Set(); // held before this batch: a batch's own copies are current
    for (const m of list) if (m && this.msgs.has(m.seq)) before.add(m.seq);
    for (const m of list) {
      if (!m || typeof m.seq !== 'number' || m.seq < this.minSeq) continue;
      if (m.sender_id === this.meId && this.pending.has(m.client_msg_id)) this.pending.delete(m.client_msg_id);
      const held = this.msgs.get(m.seq);
      if (held) {
        if (m.recalled && !held.recalled) { held.recalled = true; held.content = null; held.reactions = []; }
        else if (!held.recalled && (m.edited_at || 0) > (held.edited_at || 0)) {
          held.content = m.content;
          held.edited_at = m.edited_at;
        }
        continue;
      }
      const msg = this.edited({ ...m });
      if (this.recalledSeqs.has(msg.seq)) { msg.recalled = true; msg.content = null; msg.reactions = []; }
      this.msgs.set(msg.seq, msg);
      if (msg.content_type === 'recall' && msg.content && msg.content.seq) this.markRecalled(msg.content.seq);
      if (msg.content_type === 'edit' && msg.content) this.applyEdit(msg);
      if (msg.content_type === 'reaction' && msg.content) {
        // the original's copy in this very batch was read after the reaction: current
        const t = msg.content.seq;
        if (before.has(t) || (this.msgs.has(t) && !list.some((x) => x && x.seq === t))) this.staleReactions.add(t);
      }
      if (msg.sender_id != null) this.typing.delete(msg.sender_id);
      fresh.push(msg);
    }
    this.seg.took(fresh.map((m) => m.seq));
    return fresh;
  }

  /** An edit notice: the original shows the new content, unless it holds a newer one. */
  applyEdit(notice) {
    const seq = notice.content.seq;
    const at = notice.server_time || 0;
    const known = this.edits.get(seq);
    if (!known || known.at <= at) this.edits.set(seq, { at, content: notice.content.content });
    const m = this.msgs.get(seq);
    if (m) this.edited(m);
    if (this.lastMessage && this.lastMessage.seq === seq) this.lastMessage = this.edited({ ...this.lastMessage });
    const q = this.quotes.get(seq);
    if (q && q.m) this.edited(q.m);
  }

  /** Bring a message up to the newest edit notice seen (a copy read before it came). */
  edited(m) {
    const e = this.edits.get(m.seq);
    if (e && !m.recalled && e.at > (m.edited_at || 0) && e.content) {
      m.content = e.content;
      m.edited_at = e.at;
    }
    return m;
  }

  /** A copy of a held message read again (reactions, edits): the server's word. */
  refresh(m) {
    const held = this.msgs.get(m.seq);
    for (const target of [held, this.quotes.get(m.seq)?.m]) {
      if (!target) continue;
      target.reactions = m.reactions || [];
      if (m.recalled) { target.recalled = true; target.content = null; target.reactions = []; }
      else if ((m.edited_at || 0) >= (target.edited_at || 0)) {
        target.content = m.content;
        target.edited_at = m.edited_at;
      }
      this.edited(target);
    }
  }

  markRecalled(seq) {
    this.recalledSeqs.add(seq);
    const m = this.msgs.get(seq);
    if (m) { m.recalled = true; m.content = null; m.reactions = []; }
    if (this.lastMessage && this.lastMessage.seq === seq) this.lastMessage = { ...this.lastMessage, recalled: true, content: null };
  }

  get maxHeld() {
    let max = 0;
    for (const s of this.msgs.keys()) if (s > max) max = s;
    return max;
  }

  /** The newest known seq: the server's max_seq or a held one above it. */
  get newest() {
    return Math.max(this.maxSeq, this.maxHeld);
  }

  /** The seqs to pull to close the segment up to the newest known seq, or null. */
  gap() {
    return this.seg.gap(this.newest);
  }

  /**
   * Of the server's count, the held messages (matching ``pred``) read here since: a read
   * up to what was on screen, short of the newest, lowers the count before the server's
   * next state does.
   */
  readSinceBase(pred) {
    if (this.readSeq <= this.baseRead) return 0;
    const hi = Math.min(this.readSeq, this.baseMax);
    let n = 0;
    for (const m of this.msgs.values()) if (m.seq > this.baseRead && m.seq <= hi && pred(m)) n += 1;
    return n;
  }

  get unread() {
    const cut = Math.max(this.baseMax, this.readSeq);
    let n = Math.max(0, this.unreadBase - this.readSinceBase((m) => m.sender_id !== this.meId && COUNTABLE(m)));
    for (const m of this.msgs.values()) {
      if (m.seq > cut && m.sender_id !== this.meId && COUNTABLE(m)) n += 1;
    }
    return n;
  }

  /** Does this message mention me (by id, or everyone)? */
  mentionsMe(m) {
    return m.sender_id !== this.meId && COUNTABLE(m)
      && (!!m.mention_all || (Array.isArray(m.mentions) && m.mentions.includes(this.meId)));
  }

  get mentionUnread() {
    const cut = Math.max(this.baseMax, this.readSeq);
    let n = Math.max(0, this.mentionBase - this.readSinceBase((m) => this.mentionsMe(m)));
    for (const m of this.msgs.values()) if (m.seq > cut && this.mentionsMe(m)) n += 1;
    return n;
  }

  /** What this conversation adds to the badge: its unread, or only its mentions when muted. */
  get badge() {
    const unread = this.unread;
    if (!this.muted) return unread;
    return unread > 0 ? Math.min(this.mentionUnread, unread) : 0;
  }

  hasUnreadFromOthers() {
    if (this.unread > 0) return true;
    for (const m of this.msgs.values()) if (m.seq > this.readSeq && m.sender_id !== this.meId && COUNTABLE(m)) return true;
    return false;
  }

  markRead(seq) {
    if (seq <= this.readSeq) return false;
    this.readSeq = seq;
    if (seq >= this.baseMax) { this.unreadBase = 0; this.mentionBase = 0; this.baseMax = seq; }
    return true;
  }

  /** Held messages and local sends, in display order. */
  timeline() {
    const held = [...this.msgs.values()].sort((a, b) => a.seq - b.seq);
    const pending = [...this.pending.values()].sort((a, b) => a.created - b.created);
    return held.concat(pending);
  }

  /** The newest message worth a preview (held or from the server state). */
  get latest() {
    let best = this.lastMessage && !QUIET(this.lastMessage) ? this.lastMessage : null;
    for (const m of this.msgs.values()) if (!QUIET(m) && (!best || m.seq > best.seq)) best = m;
    let newestPending = null;
    for (const p of this.pending.values()) if (!newestPending || p.created > newestPending.created) newestPending = p;
    return newestPending || best || this.lastMessage || null;
  }

  get lastActivity() {
    const m = this.latest;
    if (m) return m.created || m.server_time || 0;
    return 0;
  }
}

export class Store extends EventTarget {
  constructor() {
    super();
    this.reset();
  }

  reset() {
    this.me = null;               // {user_id, username}
    this.names = new Map();       // user_id -> username
    this.lookups = new Map();     // user_id -> lookup in flight (or failed just now, or 404)
    this.fetchUser = null;        // user_id -> promise of {user_id, username}; set by the engine
    this.session = (this.session || 0) + 1; // answers of an ended session are dropped
    this.friends = [];
    this.requests = { incoming: [], outgoing: [] };
    this.convs = new Map();
    this.version = 0;
    this.connection = 'connecting';
    this.presence = new Map();    // user_id -> {online, last_seen} (friends only; the server's word)
    this.openId = null;
    this.notice = null;
  }

  setMe(me) {
    this.me = me;
    this.names.set(me.user_id, me.username);
  }

  conv(id, create = true) {
    let c = this.convs.get(id);
    if (!c && create) {
      c = new Conv(id, this.me ? this.me.user_id : null);
      this.convs.set(id, c);
    }
    return c;
  }

  get open() { return this.openId ? this.convs.get(this.openId) || null : null; }

  /** Remember a username (friends, members, requests); true when it is news. */
  learn(userId, username) {
    if (userId == null || !username || this.names.get(userId) === username) return false;
    this.names.set(userId, username);
    return true;
  }

  /** The username of a user not known yet: one GET per id at a time; resolves to the name or null. */
  lookup(userId) {
    if (this.names.has(userId)) return Promise.resolve(this.names.get(userId));
    if (!this.fetchUser || !Number.isInteger(userId)) return Promise.resolve(null);
    let p = this.lookups.get(userId);
    if (p) return p;
    const session = this.session;
    p = this.fetchUser(userId).then(
      (u) => {
        if (session !== this.session) return null;
        this.lookups.delete(userId);
        // a deleted account has no username any more: its messages stay, shown as such
        const name = u && u.deleted ? DELETED_NAME : u && u.username;
        if (this.learn(userId, name)) this.changed('names');
        return this.names.get(userId) || null;
      },
      (e) => {
        // unknown (404): not asked again this session; else again after a while
        if (session === this.session && e.status !== 404) {
          setTimeout(() => { if (this.lookups.get(userId) === p) this.lookups.delete(userId); }, LOOKUP_RETRY_MS);
        }
        return null;
      },
    );
    this.lookups.set(userId, p);
    return p;
  }

  /** Wait until these users' names are known (or cannot be). */
  resolve(userIds) {
    return Promise.all([...new Set(userIds)].map((u) => this.lookup(u)));
  }

  nameOf(userId) {
    if (this.me && userId === this.me.user_id) return 'you';
    return this.plainName(userId);
  }

  /** The username, else a stand-in while it is looked up. */
  plainName(userId) {
    const name = this.names.get(userId);
    if (name) return name;
    this.lookup(userId);
    return `user #${userId}`;
  }

  title(c) {
    if (c.type === 'group') return c.name || `group ${c.groupId}`;
    return this.plainName(c.peerId);
  }

  /** Visible conversations: pinned first, then newest activity first within each part. */
  list() {
    return [...this.convs.values()]
      .filter((c) => c.known && (!c.hidden || c.id === this.openId))
      .sort((a, b) => (b.pinned - a.pinned) || (b.lastActivity - a.lastActivity)
        || (b.createdAt - a.createdAt) || a.id.localeCompare(b.id));
  }

  totalUnread() {
    let n = 0;
    for (const c of this.convs.values()) if (c.known) n += c.unread;
    return n;
  }

  /** The app badge, by the server's rule (GET /v1/unread `badge`): unread over the
   * conversations I did not mute plus mentions over those I muted. */
  badge() {
    let n = 0;
    for (const c of this.convs.values()) if (c.known) n += c.badge;
    return n;
  }

  changed(what = 'all', convId = null) {
    this.dispatchEvent(new CustomEvent('change', { detail: { what, convId } }));
  }
}
