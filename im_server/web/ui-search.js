// Message search in the sidebar: the box (searched after a pause in typing, or at once
// on Enter), the results newest first (conversation, sender, time, and a snippet with
// the words searched marked, built from text nodes), "More results" for the next page,
// and × or Escape to close it. A click on a result opens its conversation at that
// message.

import { $, h, cap, describe, fmtListTime, timeEl } from './dom.js';

const DEBOUNCE_MS = 300;
const SNIPPET = 110;          // characters of text around the first match
const BEFORE = 30;            // of them, before it

/** The words of a query, as the results are marked with them (longest first). */
function terms(q) {
  return [...new Set(q.split(/[\s\p{P}\p{S}]+/u).filter(Boolean))].sort((a, b) => b.length - a.length);
}

function matcher(words) {
  if (!words.length) return null;
  const esc = words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  return new RegExp(esc.join('|'), 'giu');
}

/** A one-line piece of the text around its first match, the matches in <mark>. */
export function snippet(text, words) {
  const one = String(text || '').replace(/\s+/g, ' ').trim();
  const re = matcher(words);
  let start = 0;
  if (re) {
    re.lastIndex = 0;
    const first = re.exec(one);
    if (first && first.index > BEFORE) {
      start = first.index - BEFORE;
      const space = one.lastIndexOf(' ', first.index - 1);
      if (space >= start && space < first.index) start = space + 1; // start at a word
      if (/[\uDC00-\uDFFF]/.test(one[start] || '')) start -= 1;     // not inside a pair
    }
  }
  let end = Math.min(one.length, start + SNIPPET);
  if (/[\uDC00-\uDFFF]/.test(one[end] || '')) end += 1;
  const piece = one.slice(start, end);
  const parts = [];
  if (start > 0) parts.push('…');
  let last = 0;
  if (re) {
    re.lastIndex = 0;
    for (const hit of piece.matchAll(re)) {
      if (!hit[0]) continue;
      if (hit.index > last) parts.push(piece.slice(last, hit.index));
      parts.push(h('mark', { class: 'hit' }, hit[0]));
      last = hit.index + hit[0].length;
    }
  }
  if (last < piece.length) parts.push(piece.slice(last));
  if (end < one.length) parts.push('…');
  return parts;
}

export class SearchView {
  constructor(store, engine, { onJump, toast }) {
    this.store = store;
    this.engine = engine;
    this.onJump = onJump;
    this.toast = toast;
    this.input = $('#search-input');
    this.box = $('#search-results');
    this.list = $('#search-list');
    this.more = $('#search-more');
    this.state = null;       // {q, results, next, loading, error, picked}
    this.timer = null;
    this.abort = null;
    this.run = 0;            // answers of an older query are dropped
    this.input.addEventListener('input', () => {
      clearTimeout(this.timer);
      $('#search-clear').hidden = !this.input.value;
      if (!this.input.value.trim()) { this.close(false); return; }
      this.timer = setTimeout(() => this.search(), DEBOUNCE_MS);
    });
    this.input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.isComposing) {
        e.preventDefault();
        clearTimeout(this.timer);
        if (this.input.value.trim()) this.search();
      } else if (e.key === 'Escape' && (this.input.value || this.state)) {
        e.preventDefault();
        e.stopPropagation(); // not the open chat's Escape
        this.close(true);
      }
    });
    $('#search-form').addEventListener('submit', (e) => e.preventDefault());
    $('#search-clear').addEventListener('click', () => { this.close(true); this.input.focus(); });
    this.more.addEventListener('click', () => this.loadMore());
  }

  /** Forget the search: the box emptied, the chat list back. */
  close(clearBox) {
    clearTimeout(this.timer);
    if (this.abort) this.abort.abort();
    this.abort = null;
    this.run += 1;
    this.state = null;
    if (clearBox) this.input.value = '';
    $('#search-clear').hidden = !this.input.value;
    this.render();
  }

  async search() {
    const q = this.input.value.trim();
    if (!q) return;
    if (this.state && this.state.q === q && this.state.loading) return; // on its way already
    this.state = { q, words: terms(q), results: [], next: null, loading: true, error: null, picked: null };
    this.render();
    await this.fetchPage(null);
  }

  loadMore() {
    const st = this.state;
    if (!st || !st.next || st.loading) return;
    st.loading = true;
    this.render();
    this.fetchPage(st.next);
  }

  async fetchPage(before) {
    const st = this.state;
    if (this.abort) this.abort.abort();
    const ctrl = new AbortController();
    this.abort = ctrl;
    const run = ++this.run;
    try {
      const page = await this.engine.search(st.q, { before, signal: ctrl.signal });
      if (run !== this.run) return;
      const seen = new Set(st.results.map((m) => `${m.conv_id}|${m.seq}`));
      for (const m of page.results) if (!seen.has(`${m.conv_id}|${m.seq}`)) st.results.push(m);
      st.next = page.next;
      st.error = null;
    } catch (e) {
      if (run !== this.run || e.name === 'AbortError') return;
      st.error = e.message;
    } finally {
      if (run === this.run) {
        st.loading = false;
        if (this.abort === ctrl) this.abort = null;
        this.render();
      }
    }
  }

  render() {
    const st = this.state;
    const sidebar = $('.sidebar');
    sidebar.classList.toggle('searching', !!st);
    this.box.hidden = !st;
    if (!st) { this.list.replaceChildren(); this.list.dataset.sig = ''; return; }
    const status = $('#search-status');
    let text = '';
    let kind = '';
    if (st.error) { text = `Search failed: ${st.error}`; kind = 'error'; }
    else if (st.loading && !st.results.length) { text = 'Searching…'; kind = 'loading'; }
    else if (!st.results.length) { text = `No messages found for “${st.q}”`; kind = 'empty'; }
    status.textContent = text;
    status.hidden = !text;
    status.dataset.state = kind;
    this.more.hidden = !st.next || (!!st.error && !st.results.length);
    this.more.disabled = st.loading;
    this.more.textContent = st.loading && st.results.length ? 'Loading…' : 'More results';
    // rebuilt when the results, the names in them or the pick change
    const s = this.store;
    const sig = JSON.stringify([st.q, st.picked, st.results.map((m) => [
      m.conv_id, m.seq, s.names.get(m.sender_id) || null, s.convs.get(m.conv_id)?.name || null,
    ])]);
    if (this.list.dataset.sig === sig) return;
    this.list.dataset.sig = sig;
    this.list.replaceChildren(...st.results.map((m) => this.item(m, st)));
  }

  item(m, st) {
    const s = this.store;
    const c = s.conv(m.conv_id, false);
    const title = c ? s.title(c) : m.conv_id;
    const key = `${m.conv_id}|${m.seq}`;
    const who = cap(s.nameOf(m.sender_id));
    return h('li', {},
      h('button', {
        type: 'button', class: `search-hit${st.picked === key ? ' active' : ''}`, 'data-testid': 'search-result',
        'data-conv-id': m.conv_id, 'data-seq': m.seq,
        onclick: () => {
          st.picked = key;
          this.render();
          this.onJump(m.conv_id, m.seq);
        },
      },
      h('div', { class: 'search-top' },
        h('span', { class: 'search-conv ellipsis', 'data-testid': 'search-result-conv' }, title),
        h('span', { class: 'search-time' }, timeEl(m.server_time, fmtListTime(m.server_time)))),
      h('div', { class: 'search-snippet', 'data-testid': 'search-result-text' },
        h('span', { class: 'search-sender', 'data-testid': 'search-result-sender' }, who),
        ': ',
        snippet(describe(m, s), st.words))));
  }
}
