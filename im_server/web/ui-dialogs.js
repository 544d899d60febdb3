// Dialogs and the group panel: add a friend, create a group, who read a message, and the
// member list (roles, add with/without history, kick, leave).

import { $, h, avatar, cap, fmtDateTime } from './dom.js';

const MUTE_MS = 60 * 60 * 1000; // the member list's "Mute" is for an hour

/**
 * The people a list names: usernames (a friend's is known here; another is looked up,
 * within the server's look-up limits), or user ids written "#42". Comma or space
 * separated; each once.
 */
async function resolvePeople(store, engine, text) {
  const ids = [];
  for (const who of new Set(String(text || '').split(/[\s,;]+/).filter(Boolean))) {
    if (/^#\d+$/.test(who)) { ids.push(Number(who.slice(1))); continue; }
    const friend = store.friends.find((f) => f.username.toLowerCase() === who.toLowerCase());
    if (friend) { ids.push(friend.user_id); continue; }
    try {
      ids.push((await engine.lookupUser(who)).user_id);
    } catch (e) {
      throw new Error(e.code === 'not_found' ? `No user is called ${who}.`
        : e.code === 'rate_limited' ? 'Too many look-ups for now; try again later.'
        : e.code === 'bad_request' ? `No username can be ${who}.` : e.message);
    }
  }
  if (ids.some((x) => !Number.isSafeInteger(x) || x <= 0)) throw new Error('A user id is a positive number, e.g. #42.');
  return [...new Set(ids)];
}

function wireClose(dlg) {
  for (const b of dlg.querySelectorAll('[data-close]')) b.addEventListener('click', () => dlg.close());
}

export class Dialogs {
  constructor(store, engine, { onOpen, toast }) {
    this.store = store;
    this.engine = engine;
    this.onOpen = onOpen;
    this.toast = toast;
    this.panelOpen = false;
    for (const d of document.querySelectorAll('dialog')) wireClose(d);

    $('#add-friend-btn').addEventListener('click', () => this.openFriend());
    $('#friend-form').addEventListener('submit', (e) => { e.preventDefault(); this.submitFriend(); });
    $('#new-group-btn').addEventListener('click', () => this.openGroup());
    $('#group-form').addEventListener('submit', (e) => { e.preventDefault(); this.submitGroup(); });
  }

  // ---- add friend ----------------------------------------------------------------
  openFriend() {
    $('#friend-id').value = '';
    $('#friend-note').value = `Hi, it's ${this.store.me.username}`;
    $('#friend-error').textContent = '';
    $('#dlg-friend').showModal();
    $('#friend-id').focus();
  }

  async submitFriend() {
    const err = $('#friend-error');
    err.textContent = '';
    const who = $('#friend-id').value.trim();
    if (!who) { err.textContent = "Enter your friend's username."; return; }
    const byId = /^#\d+$/.test(who);  // "#42": a user id, as shown under a name
    let id;
    try {
      id = byId ? Number(who.slice(1)) : (await this.engine.lookupUser(who)).user_id;
    } catch (e) {
      err.textContent = e.code === 'not_found' ? `No user is called ${who}.`
        : e.code === 'rate_limited' ? 'Too many look-ups for now; try again later.'
        : e.code === 'bad_request' ? `No username can be ${who}.` : e.message;
      return;
    }
    if (!Number.isSafeInteger(id) || id <= 0) { err.textContent = 'A user id is a positive number, e.g. #42.'; return; }
    if (id === this.store.me.user_id) { err.textContent = "That's you."; return; }
    try {
      const r = await this.engine.requestFriend(id, $('#friend-note').value.trim());
      $('#dlg-friend').close();
      if (r.accepted) { this.toast('You are now friends'); if (r.conv_id) this.onOpen(r.conv_id, { wait: true }); }
      else this.toast(`Request sent to ${byId ? this.store.plainName(id) : who}`);
    } catch (e) {
      err.textContent = e.code === 'not_found' ? `No user with id ${id}.`
        : e.code === 'conflict' ? 'You are already friends.'
        : e.code === 'rate_limited' ? 'You sent many friend requests lately. Try again later.' : e.message;
    }
  }

  // ---- new group -----------------------------------------------------------------
  openGroup() {
    $('#group-name').value = '';
    $('#group-members').value = '';
    $('#group-error').textContent = '';
    const chips = this.store.friends.map((f) => h('button', {
      type: 'button', class: 'chip', title: `add ${f.username} (#${f.user_id})`,
      onclick: () => {
        const box = $('#group-members');
        const names = box.value.split(/[\s,;]+/).filter(Boolean);
        if (!names.includes(f.username)) box.value = [...names, f.username].join(', ');
      },
    }, `+ ${f.username}`));
    $('#group-friends').replaceChildren(...(chips.length ? [h('span', { class: 'muted small' }, 'Friends: '), ...chips] : []));
    $('#dlg-group').showModal();
    $('#group-name').focus();
  }

  async submitGroup() {
    const err = $('#group-error');
    err.textContent = '';
    try {
      const name = $('#group-name').value.trim();
      if (!name) throw new Error('Give the group a name.');
      const ids = (await resolvePeople(this.store, this.engine, $('#group-members').value))
        .filter((x) => x !== this.store.me.user_id);
      const r = await this.engine.createGroup(name, ids);
      $('#dlg-group').close();
      this.toast(`Group "${name}" created`);
      this.onOpen(r.conv_id, { wait: true });
    } catch (e) {
      err.textContent = e.code === 'not_found' ? 'One of these users does not exist.' : e.message;
    }
  }

  // ---- receipts ------------------------------------------------------------------
  async showReceipts(c, seq) {
    const body = $('#receipts-body');
    body.replaceChildren(h('div', { class: 'muted' }, 'Loading…'));
    $('#dlg-receipts').showModal();
    try {
      const r = await this.engine.api.receipts(c.id, seq);
      c.receipts.set(seq, r.read_count);
      this.store.changed('receipts', c.id);
      const rows = [h('p', { class: 'strong', 'data-testid': 'receipts-summary' }, `${r.read_count} of ${r.member_count} read`)];
      if (Array.isArray(r.readers)) {
        await this.store.resolve(r.readers); // readers not known yet: their names first
        rows.push(h('ul', { class: 'people' }, r.readers.map((u) => h('li', { 'data-testid': 'reader' },
          avatar(this.store.plainName(u), u, 'sm'), h('span', {}, cap(this.store.plainName(u)))))));
        if (r.readers.length < r.read_count) rows.push(h('p', { class: 'muted small' }, `and ${r.read_count - r.readers.length} more`));
      } else {
        rows.push(h('p', { class: 'muted small' }, 'This group is large: only counts are available.'));
      }
      body.replaceChildren(...rows);
    } catch (e) {
      body.replaceChildren(h('p', { class: 'form-error' }, e.code === 'receipts_disabled' ? 'Receipts are disabled in very large groups.' : e.message));
    }
  }

  // ---- group panel ---------------------------------------------------------------
  toggleGroupPanel(force) {
    this.panelOpen = force ?? !this.panelOpen;
    const c = this.store.open;
    if (this.panelOpen && c && c.type === 'group') this.engine.loadMembers(c).catch((e) => this.toast(e.message));
    this.renderPanel();
  }

  renderPanel() {
    const panel = $('#group-panel');
    const c = this.store.open;
    const show = this.panelOpen && c && c.type === 'group';
    panel.hidden = !show;
    document.body.classList.toggle('panel-open', !!show);
    if (!show) return;
    if (panel.dataset.conv === c.id && panel.dataset.sig === this.sig(c)) return;
    panel.dataset.conv = c.id;
    panel.dataset.sig = this.sig(c);
    const me = this.store.me.user_id;
    const rank = { owner: 2, admin: 1, member: 0 };
    const myRole = c.role || (c.members || []).find((x) => x.user_id === me)?.role || 'member';
    const canManage = c.active && (myRole === 'owner' || myRole === 'admin');

    const mute = async (mem, until) => {
      try { await this.engine.api.muteMember(c.groupId, mem.user_id, until); await this.engine.loadMembers(c); } catch (e) { this.toast(e.message); }
    };
    const members = (c.members || []).map((mem) => {
      const muted = mem.muted_until != null && mem.muted_until > Date.now();
      const moderate = canManage && mem.user_id !== me && rank[mem.role] < rank[myRole];
      return h('li', { class: 'member', 'data-testid': 'member', 'data-user-id': mem.user_id },
        avatar(this.store.plainName(mem.user_id), mem.user_id, 'sm'),
        h('div', { class: 'member-text' },
          h('div', { class: 'strong', title: this.store.plainName(mem.user_id) }, mem.user_id === me ? `${this.store.me.username || this.store.plainName(me)} (you)` : this.store.plainName(mem.user_id)),
          h('div', { class: 'muted small' },
            h('span', { class: `role role-${mem.role}`, 'data-testid': 'member-role' }, mem.role), ` #${mem.user_id}`,
            muted ? h('span', { class: 'member-muted', 'data-testid': 'member-muted' }, ` · muted until ${fmtDateTime(mem.muted_until)}`) : null)),
        moderate ? h('button', {
          class: 'link-btn', 'data-testid': muted ? 'unmute-btn' : 'mute-btn',
          title: muted ? 'Let them write again' : 'Keep them from writing for an hour',
          onclick: () => mute(mem, muted ? 0 : Date.now() + MUTE_MS),
        }, muted ? 'Unmute' : 'Mute 1 h') : null,
        moderate ? h('button', {
          class: 'link-btn danger', 'data-testid': 'kick-btn', title: 'Remove from the group',
          onclick: async () => {
            if (!confirm(`Remove ${this.store.plainName(mem.user_id)} from the group?`)) return;
            try { await this.engine.api.kick(c.groupId, mem.user_id); await this.engine.loadMembers(c); } catch (e) { this.toast(e.message); }
          },
        }, 'Remove') : null);
    });

    const addForm = canManage ? h('form', {
      class: 'add-member', 'data-testid': 'add-member-form',
      onsubmit: async (e) => {
        e.preventDefault();
        const f = e.target;
        try {
          const ids = await resolvePeople(this.store, this.engine, f.elements.ids.value);
          if (!ids.length) throw new Error('Enter at least one username.');
          const r = await this.engine.api.addMembers(c.groupId, ids, f.elements.history.checked);
          f.reset();
          await this.engine.loadMembers(c).catch(() => {}); // brings the new members' names
          this.toast(r && r.added && r.added.length ? `Added ${r.added.map((u) => this.store.plainName(u)).join(', ')}` : 'Already members');
        } catch (err) { this.toast(err.code === 'not_found' ? 'Unknown user.' : err.message); }
      },
    },
    h('div', { class: 'list-title' }, 'Add members'),
    h('input', {
      name: 'ids', placeholder: 'usernames: ann, bob (or #id)', 'aria-label': 'Usernames to add',
      autocomplete: 'off', autocapitalize: 'off', spellcheck: 'false', 'data-testid': 'add-member-ids',
    }),
    h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'history', 'data-testid': 'add-member-history' }), ' share the chat history'),
    h('button', { class: 'btn small primary', 'data-testid': 'add-member-submit' }, 'Add')) : null;

    panel.replaceChildren(
      h('header', { class: 'panel-header' },
        h('div', { class: 'strong' }, c.name || 'Group'),
        h('button', { class: 'icon-btn', title: 'Close', 'aria-label': 'Close', onclick: () => this.toggleGroupPanel(false) }, '×')),
      h('div', { class: 'list-title' }, `Members${c.members ? ` · ${c.members.length}` : ''}`),
      h('ul', { class: 'people', 'data-testid': 'member-list' }, members),
      addForm,
      c.active ? h('button', {
        class: 'btn small danger wide', 'data-testid': 'leave-btn',
        onclick: async () => {
          if (!confirm('Leave this group?')) return;
          try { await this.engine.api.leave(c.groupId); this.engine.kickSync(); this.toast('You left the group'); } catch (e) { this.toast(e.message); }
        },
      }, 'Leave group') : h('p', { class: 'muted small' }, 'You are no longer a member.'));
  }

  sig(c) {
    return JSON.stringify([c.members, c.role, c.active, c.name, (c.members || []).map((m) => this.store.names.get(m.user_id) || null)]);
  }
}
