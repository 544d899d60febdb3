// What of the message list is on screen, for honest read marks: the last row in view
// (a read never passes it) and the button that jumps to the newest while scrolled up.

import { setAttr, setText } from './dom.js';

const AT_BOTTOM_PX = 8;      // closer to the end than this: the newest is on screen
const ROW_SEEN_PX = 40;      // a row counts as on screen once this much of it shows
const JUMP_SHOWN_PX = 300;   // scrolled up more than this: the jump button shows

/**
 * The highest seq on screen: Infinity at the end (the newest, and notices after it, are
 * in view), else the last row with at least ROW_SEEN_PX of it in view; 0 when empty.
 */
export function lastSeenSeq(scroller, timelineEl) {
  if (!timelineEl.firstElementChild) return 0;
  if (scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight <= AT_BOTTOM_PX) return Infinity;
  const bottom = scroller.scrollTop + scroller.clientHeight;
  let best = 0;
  for (const el of timelineEl.children) {
    if (el.offsetTop + Math.min(el.offsetHeight, ROW_SEEN_PX) > bottom) break;
    const seq = Number(el.dataset.seq);
    if (seq > best) best = seq;
  }
  return best;
}

/**
 * The jump button: shown while scrolled up with unread messages below (or far up), with
 * their count; placed just above the list's end. ``unread`` null: no chat open.
 */
export function showJump(btn, scroller, view, unread) {
  const away = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight;
  const n = unread || 0;
  const show = unread != null && away > AT_BOTTOM_PX && (n > 0 || away > JUMP_SHOWN_PX);
  btn.hidden = !show;
  if (!show) return;
  const above = view.getBoundingClientRect().bottom - scroller.getBoundingClientRect().bottom;
  btn.style.bottom = `${Math.round(above) + 12}px`;
  setText(btn.querySelector('.jump-count'), n > 0 ? `${n > 99 ? '99+' : n} new` : '');
  setAttr(btn, 'aria-label', n > 0 ? `${n} new message${n === 1 ? '' : 's'}: jump to the latest` : 'Jump to the latest message');
  setAttr(btn, 'data-count', String(n));
}
