// The sidebar: who I am (and my id, to share), incoming friend requests, and the
// conversation list with unread badges and last-message previews.

import { $, h, avatar, describe, fmtListTime, setText, cap } from './dom.js';

export class ListView {
  constructor(store, engine, { onOpen, toast }) {
    this.store = store;
    this.engine = engine;
    this.onOpen = onOpen;
    this.toast = toast;
    this.items = new Map(); // conv_id -> li
    $('#me-id').addEventListener('click', () => {
      const id = String(this.store.me.user_id);
      if (navigator.clipboard) navigator.clipboard.writeText(id).then(() => this.toast(`Copied your id ${id}`), () => {});
    });
  }

  renderMe() {
    const me = this.store.me;
    if (!me) return;
    setText($('#me-name'), me.username);
    setText($('#me-id'), `my id: ${me.user_id}`);
    $('#me-id').dataset.userId = me.user_id;
    setText($('#empty-id'), String(me.user_id));
    const slot = $('#me-avatar');
    if (slot.dataset.for !== me.username) {
      slot.replaceChildren(avatar(me.username, me.user_id));
      slot.dataset.for = me.username;
    }
  }

  renderRequests() {
    const box = $('#requests');
    const incoming = this.store.requests.incoming || [];
    const outgoing = this.store.requests.outgoing || [];
    box.hidden = !incoming.length && !outgoing.length;
    const who = [...incoming.map((r) => r.from_user_id), ...outgoing.map((r) => r.to_user_id)];
    const sig = JSON.stringify([incoming, outgoing, who.map((u) => this.store.names.get(u) || null)]);
    if (box.dataset.sig === sig) return; // keep the buttons (and a click in progress)
    box.dataset.sig = sig;
    const rows = [];
    if (incoming.length) rows.push(h('div', { class: 'list-title' }, 'Friend requests ', h('span', { class: 'pill accent' }, incoming.length)));
    for (const r of incoming) {
      const name = this.store.plainName(r.from_user_id);
      rows.push(h('div', { class: 'request', 'data-testid': 'incoming-request', 'data-from': r.from_user_id },
        avatar(name, r.from_user_id, 'sm'),
        h('div', { class: 'request-text' },
          h('div', { class: 'strong', 'data-testid': 'request-from', title: `#${r.from_user_id}` }, name),
          h('div', { class: 'muted small ellipsis' }, r.note || 'wants to be your friend')),
        h('button', {
          class: 'btn small primary', 'data-testid': 'accept-request',
          onclick: async (ev) => {
            ev.target.disabled = true;
            try {
              const res = await this.engine.accept(r.request_id);
              this.toast('Friend added');
              if (res && res.conv_id) this.onOpen(res.conv_id, { wait: true });
            } catch (e) {
              ev.target.disabled = false;
              this.toast(e.message);
            }
          },
        }, 'Accept')));
    }
    for (const r of outgoing) {
      rows.push(h('div', { class: 'request outgoing', 'data-testid': 'outgoing-request' },
        h('div', { class: 'muted small' }, `Request sent to ${this.store.plainName(r.to_user_id)} · waiting`)));
    }
    box.replaceChildren(...rows);
  }

  render() {
    const list = this.store.list();
    const ul = $('#conv-list');
    $('#conv-empty').hidden = list.length > 0;
    const seen = new Set();
    list.forEach((c, i) => {
      seen.add(c.id);
      let li = this.items.get(c.id);
      if (!li) {
        li = this.build(c);
        this.items.set(c.id, li);
      }
      this.update(li, c);
      if (ul.children[i] !== li) ul.insertBefore(li, ul.children[i] || null);
    });
    for (const [id, li] of this.items) if (!seen.has(id)) { li.remove(); this.items.delete(id); }
    const total = this.store.totalUnread();
    const pill = $('#total-unread');
    pill.hidden = total === 0;
    setText(pill, String(total));
    document.title = total ? `(${total}) im-server · chat` : 'im-server · chat';
  }

  build(c) {
    const li = h('li', { class: 'conv', 'data-testid': 'conv-item', 'data-conv-id': c.id, tabindex: '0', role: 'button' },
      h('div', { class: 'conv-avatar' }),
      h('div', { class: 'conv-main' },
        h('div', { class: 'conv-top' },
          h('span', { class: 'conv-title', 'data-testid': 'conv-title' }),
          h('span', { class: 'conv-time' })),
        h('div', { class: 'conv-bottom' },
          h('span', { class: 'conv-preview', 'data-testid': 'conv-preview' }),
          h('span', { class: 'badge', 'data-testid': 'unread-badge', hidden: true }))));
    li.addEventListener('click', () => this.onOpen(c.id));
    li.addEventListener('keydown', (e) => { if (e.key === 'Enter') this.onOpen(c.id); });
    return li;
  }

  update(li, c) {
    const s = this.store;
    const title = s.title(c);
    li.classList.toggle('active', s.openId === c.id);
    li.classList.toggle('inactive', c.type === 'group' && !c.active);
    const av = li.querySelector('.conv-avatar');
    const key = `${title}|${c.type}`;
    if (av.dataset.key !== key) {
      av.replaceChildren(avatar(title, c.type === 'group' ? c.id : c.peerId, c.type === 'group' ? 'group' : ''));
      av.dataset.key = key;
    }
    setText(li.querySelector('.conv-title'), title);
    const m = c.latest;
    let preview = '';
    if (c.typing.size) {
      preview = c.type === 'group' ? `${[...c.typing.keys()].map((u) => s.plainName(u)).join(', ')} typing…` : 'typing…';
    } else if (m) {
      const text = describe(m, s);
      if (m.content_type === 'system' || m.content_type === 'recall' || m.recalled) preview = text;
      else if (m.sender_id === s.me.user_id) preview = `You: ${text}`;
      else if (c.type === 'group') preview = `${cap(s.plainName(m.sender_id))}: ${text}`;
      else preview = text;
    } else {
      preview = c.type === 'group' ? 'No messages yet' : 'No messages yet — say hello';
    }
    const prev = li.querySelector('.conv-preview');
    setText(prev, preview);
    prev.classList.toggle('is-typing', c.typing.size > 0);
    setText(li.querySelector('.conv-time'), fmtListTime(c.lastActivity));
    const badge = li.querySelector('.badge');
    const unread = c.unread;
    badge.hidden = unread === 0;
    setText(badge, unread > 99 ? '99+' : String(unread));
    li.classList.toggle('has-unread', unread > 0);
  }
}
