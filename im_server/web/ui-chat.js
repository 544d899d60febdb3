// The chat pane: header, the timeline (messages by seq, local sends after them), older
// history on scroll-up, typing line and composer. Rows are keyed and updated in place, so
// a message keeps its element from "sending" to "read". Each message has its reply quote,
// "edited" mark and reaction chips; the composer knows what it replies to or edits, and
// in groups "@" opens the member autocomplete (mentions go out as user ids). Pictures and
// files come from the paperclip, a drop on the chat or a paste; the composer's text is
// their caption.

import {
  $, h, avatar, describe, excerpt, fmtDateTime, fmtDay, fmtTime, linkify, presenceText, setAttr, setDot, setText,
  cap,
} from './dom.js';
import { Attachments } from './ui-attach.js';
import { isAttachment } from './uploads.js';
import { lastSeenSeq, showJump } from './ui-reading.js';
import { RowFocus } from './ui-rowfocus.js';

const RECALL_WINDOW_MS = 120000;
const EDIT_WINDOW_MS = 48 * 3600 * 1000;  // the server's default IM_EDIT_WINDOW_SECONDS
const PICKER = ['👍', '❤️', '😂', '😮', '😢', '🎉', '🙏', '👀', '🔥', '👏', '✅', '🤔'];
const MENTION_TOKEN = /(^|\s)@([^\s@]{0,32})$/u;
const MAX_OPTIONS = 8;
const STATUS_TEXT = { uploading: 'Uploading…', sending: 'Sending…', sent: 'Sent', delivered: 'Delivered', read: 'Read', failed: 'Not sent' };
const REVEAL_UNREAD_MAX = 500; // opened with up to this many unread: older pages are loaded down to the first
const STATUS_ICON = { uploading: '↑', sending: '◷', sent: '✓', delivered: '✓✓', read: '✓✓', failed: '!' };

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
    this.ctx = null;          // {kind: 'reply' | 'edit', seq}: what the composer is doing
    this.mention = null;      // the open autocomplete: {start, end, query, options, active}
    this.picks = new Map();   // name -> user id (or 'all') chosen in the autocomplete
    this.pickerFor = null;    // the row key whose reaction picker is open
    this.busy = new Set();    // reaction toggles in flight
    this.focus = null;        // {convId, seq}: a message to scroll to once its row is there
    this.focusTimer = null;
    this.dividerAfter = null; // the read cursor when the chat was opened with unread: "New messages" below it
    this.toDivider = false;   // scroll the divider to the top once it is rendered
    this.jumpBtn = $('#jump-latest');
    this.jumpBtn.addEventListener('click', () => this.jumpToLatest());
    this.rowFocus = new RowFocus(this.timelineEl); // the keyboard in the message list
    this.pop = $('#mention-pop');
    this.attach = new Attachments(engine, toast);
    this.wireFiles();
    $('#compose-ctx-cancel').addEventListener('click', () => this.setContext(null));
    document.addEventListener('click', (e) => {
      if (this.pickerFor && !e.target.closest('.picker, [data-testid="react-btn"]')) {
        this.pickerFor = null;
        if (this.store.open) this.render();
      }
    });
    $('#chat-close').addEventListener('click', onClose);
    $('#group-info-btn').addEventListener('click', onGroupInfo);
    // mute and pin the open conversation (my settings; my other devices follow via sync)
    for (const [sel, key] of [['#pin-btn', 'pinned'], ['#mute-btn', 'muted']]) {
      $(sel).addEventListener('click', async (ev) => {
        const c = this.store.open;
        if (!c) return;
        const btn = ev.currentTarget;
        btn.disabled = true;
        try {
          await this.engine.setSettings(c, { [key]: !c[key] });
        } catch (e) {
          this.toast(`Could not change the setting: ${e.message}`);
        } finally {
          btn.disabled = false;
        }
      });
    }
    $('#composer').addEventListener('submit', (e) => { e.preventDefault(); this.submit(); });
    this.input.addEventListener('keydown', (e) => this.onKey(e));
    this.input.addEventListener('input', () => {
      this.autogrow();
      const c = this.store.open;
      if (c && this.input.value.trim() && !(this.ctx && this.ctx.kind === 'edit')) this.engine.typing(c);
      this.updateMention();
    });
    this.input.addEventListener('click', () => this.updateMention());
    this.input.addEventListener('keyup', (e) => {
      if (e.key === 'ArrowLeft' || e.key === 'ArrowRight' || e.key === 'Home' || e.key === 'End') this.updateMention();
    });
    this.input.addEventListener('blur', () => setTimeout(() => {
      if (document.activeElement !== this.input) this.closeMention();
    }, 150));
    this.scroller.addEventListener('scroll', () => {
      this.maybeLoadOlder();
      if (this.scrollQueued) return;
      this.scrollQueued = true;
      requestAnimationFrame(() => {
        this.scrollQueued = false;
        this.engine.readOpen();
        this.renderJump();
      });
    });
    setInterval(() => { if (this.store.open) this.render(); }, 15000); // recall buttons expire
  }

  // ---- pictures and files ---------------------------------------------------------

  wireFiles() {
    const input = $('#file-input');
    $('#attach-btn').addEventListener('click', () => input.click());
    input.addEventListener('change', () => {
      const files = [...input.files];
      input.value = ''; // the same file may be picked again
      this.sendFiles(files);
    });
    const view = $('#chat-view');
    const hasFiles = (e) => !!e.dataTransfer && [...e.dataTransfer.types].includes('Files');
    let depth = 0; // dragenter/leave come for every child crossed
    view.addEventListener('dragenter', (e) => {
      if (!hasFiles(e) || !this.canSend()) return;
      e.preventDefault();
      depth += 1;
      view.classList.add('dropping');
    });
    view.addEventListener('dragover', (e) => {
      if (!hasFiles(e) || !this.canSend()) return;
      e.preventDefault();
      e.dataTransfer.dropEffect = 'copy';
    });
    view.addEventListener('dragleave', () => {
      depth = Math.max(0, depth - 1);
      if (!depth) view.classList.remove('dropping');
    });
    view.addEventListener('drop', (e) => {
      depth = 0;
      view.classList.remove('dropping');
      if (!hasFiles(e)) return;
      e.preventDefault();
      if (this.canSend()) this.sendFiles([...e.dataTransfer.files]);
    });
    // a picture (or file) pasted into the composer is sent; pasted text stays text
    this.input.addEventListener('paste', (e) => {
      const files = [...(e.clipboardData ? e.clipboardData.files : [])];
      if (!files.length) return;
      e.preventDefault();
      this.sendFiles(files);
    });
  }

  canSend() {
    const c = this.store.open;
    return !!c && (c.type === 'single' || c.active);
  }

  /** Send each file; the composer's text is the first one's caption (and its reply). */
  sendFiles(files) {
    const c = this.store.open;
    if (!c || !files.length || !this.canSend()) return;
    const editing = this.ctx && this.ctx.kind === 'edit';
    const caption = editing ? '' : this.input.value.trim();
    const replyTo = this.ctx && this.ctx.kind === 'reply' ? this.ctx.seq : null;
    if (!editing) {
      this.input.value = '';
      this.autogrow();
      this.picks.clear();
      this.setContext(null);
    }
    this.closeMention();
    this.stick = true;
    files.forEach((file, i) => {
      const extras = i === 0 && replyTo != null ? { reply_to: replyTo } : {};
      this.engine.sendAttachment(c, file, i === 0 ? caption : '', extras)
        .catch((e) => {
          this.toast(`Not sent: ${file.name || 'the file'}: ${e.message}`);
          // the caption is not lost: back in the composer, unless something was typed since
          if (i === 0 && caption && !this.input.value && this.store.open === c) {
            this.input.value = caption;
            this.autogrow();
          }
        });
    });
  }

  autogrow() {
    this.input.style.height = 'auto';
    this.input.style.height = `${Math.min(this.input.scrollHeight, 160)}px`;
  }

  onKey(e) {
    const mt = this.mention;
    if (mt && mt.options.length && !e.isComposing) {
      if (e.key === 'ArrowDown' || e.key === 'ArrowUp') {
        e.preventDefault();
        const n = mt.options.length;
        mt.active = (mt.active + (e.key === 'ArrowDown' ? 1 : n - 1)) % n;
        this.renderMention();
        return;
      }
      if (e.key === 'Enter' || e.key === 'Tab') { e.preventDefault(); this.choose(mt.options[mt.active]); return; }
      if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); this.closeMention(); return; }
    }
    if (e.key === 'Escape' && this.ctx) { e.preventDefault(); e.stopPropagation(); this.setContext(null); return; }
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.submit(); }
  }

  submit() {
    const c = this.store.open;
    const text = this.input.value.trim();
    if (!c || !text) return;
    const ctx = this.ctx;
    this.closeMention();
    if (ctx && ctx.kind === 'edit') {
      const orig = c.msgs.get(ctx.seq);
      this.setContext(null);
      if (orig && orig.content && orig.content.text === text) return; // nothing changed
      this.engine.edit(c, ctx.seq, text).catch((e) => this.toast(`Edit failed: ${e.message}`));
      return;
    }
    const extras = {};
    if (c.type === 'group') Object.assign(extras, this.mentionsIn(c, text));
    if (ctx && ctx.kind === 'reply') extras.reply_to = ctx.seq;
    this.input.value = '';
    this.autogrow();
    this.picks.clear();
    this.setContext(null);
    this.stick = true;
    this.engine.send(c, text, extras);
    this.input.focus();
  }

  // ---- reply / edit ---------------------------------------------------------------

  setContext(ctx) {
    const wasEdit = this.ctx && this.ctx.kind === 'edit';
    this.ctx = ctx;
    const c = this.store.open;
    if (ctx && ctx.kind === 'edit' && c) {
      const m = c.msgs.get(ctx.seq);
      this.input.value = (m && m.content && m.content.text) || '';
    } else if (wasEdit) {
      this.input.value = ''; // the edited text was never a draft
    }
    this.autogrow();
    this.renderContext();
    if (ctx) {
      this.input.focus();
      this.input.setSelectionRange(this.input.value.length, this.input.value.length);
    }
  }

  renderContext() {
    const box = $('#compose-ctx');
    const c = this.store.open;
    const ctx = this.ctx;
    let m = ctx && c ? c.msgs.get(ctx.seq) : null;
    if (ctx && (!m || m.recalled)) { this.ctx = null; m = null; } // recalled meanwhile
    box.hidden = !this.ctx;
    if (!this.ctx) return;
    setAttr(box, 'data-kind', this.ctx.kind);
    const who = cap(this.store.nameOf(m.sender_id));
    setText($('#compose-ctx-title'), this.ctx.kind === 'edit' ? 'Editing your message' : `Replying to ${who}`);
    setText($('#compose-ctx-body'), excerpt(describe(m, this.store)));
  }

  // ---- mentions -------------------------------------------------------------------

  canMentionAll(c) {
    return this.canModerate(c);
  }

  /** A group's owner and admins: mention all, recall anyone's message. */
  canModerate(c) {
    return c.type === 'group' && c.active && (c.role === 'owner' || c.role === 'admin');
  }

  /** Members (and "all" for owners and admins) whose name starts with, then contains, q. */
  mentionOptions(c, q) {
    const me = this.store.me.user_id;
    const ql = q.toLowerCase();
    const starts = [];
    const contains = [];
    if (this.canMentionAll(c) && 'all'.startsWith(ql)) starts.push({ id: 'all', name: 'all', label: 'everyone here' });
    for (const mem of c.members || []) {
      if (mem.user_id === me) continue;
      const name = this.store.names.get(mem.user_id);
      if (!name) { this.store.lookup(mem.user_id); continue; } // shown once its name is known
      const nl = name.toLowerCase();
      if (nl.startsWith(ql)) starts.push({ id: mem.user_id, name });
      else if (ql && nl.includes(ql)) contains.push({ id: mem.user_id, name });
    }
    const byName = (a, b) => (a.id === 'all' ? -1 : b.id === 'all' ? 1 : a.name.localeCompare(b.name));
    return [...starts.sort(byName), ...contains.sort(byName)].slice(0, MAX_OPTIONS);
  }

  updateMention() {
    const c = this.store.open;
    const el = this.input;
    if (!c || c.type !== 'group' || !c.active || (this.ctx && this.ctx.kind === 'edit')
      || el.selectionStart !== el.selectionEnd) { this.closeMention(); return; }
    const pos = el.selectionStart;
    const hit = MENTION_TOKEN.exec(el.value.slice(0, pos));
    if (!hit) { this.closeMention(); return; }
    const query = hit[2];
    // kept open while nothing matches yet: members and their names may still be loading
    const options = this.mentionOptions(c, query);
    const prev = this.mention;
    let active = 0;
    if (prev && prev.query === query) active = Math.max(0, Math.min(prev.active, options.length - 1));
    this.mention = { start: pos - query.length - 1, end: pos, query, options, active };
    this.renderMention();
  }

  renderMention() {
    const mt = this.mention;
    if (!mt || !mt.options.length) { this.pop.hidden = true; this.pop.replaceChildren(); return; }
    const sig = JSON.stringify([mt.options, mt.active]);
    if (!this.pop.hidden && this.pop.dataset.sig === sig) return;
    this.pop.dataset.sig = sig;
    this.pop.replaceChildren(...mt.options.map((o, i) => h('li', {
      class: `mention-option${i === mt.active ? ' active' : ''}`, role: 'option', 'aria-selected': i === mt.active ? 'true' : 'false',
      'data-testid': 'mention-option', 'data-user-id': o.id,
      onmousedown: (e) => { e.preventDefault(); this.choose(o); },
    },
    o.id === 'all' ? h('div', { class: 'avatar sm group', 'aria-hidden': 'true' }, '@') : avatar(o.name, o.id, 'sm'),
    h('span', { class: 'strong' }, `@${o.name}`),
    o.label ? h('span', { class: 'muted small' }, o.label) : null)));
    this.pop.hidden = false;
  }

  closeMention() {
    if (!this.mention && this.pop.hidden) return;
    this.mention = null;
    this.pop.hidden = true;
    this.pop.replaceChildren();
  }

  choose(o) {
    const mt = this.mention;
    if (!mt) return;
    const v = this.input.value;
    const ins = `@${o.name} `;
    this.input.value = v.slice(0, mt.start) + ins + v.slice(mt.end);
    const caret = mt.start + ins.length;
    this.input.setSelectionRange(caret, caret);
    this.picks.set(o.name, o.id);
    this.closeMention();
    this.autogrow();
    this.input.focus();
  }

  /** The members the text names with "@name" (chosen or typed in full), and "@all". */
  mentionsIn(c, text) {
    const me = this.store.me.user_id;
    const byName = new Map();
    for (const mem of c.members || []) {
      const n = this.store.names.get(mem.user_id);
      if (n) byName.set(n, mem.user_id);
    }
    for (const [name, id] of this.picks) if (id !== 'all' && !byName.has(name)) byName.set(name, id);
    const ids = new Set();
    let all = false;
    for (const hit of text.matchAll(/(?:^|\s)@([^\s@]+)/gu)) {
      for (const tok of [hit[1], hit[1].replace(/[.,!?;:)\]]+$/u, '')]) {
        if (tok === 'all' && this.canMentionAll(c)) { all = true; break; }
        const id = byName.get(tok);
        if (id != null && id !== me) { ids.add(id); break; }
      }
    }
    return { mentions: [...ids], mention_all: all };
  }

  // ---- reactions ------------------------------------------------------------------

  /** Close the reaction picker if one is open; whether one was. */
  closePicker() {
    if (!this.pickerFor) return false;
    const row = this.rows.get(this.pickerFor);
    this.pickerFor = null;
    this.render();
    // the keyboard goes back to where the picker was opened from
    const back = row && row.querySelector('[data-testid="react-btn"]');
    if (back) {
      row.focus(); // the row's actions show while it has the focus: the button can take it
      back.focus();
    }
    return true;
  }

  async toggleReaction(c, m, emoji, on) {
    const key = `${c.id}|${m.seq}|${emoji}`;
    if (this.busy.has(key)) return;
    this.busy.add(key);
    try {
      await this.engine.react(c, m.seq, emoji, on);
    } catch (e) {
      this.toast(`Reaction not ${on ? 'added' : 'removed'}: ${e.message}`);
    } finally {
      this.busy.delete(key);
    }
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

  /** Scroll to a message and highlight it briefly, as soon as its row is rendered. */
  focusOn(convId, seq) {
    this.focus = convId && Number.isInteger(seq) ? { convId, seq } : null;
    if (this.focus && this.store.open) this.render();
  }

  showFocus(c) {
    if (!this.focus || this.focus.convId !== c.id) return;
    const row = this.timelineEl.querySelector(`.msg[data-seq="${this.focus.seq}"]`);
    if (!row) return;
    this.focus = null;
    for (const el of this.timelineEl.querySelectorAll('.msg.found')) el.classList.remove('found');
    row.scrollIntoView({ block: 'center' });
    row.classList.add('found');
    clearTimeout(this.focusTimer);
    this.focusTimer = setTimeout(() => row.classList.remove('found'), 4000);
  }

  render() {
    const c = this.store.open;
    $('#chat-empty').hidden = !!c;
    $('#chat-view').hidden = !c;
    document.body.classList.toggle('chat-open', !!c);
    if (!c) { this.convId = null; return; }
    const switched = this.convId !== c.id;
    if (switched) {
      if (this.focus && this.focus.convId !== c.id) this.focus = null;
      this.convId = c.id;
      this.rows.clear();
      this.timelineEl.replaceChildren();
      // opened with unread messages: at the first of them, under a "New messages" line
      this.rowFocus.reset();
      this.dividerAfter = c.hasUnreadFromOthers() ? c.readSeq : null;
      this.revealing = false;
      this.toDivider = this.dividerAfter != null;
      this.stick = !this.toDivider;
      if (this.toDivider) this.revealFirstUnread(c);
      this.input.value = '';
      this.ctx = null;
      this.picks.clear();
      this.pickerFor = null;
      this.closeMention();
      this.autogrow();
    }
    this.renderHeader(c);
    this.renderTimeline(c);
    this.renderJump();
    if (switched) queueMicrotask(() => this.engine.readOpen()); // what the new chat shows
    this.renderTyping(c);
    this.renderContext();
    // an open "@" list follows members and names that arrive meanwhile
    if (this.mention && document.activeElement === this.input) this.updateMention();
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
    const p = c.type === 'single' ? s.presence.get(c.peerId) : null;
    const ptext = presenceText(p);
    const pel = $('#chat-presence');
    setText(pel, ptext);
    pel.hidden = !ptext;
    setAttr(pel, 'data-online', ptext ? String(!!p.online) : null);
    setDot($('#chat-dot'), p);
    $('#group-info-btn').hidden = c.type !== 'group';
    for (const [sel, on, yes, no] of [['#pin-btn', c.pinned, 'Unpin', 'Pin'], ['#mute-btn', c.muted, 'Unmute', 'Mute']]) {
      const btn = $(sel);
      setText(btn, on ? yes : no);
      setAttr(btn, 'aria-pressed', String(on));
    }
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
    let divider = this.dividerAfter != null;
    let lastDay = null;
    let prev = null;
    for (const m of c.timeline()) {
      if (m.content_type === 'recall' || m.content_type === 'edit' || m.content_type === 'reaction') continue;
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
      if (divider && m.seq > this.dividerAfter && m.sender_id !== this.store.me.user_id) {
        out.push({ kind: 'new', key: 'new-divider' });
        divider = false;
        prev = null;
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
    // anchor: the first row on screen keeps its place when older rows are prepended (a
    // day line is no anchor: the same day's older rows are inserted below it)
    let anchor = null;
    if (!stick) {
      for (const el of this.timelineEl.children) {
        if (el.classList.contains('day')) continue;
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

    this.rowFocus.rendered();
    const line = this.toDivider && !this.revealing && this.rows.get('new-divider');
    if (line) {
      sc.scrollTop = Math.max(0, line.offsetTop - 8);
      this.toDivider = false;
    } else if (stick) sc.scrollTop = sc.scrollHeight;
    else if (anchor && anchor.isConnected) sc.scrollTop += anchor.offsetTop - anchorTop;
    this.showFocus(c);
  }

  /** The highest seq on screen in this chat, for marking read (``lastSeenSeq``); 0
   * while another chat (or none) is rendered, or while it goes to its first unread. */
  seenUpTo(c) {
    // not this chat, or still going to its first unread: nothing counts as seen yet
    if (this.convId !== c.id || $('#chat-view').hidden || this.toDivider || this.revealing) return 0;
    return lastSeenSeq(this.scroller, this.timelineEl);
  }

  /** Load older pages down to the first unread message, then place it under the line. */
  async revealFirstUnread(c) {
    const first = this.dividerAfter + 1;
    this.revealing = true;
    try {
      if (c.unread <= REVEAL_UNREAD_MAX) await this.engine.reveal(c, first);
    } catch { /* offline: the line goes where the held messages allow */ }
    if (this.store.open === c && this.dividerAfter === first - 1) {
      this.revealing = false;
      this.render();
      this.toDivider = false; // placed, or not to be had: reading may start
      this.engine.readOpen();
      this.renderJump();
    }
  }

  /** The button to the newest message: shown while scrolled up, with the unread count. */
  renderJump() {
    const c = this.store.open;
    showJump(this.jumpBtn, this.scroller, $('#chat-view'), c ? c.unread : null);
  }

  jumpToLatest() {
    this.toDivider = false;
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.engine.readOpen();
    this.renderJump();
    this.input.focus();
  }

  build(it) {
    if (it.kind === 'new') {
      return h('div', { class: 'new-divider', 'data-testid': 'new-divider', role: 'separator' }, h('span', {}, 'New messages'));
    }
    if (it.kind === 'day') return h('div', { class: 'day', 'data-testid': 'day' }, h('span', {}, it.text));
    if (it.kind === 'system') {
      return h('div', { class: 'notice', 'data-testid': 'system-message', 'data-seq': it.m.seq }, h('span'));
    }
    const row = h('div', { class: 'msg', 'data-testid': 'message', tabindex: '-1' },
      h('div', { class: 'sender', 'data-testid': 'message-sender' }),
      h('div', { class: 'bubble-wrap' },
        h('div', { class: 'bubble' },
          h('button', { type: 'button', class: 'quote', 'data-testid': 'reply-quote', hidden: true },
            h('span', { class: 'quote-sender', 'data-testid': 'quote-sender' }),
            h('span', { class: 'quote-text', 'data-testid': 'quote-text' })),
          h('div', { class: 'attachment', 'data-testid': 'attachment', hidden: true }),
          h('div', { class: 'text', 'data-testid': 'message-text' }),
          h('div', { class: 'meta' },
            h('span', { class: 'edited', 'data-testid': 'message-edited', hidden: true }, 'edited'),
            h('span', { class: 'time', 'data-testid': 'message-time' }),
            h('span', { class: 'tick', 'data-testid': 'msg-tick' }))),
        h('div', { class: 'msg-actions' })),
      h('div', { class: 'reactions', 'data-testid': 'reactions', hidden: true }),
      h('div', { class: 'picker', 'data-testid': 'reaction-picker', hidden: true }),
      h('div', { class: 'under' }));
    row.querySelector('.quote').addEventListener('click', () => {
      const seq = row.querySelector('.quote').dataset.seq;
      const target = seq && this.timelineEl.querySelector(`[data-testid="message"][data-seq="${seq}"]`);
      if (!target) return;
      target.scrollIntoView({ block: 'center', behavior: 'smooth' });
      target.classList.remove('flash');
      void target.offsetWidth; // restart the animation
      target.classList.add('flash');
    });
    return row;
  }

  actionButton(kind, c, m, key) {
    switch (kind) {
      case 'reply':
        return h('button', {
          class: 'link-btn', 'data-testid': 'reply-btn', title: 'Reply to this message',
          onclick: () => this.setContext({ kind: 'reply', seq: m.seq }),
        }, 'Reply');
      case 'react':
        return h('button', {
          class: 'link-btn', 'data-testid': 'react-btn', title: 'Add a reaction', 'aria-label': 'Add a reaction',
          onclick: (e) => {
            this.pickerFor = this.pickerFor === key ? null : key;
            this.render();
            const picker = e.target.closest('.msg').querySelector('.picker');
            if (!picker.hidden) {
              picker.scrollIntoView({ block: 'nearest' });
              if (e.detail === 0) picker.querySelector('button').focus(); // opened by the keyboard
            }
          },
        }, '☺+');
      case 'edit':
        return h('button', {
          class: 'link-btn', 'data-testid': 'edit-btn', title: 'Edit this message',
          onclick: () => this.setContext({ kind: 'edit', seq: m.seq }),
        }, 'Edit');
      case 'recall':
        return h('button', {
          class: 'link-btn', 'data-testid': 'recall-btn',
          title: m.sender_id === this.store.me.user_id ? 'Recall this message' : 'Recall this message (as a moderator)',
          onclick: async () => {
            try { await this.engine.recall(c, m.seq); } catch (e) { this.toast(`Recall failed: ${e.message}`); }
          },
        }, 'Recall');
      default:
        return h('button', {
          class: 'link-btn', 'data-testid': 'retry-btn', onclick: () => this.engine.retry(c, m.client_msg_id),
        }, 'Retry');
    }
  }

  /**
   * The message text, with the "@name" of each member it mentions (and "@all") marked;
   * built from text nodes, never from markup.
   */
  renderText(el, m, body) {
    const names = new Map(); // "name" -> does it mention me (in someone else's message)
    if (!m.recalled && m.content_type === 'text') {
      const me = this.store.me.user_id;
      const theirs = m.sender_id !== me;
      for (const u of m.mentions || []) {
        const n = this.store.names.get(u);
        if (n) names.set(n, theirs && u === me);
      }
      if (m.mention_all) names.set('all', theirs);
    }
    const key = JSON.stringify([body, [...names]]);
    if (el.dataset.key === key) return;
    el.dataset.key = key;
    if (!names.size) { el.replaceChildren(...linkify(body)); return; }
    const parts = [];
    let last = 0;
    for (const hit of body.matchAll(/(^|\s)@([^\s@]+)/gu)) {
      const tok = names.has(hit[2]) ? hit[2] : hit[2].replace(/[.,!?;:)\]]+$/u, '');
      if (!names.has(tok)) continue;
      const at = hit.index + hit[1].length;
      if (at > last) parts.push(...linkify(body.slice(last, at)));
      parts.push(h('span', { class: `mention-token${names.get(tok) ? ' to-me' : ''}` }, `@${tok}`));
      last = at + tok.length + 1;
    }
    if (last < body.length) parts.push(...linkify(body.slice(last)));
    el.replaceChildren(...parts);
  }

  /** The quote of the message replied to: its sender and a short text, or "unavailable". */
  updateQuote(el, c, m) {
    const quote = el.querySelector('.quote');
    if (m.reply_to == null || m.recalled) { quote.hidden = true; return; }
    const q = this.engine.quote(c, m.reply_to);
    let who = '';
    let text = 'message unavailable';
    if (q.state === 'ok') {
      who = cap(this.store.nameOf(q.m.sender_id));
      text = excerpt(describe(q.m, this.store));
    } else if (q.state === 'loading') {
      text = '…';
    }
    setAttr(quote, 'data-state', q.state);
    setAttr(quote, 'data-seq', String(m.reply_to));
    setAttr(quote, 'title', q.state === 'ok' ? 'Show the original' : null);
    const sender = quote.querySelector('.quote-sender');
    setText(sender, who);
    sender.hidden = !who;
    setText(quote.querySelector('.quote-text'), text);
    quote.hidden = false;
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

    const mentioned = c.mentionsMe(m);
    el.classList.toggle('mentioned', mentioned);
    setAttr(el, 'data-mentioned', mentioned ? 'true' : null);
    this.updateQuote(el, c, m);
    // a picture or file: its bubble, the caption (if any) as the text under it
    this.attach.update(el.querySelector('.attachment'), m);
    const attached = isAttachment(m);
    el.classList.toggle('has-attachment', attached);
    const body = m.recalled ? 'message recalled' : attached ? (m.content.caption || '') : describe(m, s);
    const textEl = el.querySelector('.text');
    this.renderText(textEl, m, body);
    textEl.hidden = !body;
    const edited = el.querySelector('.edited');
    edited.hidden = !m.edited_at || !!m.recalled;
    setAttr(edited, 'title', m.edited_at ? `edited ${fmtDateTime(m.edited_at)}` : null);
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

    // hover actions: reply, react, edit (mine, text, within the window), recall (mine,
    // within its window; any message, at any age, for a group's owner and admins) / retry
    const actions = el.querySelector('.msg-actions');
    const live = !!m.seq && !m.recalled && (c.type === 'single' || c.active);
    const canRecall = live && (this.canModerate(c) || (mine && Date.now() - m.server_time < RECALL_WINDOW_MS));
    const canEdit = mine && live && m.content_type === 'text' && Date.now() - m.server_time < EDIT_WINDOW_MS;
    const want = m.state === 'failed' ? ['retry']
      : live ? ['reply', 'react', canEdit ? 'edit' : null, canRecall ? 'recall' : null].filter(Boolean) : [];
    if (actions.dataset.kind !== want.join(' ')) {
      actions.dataset.kind = want.join(' ');
      actions.replaceChildren(...want.map((kind) => this.actionButton(kind, c, m, it.key)));
    }

    // reaction chips (mine highlighted; a click toggles mine) and the picker
    const reactions = m.recalled ? [] : (m.reactions || []);
    const rbox = el.querySelector('.reactions');
    const rsig = JSON.stringify(reactions);
    if (rbox.dataset.sig !== rsig) {
      rbox.dataset.sig = rsig;
      rbox.replaceChildren(...reactions.map((r) => h('button', {
        type: 'button', class: `reaction-chip${r.mine ? ' mine' : ''}`, 'data-testid': 'reaction-chip',
        'data-emoji': r.emoji, 'data-mine': r.mine ? 'true' : 'false', 'aria-pressed': r.mine ? 'true' : 'false',
        title: r.mine ? 'You reacted: click to take it back' : `React with ${r.emoji}`,
        onclick: () => this.toggleReaction(c, m, r.emoji, !r.mine),
      }, h('span', { class: 'emoji' }, r.emoji), h('span', { class: 'count', 'data-testid': 'reaction-count' }, String(r.count)))));
    }
    rbox.hidden = !reactions.length;
    const picker = el.querySelector('.picker');
    const open = this.pickerFor === it.key && live;
    if (open && !picker.childElementCount) {
      picker.replaceChildren(...PICKER.map((emoji) => h('button', {
        type: 'button', class: 'picker-emoji', 'data-testid': 'picker-emoji', 'data-emoji': emoji, title: emoji,
        onclick: (e) => {
          const keyboard = e.detail === 0;
          this.pickerFor = null;
          this.render();
          if (keyboard) el.focus(); // the keyboard goes back to the message
          this.toggleReaction(c, m, emoji, true);
        },
      }, emoji)));
    } else if (!open && picker.childElementCount) {
      picker.replaceChildren();
    }
    picker.hidden = !open;

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
