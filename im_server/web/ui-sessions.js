// Devices & security: my sessions (log out one device, or every device) and the
// password change, which logs out every other device.

import { $, h, fmtAgo, fmtDateTime, timeEl } from './dom.js';

const PASSWORD_MIN = 8;
const PASSWORD_MAX = 256;

function byRecent(a, b) {
  return (b.current - a.current) || (b.last_used_at - a.last_used_at);
}

function passwordProblem(old, next, again) {
  const length = [...next].length; // the server counts characters, not UTF-16 units
  if (!old) return 'Enter your current password.';
  if (length < PASSWORD_MIN) return `The new password needs at least ${PASSWORD_MIN} characters.`;
  if (length > PASSWORD_MAX) return `The new password can have at most ${PASSWORD_MAX} characters.`;
  if (next !== again) return 'The new passwords do not match.';
  return '';
}

function passwordError(e) {
  if (e.status === 401) return 'Your current password is wrong.';
  if (e.code === 'rate_limited') return 'Too many wrong passwords. Wait a few minutes and try again.';
  if (e.code === 'conflict') return 'Your password was changed meanwhile. Try again.';
  return e.message;
}

export class SessionsDialog {
  constructor(store, api, { onLoggedOut }) {
    this.store = store;
    this.api = api;
    this.onLoggedOut = onLoggedOut; // this device's session is gone
    this.loads = 0;
    $('#sessions-btn').addEventListener('click', () => this.open());
    $('#logout-all-btn').addEventListener('click', () => this.logoutEverywhere());
    $('#password-form').addEventListener('submit', (e) => { e.preventDefault(); this.changePassword(); });
    $('#delete-form').addEventListener('submit', (e) => { e.preventDefault(); this.deleteAccount(); });
  }

  open() {
    $('#pw-username').defaultValue = this.store.me.username; // for password managers
    $('#password-form').reset();
    $('#delete-form').reset();
    $('#delete-error').textContent = '';
    $('#password-error').textContent = '';
    $('#password-ok').textContent = '';
    $('#sessions-error').textContent = '';
    $('#session-list').replaceChildren(h('li', { class: 'muted small' }, 'Loading…'));
    $('#dlg-sessions').showModal();
    this.load();
  }

  async load() {
    const n = ++this.loads; // only the latest answer is shown
    try {
      const sessions = await this.api.sessions();
      if (n === this.loads) $('#session-list').replaceChildren(...sessions.sort(byRecent).map((s) => this.row(s)));
    } catch (e) {
      if (n === this.loads) $('#sessions-error').textContent = e.message;
    }
  }

  row(s) {
    // last_used_at lags by up to an hour on the server: this device is active now
    const active = s.current ? 'Active now' : ['Last active ', timeEl(s.last_used_at, fmtAgo(s.last_used_at))];
    return h('li', { class: 'session', 'data-testid': 'session', 'data-device-id': s.device_id, 'data-current': String(!!s.current) },
      h('div', { class: 'member-text' },
        h('div', { class: 'strong session-name' },
          h('span', { class: 'ellipsis', 'data-testid': 'session-device', title: `device ${s.device_id}` }, s.label || 'Unknown device'),
          s.current ? h('span', { class: 'pill accent', 'data-testid': 'this-device' }, 'this device') : null),
        h('div', { class: 'muted small', 'data-testid': 'session-times' },
          active, ' · logged in ', timeEl(s.created_at, fmtDateTime(s.created_at))),
        h('div', { class: 'muted small ellipsis', 'data-testid': 'session-id' }, `device ${s.device_id}`)),
      s.current ? null : h('button', {
        type: 'button', class: 'btn small danger', 'data-testid': 'session-logout',
        'aria-label': `Log out ${s.label || 'device'} (device ${s.device_id})`, onclick: (ev) => this.revoke(s.device_id, ev.currentTarget),
      }, 'Log out'));
  }

  async revoke(deviceId, btn) {
    btn.disabled = true;
    $('#sessions-error').textContent = '';
    try {
      await this.api.revokeSession(deviceId);
    } catch (e) {
      btn.disabled = false;
      if (e.code !== 'not_found') { $('#sessions-error').textContent = e.message; return; } // not_found: gone already
    }
    this.load();
  }

  async logoutEverywhere() {
    if (!confirm('Log out on every device, this one included?')) return;
    const btn = $('#logout-all-btn');
    btn.disabled = true;
    $('#sessions-error').textContent = '';
    try {
      await this.api.logoutEverywhere();
      this.onLoggedOut();
    } catch (e) {
      $('#sessions-error').textContent = e.message;
    } finally {
      btn.disabled = false;
    }
  }

  async deleteAccount() {
    const form = $('#delete-form');
    const err = $('#delete-error');
    const password = form.elements.password.value;
    err.textContent = password ? '' : 'Enter your password.';
    if (err.textContent) return;
    if (!confirm('Delete your account for good? This cannot be undone.')) return;
    const btn = form.querySelector('[type="submit"]');
    btn.disabled = true;
    try {
      await this.api.deleteAccount(password);
      this.onLoggedOut();
    } catch (e) {
      err.textContent = e.status === 401 ? 'Your password is wrong.' : passwordError(e);
    } finally {
      btn.disabled = false;
    }
  }

  async changePassword() {
    const form = $('#password-form');
    const { old, new: next, confirm: again } = form.elements;
    const err = $('#password-error');
    const ok = $('#password-ok');
    err.textContent = passwordProblem(old.value, next.value, again.value);
    ok.textContent = '';
    if (err.textContent) return;
    const btn = form.querySelector('[type="submit"]');
    btn.disabled = true;
    try {
      await this.api.changePassword(old.value, next.value);
      form.reset();
      ok.textContent = 'Password changed. Your other devices were logged out.';
      this.load();
    } catch (e) {
      err.textContent = passwordError(e);
    } finally {
      btn.disabled = false;
    }
  }
}
