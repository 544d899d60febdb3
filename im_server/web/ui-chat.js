// The chat pane: header, the timeline (messages by seq, local sends after them), older
// history on scroll-up, typing line and composer. Rows are keyed and updated in place, so
// a message keeps its element from "sending" to "read".

import { $, h, avatar, describe, fmtDay, fmtTime, setAttr, setText, cap } from './dom.js';

const RECALL_WINDOW_MS = 120000;
const STATUS_TEXT = { sending: 'Sending…', sent: 'Sent', delivered: 'Delivered', read: 'Read', failed: 'Not sent' };
const STATUS_ICON = { sending: '◷', sent: '✓', delivered: '✓✓', read: '✓✓', failed: '!' };

export class ChatView {
  constructor(store, engine, { onClose, onGroupInfo, onReceipts, toast }) {
    this.store = store;
    this.engine = engine;
    this.toast = toast;
    this.onReceipts = onReceipts;
    this.rows = new Map();
    this.convId = null;
    this.scroller = $('#messages');
    this.timelineEl = $('#timeline');
    this.input = $('#composer-input');
    $('#chat-close').addEventListener('click', onClose);
    $('#group-info-btn').addEventListener('click', onGroupInfo);
    $('#composer').addEventListener('submit', (e) => { e.preventDefault(); this.submit(); });
    this.input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.submit(); }
    });
    this.input.addEventListener('input', () => {
      this.autogrow();
      const c = this.store.open;
      if (c && this.input.value.trim()) this.engine.typing(c);
    });
    this.scroller.addEventListener('scroll', () => this.maybeLoadOlder());
    setInterval(() => { if (this.store.open) this.render(); }, 15000); // recall buttons expire
  }

  autogrow() {
    this.input.style.height = 'auto';
    this.input.style.height = `${Math.min(this.input.scrollHeight, 160)}px`;
  }

  submit() {
    const c = this.store.open;
    const text = this.input.value.trim();
    if (!c || !text) return;
    this.input.value = '';
    this.autogrow();
    this.stick = true;
    this.engine.send(c, text);
    this.input.focus();
  }

  async maybeLoadOlder() {
    const c = this.store.open;
    if (!c || c.olderEnd || c.loadingOlder) return;
    if (this.scroller.scrollTop > 150) return;
    if (c.olderRetryAt && Date.now() < c.olderRetryAt) return; // failed just now: not in a loop
    try {
      await this.engine.loadOlder(c);
    } catch (e) {
      c.olderRetryAt = Date.now() + 5000;
      this.toast(`Could not load older messages: ${e.message}`);
    }
  }

  render() {
    const c = this.store.open;
    $('#chat-empty').hidden = !!c;
    $('#chat-view').hidden = !c;
    document.body.classList.toggle('chat-open', !!c);
    if (!c) { this.convId = null; return; }
    const switched = this.convId !== c.id;
    if (switched) {
      this.convId = c.id;
      this.rows.clear();
      this.timelineEl.replaceChildren();
      this.stick = true;
      this.input.value = '';
      this.autogrow();
    }
    this.renderHeader(c);
    this.renderTimeline(c);
    this.renderTyping(c);
    const canSend = c.type === 'single' || c.active;
    $('#composer').hidden = !canSend;
    $('#composer-off').hidden = canSend;
    if (switched && canSend && window.matchMedia('(pointer: fine)').matches) this.input.focus();
    // a short page that cannot scroll yet: load older pages until it can (or the start)
    if (!c.olderEnd && !c.loadingOlder && this.scroller.scrollHeight <= this.scroller.clientHeight + 150) {
      this.maybeLoadOlder();
    }
  }

  renderHeader(c) {
    const s = this.store;
    const title = s.title(c);
    setText($('#chat-title'), title);
    const slot = $('#chat-avatar');
    const key = `${c.id}|${title}`;
    if (slot.dataset.key !== key) {
      slot.replaceChildren(avatar(title, c.type === 'group' ? c.id : c.peerId, c.type === 'group' ? 'group' : ''));
      slot.dataset.key = key;
    }
    let sub;
    if (c.type === 'group') {
      const n = c.members ? c.members.length : null;
      sub = [n != null ? `${n} members` : 'group', c.role ? `you are ${c.role}` : null, c.active ? null : 'you left']
        .filter(Boolean).join(' · ');
    } else {
      sub = `user id ${c.peerId}`;
    }
    setText($('#chat-sub'), sub);
    $('#group-info-btn').hidden = c.type !== 'group';
  }

  renderTyping(c) {
    const names = [...c.typing.keys()].map((u) => this.store.plainName(u));
    let text = '';
    if (names.length === 1) text = `${names[0]} is typing…`;
    else if (names.length > 1) text = `${names.join(', ')} are typing…`;
    const el = $('#typing');
    setText(el, text);
    el.classList.toggle('on', !!text);
  }

  status(c, m) {
    if (m.state) return m.state; // local send: sending | failed
    if (c.type === 'single') {
      if (c.peerReadSeq >= m.seq) return 'read';
      if (c.peerDeliveredSeq >= m.seq) return 'delivered';
    }
    return 'sent';
  }

  items(c) {
    const out = [];
    let lastDay = null;
    let prev = null;
    for (const m of c.timeline()) {
      if (m.content_type === 'recall') continue;
      const t = m.server_time || m.created;
      const day = new Date(t).toDateString();
      if (day !== lastDay) {
        out.push({ kind: 'day', key: `day:${day}`, text: fmtDay(t) });
        lastDay = day;
        prev = null;
      }
      if (m.content_type === 'system') {
        out.push({ kind: 'system', key: `sys:${m.seq}`, m });
        prev = null;
        continue;
      }
      const first = !prev || prev.sender_id !== m.sender_id || (t - (prev.server_time || prev.created)) > 5 * 60000;
      out.push({ kind: 'msg', key: `msg:${m.sender_id}:${m.client_msg_id}`, m, first });
      prev = m;
    }
    return out;
  }

  renderTimeline(c) {
    const sc = this.scroller;
    const atBottom = sc.scrollHeight - sc.scrollTop - sc.clientHeight < 80;
    const stick = this.stick || atBottom;
    this.stick = false;
    // anchor: the first row on screen keeps its place when older rows are prepended
    let anchor = null;
    if (!stick) {
      for (const el of this.timelineEl.children) {
        if (el.offsetTop + el.offsetHeight > sc.scrollTop) { anchor = el; break; }
      }
    }
    const anchorTop = anchor ? anchor.offsetTop : 0;

    const me = this.store.me.user_id;
    const items = this.items(c);
    let lastMine = null;
    for (const it of items) if (it.kind === 'msg' && it.m.sender_id === me && !it.m.recalled) lastMine = it;
    const seen = new Set();
    let cursor = this.timelineEl.firstElementChild;
    for (const it of items) {
      seen.add(it.key);
      let el = this.rows.get(it.key);
      if (!el) {
        el = this.build(it);
        this.rows.set(it.key, el);
      }
      if (it.kind === 'msg') this.update(el, c, it, it === lastMine);
      else if (it.kind === 'system') setText(el.firstChild, describe(it.m, this.store));
      if (el !== cursor) this.timelineEl.insertBefore(el, cursor);
      else cursor = cursor.nextElementSibling;
    }
    for (const [k, el] of this.rows) if (!seen.has(k)) { el.remove(); this.rows.delete(k); }

    const older = $('#older');
    const state = c.loadingOlder ? 'loading' : c.olderEnd ? 'end' : 'more';
    setAttr(older, 'data-state', state);
    setText(older, state === 'loading' ? 'Loading older messages…' : state === 'end' ? (items.length ? 'Beginning of the conversation' : '') : '');

    if (stick) sc.scrollTop = sc.scrollHeight;
    else if (anchor && anchor.isConnected) sc.scrollTop += anchor.offsetTop - anchorTop;
  }

  build(it) {
    if (it.kind === 'day') return h('div', { class: 'day', 'data-testid': 'day' }, h('span', {}, it.text));
    if (it.kind === 'system') {
      return h('div', { class: 'notice', 'data-testid': 'system-message', 'data-seq': it.m.seq }, h('span'));
    }
    const row = h('div', { class: 'msg', 'data-testid': 'message' },
      h('div', { class: 'sender', 'data-testid': 'message-sender' }),
      h('div', { class: 'bubble-wrap' },
        h('div', { class: 'bubble' },
          h('div', { class: 'text', 'data-testid': 'message-text' }),
          h('div', { class: 'meta' },
            h('span', { class: 'time', 'data-testid': 'message-time' }),
            h('span', { class: 'tick', 'data-testid': 'msg-tick' }))),
        h('div', { class: 'msg-actions' })),
      h('div', { class: 'under' }));
    return row;
  }

  update(el, c, it, isLastMine) {
    const m = it.m;
    const s = this.store;
    const mine = m.sender_id === s.me.user_id;
    const st = mine ? this.status(c, m) : null;
    el.classList.toggle('mine', mine);
    el.classList.toggle('theirs', !mine);
    el.classList.toggle('first', it.first);
    el.classList.toggle('recalled', !!m.recalled);
    el.classList.toggle('pending', !!m.state);
    setAttr(el, 'data-seq', m.seq ?? null);
    setAttr(el, 'data-client-msg-id', m.client_msg_id);
    setAttr(el, 'data-mine', mine ? 'true' : 'false');
    setAttr(el, 'data-status', st);

    const sender = el.querySelector('.sender');
    const showSender = !mine && c.type === 'group' && it.first;
    sender.hidden = !showSender;
    if (showSender) setText(sender, cap(s.plainName(m.sender_id)));

    setText(el.querySelector('.text'), m.recalled ? 'message recalled' : describe(m, s));
    const time = el.querySelector('.time');
    setText(time, fmtTime(m.server_time || m.created));
    setAttr(time, 'title', m.seq ? `seq ${m.seq} · ${new Date(m.server_time).toLocaleString()}` : 'not sent yet');
    const tick = el.querySelector('.tick');
    tick.hidden = !mine || m.recalled;
    if (mine) {
      setText(tick, STATUS_ICON[st]);
      setAttr(tick, 'title', STATUS_TEXT[st]);
      setAttr(tick, 'data-status', st);
    }

    // hover actions: recall (mine, within the window) / retry (failed)
    const actions = el.querySelector('.msg-actions');
    const canRecall = mine && m.seq && !m.recalled && Date.now() - m.server_time < RECALL_WINDOW_MS;
    const want = m.state === 'failed' ? 'retry' : canRecall ? 'recall' : '';
    if (actions.dataset.kind !== want) {
      actions.dataset.kind = want;
      if (want === 'recall') {
        actions.replaceChildren(h('button', {
          class: 'link-btn', 'data-testid': 'recall-btn', title: 'Recall this message (within 2 minutes)',
          onclick: async () => {
            try { await this.engine.recall(c, m.seq); } catch (e) { this.toast(`Recall failed: ${e.message}`); }
          },
        }, 'Recall'));
      } else if (want === 'retry') {
        actions.replaceChildren(h('button', {
          class: 'link-btn', 'data-testid': 'retry-btn', onclick: () => this.engine.retry(c, m.client_msg_id),
        }, 'Retry'));
      } else {
        actions.replaceChildren();
      }
    }

    // under the bubble: my last message's state in words; groups: "N read"; errors
    const under = el.querySelector('.under');
    let kind = '';
    let text = '';
    if (mine && m.state === 'failed') { kind = 'error'; text = `Not sent: ${m.error || 'error'}`; }
    else if (mine && c.type === 'group' && m.seq && !m.recalled && c.receipts.get(m.seq)) {
      kind = 'receipt'; text = `${c.receipts.get(m.seq)} read`;
    } else if (mine && isLastMine) { kind = 'status'; text = STATUS_TEXT[st]; }
    const key = `${kind}|${text}`;
    if (under.dataset.key !== key) {
      under.dataset.key = key;
      if (kind === 'receipt') {
        under.replaceChildren(h('button', {
          class: 'link-btn readcount', 'data-testid': 'read-count', title: 'Who read it',
          onclick: () => this.onReceipts(c, m.seq),
        }, text));
      } else if (kind) {
        under.replaceChildren(h('span', { class: kind, 'data-testid': kind === 'status' ? 'msg-status' : 'msg-error' }, text));
      } else {
        under.replaceChildren();
      }
    }
    under.hidden = !kind;
  }
}
