// Desktop notifications: one per message that came while its chat was not on screen
// (another chat open, or the window not focused or hidden), with the sender and a
// preview; none for a muted chat unless the message mentions me. Permission is asked
// only from a click on "Enable notifications", never on load. A click on a notification
// focuses the window on that chat. (The page title keeps its badge either way.) With
// no tab open, Web Push shows the same notification from the service worker (sw.js).

import { COUNTABLE } from './store.js';
import { describe, excerpt } from './dom.js';

const supported = () => typeof window.Notification === 'function';

function fromBase64Url(text) {
  const b64 = text.replace(/-/g, '+').replace(/_/g, '/') + '='.repeat((4 - (text.length % 4)) % 4);
  return Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
}

function sameBytes(buffer, bytes) {
  if (!buffer) return false;
  const a = new Uint8Array(buffer);
  return a.length === bytes.length && a.every((v, i) => v === bytes[i]);
}

export class Notifier {
  constructor(store, { onOpen }) {
    this.store = store;
    this.onOpen = onOpen;
  }

  /** 'granted', 'denied', 'default', or 'unsupported'. */
  get permission() {
    return supported() ? window.Notification.permission : 'unsupported';
  }

  /** Ask for permission; call from a user gesture only. */
  async enable() {
    if (!supported()) return 'unsupported';
    return window.Notification.requestPermission();
  }

  /**
   * Web Push, for when no tab is open: the service worker (``sw.js``) and this
   * session's subscription, registered with the server as the contract's ``webpush``
   * platform (the p256dh key as the pushkey; endpoint and auth as data; the gateway's
   * ``events_only``, so no badge-only push ever reaches the browser). Nothing when the
   * browser, the permission or the server's configuration says no; true when done.
   */
  async subscribePush(api) {
    if (this.permission !== 'granted' || !('serviceWorker' in navigator) || !('PushManager' in window)) return false;
    const cfg = await api.pushConfig();
    const web = cfg && cfg.webpush;
    if (!web) return false;
    await navigator.serviceWorker.register('/sw.js');
    // a push subscription needs an active worker (the browser refuses one while it installs)
    const reg = await navigator.serviceWorker.ready;
    const key = fromBase64Url(web.vapid_public_key);
    let sub = await reg.pushManager.getSubscription();
    if (sub && !sameBytes(sub.options && sub.options.applicationServerKey, key)) {
      // made for another server key (the server's VAPID keys were replaced): the push
      // service would refuse every push the gateway signs with the new one
      await sub.unsubscribe();
      sub = null;
    }
    if (!sub) sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key });
    const { endpoint, keys } = sub.toJSON();
    await api.registerPush({
      app_id: web.app_id, pushkey: keys.p256dh, platform: 'webpush',
      data: { endpoint, auth: keys.auth, events_only: true },
    });
    return true;
  }

  /** A message that just came over the socket. */
  message(c, m) {
    const me = this.store.me && this.store.me.user_id;
    if (this.permission !== 'granted' || !c || !m || m.sender_id === me || !COUNTABLE(m) || m.recalled) return;
    if (c.muted && !c.mentionsMe(m)) return;
    const onScreen = this.store.openId === c.id && document.visibilityState === 'visible' && document.hasFocus();
    if (onScreen) return;
    const who = this.store.plainName(m.sender_id);
    const title = c.type === 'group' ? `${who} in ${this.store.title(c)}` : who;
    const note = new window.Notification(title, {
      body: excerpt(describe(m, this.store), 120),
      tag: `${c.id}:${m.seq}`, // a message notifies once, whatever else shows it
    });
    note.onclick = () => {
      window.focus();
      this.onOpen(c.id);
      note.close();
    };
  }
}
