// The sidebar: who I am (and my id, to share), incoming friend requests, and the
// conversation list with unread badges ("@" while a message mentions me), last-message
// previews, the peer's online dot in single chats, pinned first and a muted icon (a muted
// conversation's count is dimmed; its "@" still shows).

import { $, h, avatar, describe, fmtListTime, presenceText, setAttr, setDot, setText, cap } from './dom.js';

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
        h('div', { class: 'request-actions' },
          this.requestButton('primary', 'accept-request', 'Accept', `Accept ${name}'s friend request`, async () => {
            const res = await this.engine.accept(r.request_id);
            this.toast('Friend added');
            if (res && res.conv_id) this.onOpen(res.conv_id, { wait: true });
          }),
          this.requestButton('', 'decline-request', 'Decline', `Decline ${name}'s friend request`, async () => {
            await this.engine.declineRequest(r.request_id);
            this.toast('Request declined');
          }),
          this.requestButton('danger', 'block-requester', 'Block', `Block ${name}`, async () => {
            if (!confirm(`Block ${name}? They will not be able to message you or ask again.`)) return false;
            await this.engine.block(r.from_user_id);
            this.toast(`${name} is blocked`);
          }))));
    }
    for (const r of outgoing) {
      const name = this.store.plainName(r.to_user_id);
      rows.push(h('div', { class: 'request outgoing', 'data-testid': 'outgoing-request', 'data-to': r.to_user_id },
        h('div', { class: 'muted small request-text' }, `Request sent to ${name} · waiting`),
        this.requestButton('', 'cancel-request', 'Cancel', `Cancel the friend request to ${name}`, async () => {
          await this.engine.cancelRequest(r.request_id);
          this.toast('Request cancelled');
        })));
    }
    box.replaceChildren(...rows);
  }

  /** A button of a friend request: disabled while its call runs; an error is a toast. */
  requestButton(kind, testId, label, ariaLabel, act) {
    return h('button', {
      type: 'button', class: `btn small ${kind}`.trim(), 'data-testid': testId, 'aria-label': ariaLabel,
      onclick: async (ev) => {
        const btn = ev.currentTarget;
        btn.disabled = true;
        try {
          if (await act() === false) btn.disabled = false; // not confirmed
        } catch (e) {
          btn.disabled = false;
          this.toast(e.message);
        }
      },
    }, label);
  }

  /** Friends, online first, each with its dot; a click opens the chat. */
  renderFriends() {
    const s = this.store;
    const box = $('#friends');
    const friends = s.friends || [];
    box.hidden = !friends.length;
    const online = (f) => !!(s.presence.get(f.user_id) || {}).online;
    const sorted = [...friends].sort((a, b) => (online(b) - online(a)) || a.username.localeCompare(b.username));
    // the words go in the signature: "last seen 5 min ago" ages
    const sig = JSON.stringify(sorted.map((f) => [f.user_id, f.username, f.conv_id, presenceText(s.presence.get(f.user_id))]));
    if (box.dataset.sig === sig) return;
    box.dataset.sig = sig;
    const n = friends.filter(online).length;
    setText($('#friends-online'), n ? `· ${n} online` : '');
    $('#friend-list').replaceChildren(...sorted.map((f) => {
      const dot = h('span', { class: 'presence-dot', 'data-testid': 'presence-dot' });
      setDot(dot, s.presence.get(f.user_id));
      return h('li', {},
        h('button', {
          type: 'button', class: 'friend', 'data-testid': 'friend', 'data-user-id': f.user_id, title: f.username,
          onclick: () => { if (f.conv_id) this.onOpen(f.conv_id, { wait: true }); },
        },
        h('span', { class: 'av-wrap' }, avatar(f.username, f.user_id, 'sm'), dot),
        h('span', { class: 'friend-name ellipsis' }, f.username)));
    }));
  }

  render() {
    this.renderFriends();
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
    // the badge (as GET /v1/unread): muted conversations count only their mentions
    const badge = this.store.badge();
    const pill = $('#total-unread');
    pill.hidden = badge === 0;
    setText(pill, String(badge));
    document.title = badge ? `(${badge}) im-server · chat` : 'im-server · chat';
  }

  build(c) {
    const li = h('li', { class: 'conv', 'data-testid': 'conv-item', 'data-conv-id': c.id, tabindex: '0', role: 'option', 'aria-selected': 'false' },
      h('div', { class: 'conv-avatar' }),
      h('div', { class: 'conv-main' },
        h('div', { class: 'conv-top' },
          h('span', { class: 'conv-title', 'data-testid': 'conv-title' }),
          h('span', { class: 'conv-flag pinned-flag', 'data-testid': 'pinned-icon', role: 'img', title: 'Pinned', 'aria-label': 'Pinned', hidden: true }),
          h('span', { class: 'conv-flag muted-flag', 'data-testid': 'muted-icon', role: 'img', title: 'Muted', 'aria-label': 'Muted', hidden: true }),
          h('span', { class: 'conv-time' })),
        h('div', { class: 'conv-bottom' },
          h('span', { class: 'conv-preview', 'data-testid': 'conv-preview' }),
          h('span', { class: 'badge mention', 'data-testid': 'mention-badge', title: 'You were mentioned', hidden: true }, '@'),
          h('span', { class: 'badge', 'data-testid': 'unread-badge', hidden: true }))));
    li.dot = h('span', { class: 'presence-dot', 'data-testid': 'presence-dot', hidden: true });
    li.addEventListener('click', () => this.onOpen(c.id));
    li.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); this.onOpen(c.id); }
    });
    return li;
  }

  update(li, c) {
    const s = this.store;
    const title = s.title(c);
    li.classList.toggle('active', s.openId === c.id);
    setAttr(li, 'aria-selected', String(s.openId === c.id));
    li.classList.toggle('inactive', c.type === 'group' && !c.active);
    const av = li.querySelector('.conv-avatar');
    const key = `${title}|${c.type}`;
    if (av.dataset.key !== key) {
      av.replaceChildren(avatar(title, c.type === 'group' ? c.id : c.peerId, c.type === 'group' ? 'group' : ''), li.dot);
      av.dataset.key = key;
    }
    setDot(li.dot, c.type === 'single' ? s.presence.get(c.peerId) : null);
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
    const badge = li.querySelector('[data-testid="unread-badge"]');
    const unread = c.unread;
    const mentionBadge = li.querySelector('.badge.mention');
    const mentions = unread > 0 ? c.mentionUnread : 0;
    mentionBadge.hidden = mentions === 0;
    mentionBadge.setAttribute('title', mentions === 1 ? 'You were mentioned' : `You were mentioned ${mentions} times`);
    badge.hidden = unread === 0;
    setText(badge, unread > 99 ? '99+' : String(unread));
    li.classList.toggle('has-unread', unread > 0);
    li.classList.toggle('is-muted', c.muted);
    li.dataset.muted = String(c.muted);
    li.dataset.pinned = String(c.pinned);
    li.querySelector('[data-testid="muted-icon"]').hidden = !c.muted;
    li.querySelector('[data-testid="pinned-icon"]').hidden = !c.pinned;
  }
}
