// Desktop notifications: one per message that came while its chat was not on screen
// (another chat open, or the window not focused or hidden), with the sender and a
// preview; none for a muted chat unless the message mentions me. Permission is asked
// only from a click on "Enable notifications", never on load. A click on a notification
// focuses the window on that chat. (The page title keeps its badge either way.)

import { COUNTABLE } from './store.js';
import { describe, excerpt } from './dom.js';

const supported = () => typeof window.Notification === 'function';

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
