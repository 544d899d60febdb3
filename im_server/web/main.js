// Entry point: log in (token in localStorage), then wire the store, the socket, the
// catch-up engine and the views together. Rendering is batched per task.

import { Api } from './api.js';
import { Socket } from './socket.js';
import { Store } from './store.js';
import { Engine, newId } from './engine.js';
import { $ } from './dom.js';
import { ListView } from './ui-list.js';
import { ChatView } from './ui-chat.js';
import { Dialogs } from './ui-dialogs.js';
import { SessionsDialog } from './ui-sessions.js';
import { SearchView } from './ui-search.js';
import { Notifier } from './notify.js';

const SESSION_KEY = 'im.session';
const DEVICE_KEY = 'im.device';
// revoked from another device, by a password change, or expired
const LOGGED_OUT = 'You were logged out. Please log in again.';

const api = new Api('');
const store = new Store();
let engine = null;
let socket = null;
let views = null;

function deviceId() {
  let id = localStorage.getItem(DEVICE_KEY);
  if (!id) { id = `web-${newId().replace(/-/g, '').slice(0, 12)}`; localStorage.setItem(DEVICE_KEY, id); }
  return id;
}

let toastTimer = null;
function toast(text) {
  const el = $('#toast');
  el.textContent = text;
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { el.hidden = true; }, 2500);
}

// ---- auth screen ----------------------------------------------------------------

function showAuth(message = '') {
  $('#main').hidden = true;
  $('#banner').hidden = true;
  $('#auth').hidden = false;
  $('#auth-error').textContent = message;
  $('#auth-password').value = ''; // a remote log-out leaves no password behind
  $('#auth-username').focus();
}

async function authSubmit(register) {
  const form = $('#auth-form');
  if (!form.reportValidity()) return;
  const username = $('#auth-username').value.trim();
  const password = $('#auth-password').value;
  const err = $('#auth-error');
  err.textContent = '';
  for (const b of form.querySelectorAll('button')) b.disabled = true;
  try {
    if (register) {
      try {
        await api.register(username, password);
      } catch (e) {
        if (e.code === 'conflict') throw new Error('That username is taken. Log in instead?');
        if (e.code === 'rate_limited') throw new Error('Too many new accounts from your network. Try again later.');
        throw e;
      }
    }
    let s;
    try {
      s = await api.login(username, password, deviceId());
    } catch (e) {
      if (e.status === 401) throw new Error('Wrong username or password.');
      throw e;
    }
    localStorage.setItem(SESSION_KEY, JSON.stringify({ token: s.token, user_id: s.user_id, username }));
    await startSession(s.token, { user_id: s.user_id, username });
  } catch (e) {
    err.textContent = e.message;
  } finally {
    for (const b of form.querySelectorAll('button')) b.disabled = false;
  }
}

$('#auth-form').addEventListener('submit', (e) => { e.preventDefault(); authSubmit(false); });
$('#register-btn').addEventListener('click', () => authSubmit(true));

// ---- session --------------------------------------------------------------------

async function startSession(token, cached) {
  api.token = token;
  let me = cached;
  try {
    const fresh = await api.me();
    me = { user_id: fresh.user_id, username: fresh.username };
  } catch (e) {
    if (e.status === 401) { endSession(LOGGED_OUT); return; }
    if (!me) throw e; // offline at boot: run on the cached identity
  }
  store.reset();
  store.setMe(me);
  const wsBase = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}`;
  socket = new Socket(() => `${wsBase}/v1/ws?token=${encodeURIComponent(api.token)}`);
  engine = new Engine(api, store, socket);
  socket.addEventListener('unauthorized', () => endSession(LOGGED_OUT));
  api.onUnauthorized = () => endSession(LOGGED_OUT);
  if (!views) views = makeViews();
  engine.seenUpTo = (c) => views.chat.seenUpTo(c); // only what is on screen is marked read
  $('#auth').hidden = true;
  $('#main').hidden = false;
  views.list.renderMe();
  shownAddress = null;
  awaited = convOfAddress(); // the address's chat: the page keeps its address meanwhile
  render();
  engine.onLiveMessage = (c, m) => notifier.message(c, m);
  renderNotifyButton();
  if (notifier.permission === 'granted') subscribePush();
  engine.start();
  window.__im = { store, engine, socket, api }; // for debugging and the browser tests
  followAddress(); // a chat's address opened before (or while logged out): that chat
}

function endSession(message) {
  if (engine) engine.stop();
  engine = null;
  socket = null;
  api.token = null;
  api.onUnauthorized = null;
  localStorage.removeItem(SESSION_KEY);
  store.reset();
  if (views) {
    views.chat.convId = null;
    views.chat.focusOn(null);
    views.dialogs.panelOpen = false;
    views.search.close(true);
  }
  for (const d of document.querySelectorAll('dialog[open]')) d.close();
  showAuth(message);
}

// logging out reloads the page: a clean slate
function leave() {
  endSession('');
  location.reload();
}

async function logout() {
  try { await api.logout(); } catch { /* offline: forget the token anyway */ }
  leave();
}

// ---- desktop notifications --------------------------------------------------------

const notifier = new Notifier(store, { onOpen: (convId) => openConv(convId) });

function renderNotifyButton() {
  $('#notify-btn').hidden = notifier.permission !== 'default';
}

$('#notify-btn').addEventListener('click', async () => {
  const got = await notifier.enable(); // asked on this click, never on load
  renderNotifyButton();
  if (got === 'denied') toast('Notifications are blocked for this site in the browser settings');
  if (got === 'granted') subscribePush();
});

/** Web Push for this session, when allowed and configured (again at each start: a
 * subscription the browser renewed is registered anew). */
function subscribePush() {
  notifier.subscribePush(api).catch((e) => console.info('Web Push not available:', e && e.message));
}

// ---- a chat's address: #/c/<conversation id> --------------------------------------
// Opening a chat pushes its address, so a reload comes back to it and back / forward
// move between chats; an address opened while logged out opens its chat after login.

const CHAT_ADDRESS = /^#\/c\/(s:[1-9][0-9]{0,18}:[1-9][0-9]{0,18}|g:[1-9][0-9]{0,18})$/;
let shownAddress = null; // the address the page shows for store.openId
let awaited = null; // a chat of the address, waited for (its state comes with a sync)

function convOfAddress() {
  const m = CHAT_ADDRESS.exec(location.hash);
  return m ? m[1] : null;
}

const addressOf = (convId) => (convId ? `#/c/${convId}` : '#/');

function syncAddress() {
  if (!engine) return;
  if (awaited && store.openId !== awaited) return; // keep the address until it opens
  awaited = null;
  const want = addressOf(store.openId);
  if (want === shownAddress) return;
  shownAddress = want;
  if (location.hash !== want && !(want === '#/' && !location.hash)) history.pushState(null, '', want);
}

function followAddress() {
  if (!engine) return;
  const convId = convOfAddress();
  shownAddress = addressOf(convId);
  if (convId === store.openId) return;
  if (convId) { awaited = convId; openConv(convId, { wait: true }); }
  else { views.dialogs.panelOpen = false; engine.open(null); }
}

window.addEventListener('popstate', followAddress);

// ---- views ----------------------------------------------------------------------

function openConv(convId, { wait = false } = {}) {
  if (!engine) return;
  if (wait && !store.conv(convId, false)?.known) {
    // just created (friend accepted, group made): its state comes with the next sync
    engine.kickSync();
    const t0 = Date.now();
    const poll = setInterval(() => {
      const c = store.conv(convId, false);
      if ((c && c.known) || Date.now() - t0 > 5000) {
        clearInterval(poll);
        if (c && c.known) openConv(convId);
        else if (awaited === convId) { awaited = null; render(); } // not mine: let the address go
      }
    }, 100);
    return;
  }
  views.dialogs.panelOpen = views.dialogs.panelOpen && store.conv(convId, false)?.type === 'group';
  engine.open(convId);
}

/** A search result: open its conversation at that message (older history loaded as needed). */
async function jumpTo(convId, seq) {
  if (!engine) return;
  const c = store.conv(convId, false);
  if (!c || !c.known) { toast('That conversation is not available'); return; }
  openConv(convId);
  views.chat.focusOn(convId, seq);
  try {
    const held = await engine.reveal(c, seq);
    if (!held && store.openId === convId) { views.chat.focusOn(null); toast('That message is no longer available'); }
  } catch (e) {
    views.chat.focusOn(null);
    toast(`Could not load the message: ${e.message}`);
  }
}

function makeViews() {
  // the views outlive a session's engine: they reach the current one through this proxy
  const current = new Proxy({}, {
    get: (_, k) => { const v = engine && engine[k]; return typeof v === 'function' ? v.bind(engine) : v; },
  });
  const v = {};
  v.list = new ListView(store, current, { onOpen: openConv, toast });
  v.dialogs = new Dialogs(store, current, { onOpen: openConv, toast });
  v.sessions = new SessionsDialog(store, api, { onLoggedOut: leave });
  v.search = new SearchView(store, current, { onJump: jumpTo, toast });
  v.chat = new ChatView(store, current, {
    onClose: () => { views.dialogs.panelOpen = false; engine.open(null); },
    onGroupInfo: () => views.dialogs.toggleGroupPanel(),
    onReceipts: (c, seq) => views.dialogs.showReceipts(c, seq),
    toast,
  });
  $('#logout-btn').addEventListener('click', logout);
  // Escape closes the innermost open thing only: a dialog (the browser closes it), the
  // composer's pop-ups and the search (they take the key first), the reaction picker,
  // the members panel, and only then the chat
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape' || e.defaultPrevented || !engine) return;
    if (document.querySelector('dialog[open]')) return;
    if (v.chat.closePicker()) { e.preventDefault(); return; }
    if (v.dialogs.panelOpen && store.openId) {
      e.preventDefault();
      v.dialogs.panelOpen = false;
      render();
      return;
    }
    if (store.openId) engine.open(null);
  });
  return v;
}

let scheduled = false;
function render() {
  if (!views || !store.me) return;
  syncAddress();
  views.list.renderMe();
  views.list.renderRequests();
  views.list.render();
  views.chat.render();
  views.search.render();
  views.dialogs.renderPanel();
  renderBanner();
}

function renderBanner() {
  const b = $('#banner');
  const st = store.connection;
  const offline = st !== 'open';
  b.hidden = !offline || !store.me;
  b.dataset.state = st;
  $('#banner-text').textContent = st === 'connecting' && !store.everOpen ? 'connecting…' : 'offline — reconnecting…';
  if (st === 'open') store.everOpen = true;
  document.body.classList.toggle('is-offline', offline);
}

store.addEventListener('change', () => {
  if (scheduled) return;
  scheduled = true;
  queueMicrotask(() => {
    scheduled = false;
    render();
  });
});

// ---- boot -----------------------------------------------------------------------

(async () => {
  const saved = (() => { try { return JSON.parse(localStorage.getItem(SESSION_KEY) || 'null'); } catch { return null; } })();
  if (saved && saved.token) {
    try {
      await startSession(saved.token, { user_id: saved.user_id, username: saved.username });
      return;
    } catch { /* fall through */ }
  }
  showAuth('');
})();
