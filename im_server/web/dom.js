// Small DOM and formatting helpers shared by the UI modules.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const $ = (sel, root = document) => root.querySelector(sel);

/** Set text only when it changed (keeps selections and avoids layout work). */
export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

export function setAttr(el, name, value) {
  if (value == null || value === false) {
    if (el.hasAttribute(name)) el.removeAttribute(name);
  } else if (el.getAttribute(name) !== String(value)) {
    el.setAttribute(name, String(value));
  }
}

export function fmtTime(ms) {
  if (!ms) return '';
  const d = new Date(ms);
  return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

export function fmtDay(ms) {
  const d = new Date(ms);
  const today = new Date();
  const yesterday = new Date(Date.now() - 86400000);
  if (d.toDateString() === today.toDateString()) return 'Today';
  if (d.toDateString() === yesterday.toDateString()) return 'Yesterday';
  return d.toLocaleDateString([], { weekday: 'short', day: 'numeric', month: 'short', year: 'numeric' });
}

/** Short time for the conversation list: the hour today, else the date. */
export function fmtListTime(ms) {
  if (!ms) return '';
  const d = new Date(ms);
  if (d.toDateString() === new Date().toDateString()) return fmtTime(ms);
  return d.toLocaleDateString([], { day: 'numeric', month: 'short' });
}

/** Local date and time, with the year when it is not this one. */
export function fmtDateTime(ms) {
  const d = new Date(ms);
  const opts = { day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit' };
  if (d.getFullYear() !== new Date().getFullYear()) opts.year = 'numeric';
  return d.toLocaleString([], opts);
}

/** "just now", "5 min ago", "3 h ago", then the local date and time. */
export function fmtAgo(ms) {
  const s = (Date.now() - ms) / 1000;
  if (s < 60) return 'just now';
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `on ${fmtDateTime(ms)}`;
}

/** A <time> element: the text given, the full local time on hover. */
export function timeEl(ms, text) {
  const d = new Date(ms);
  return h('time', { datetime: d.toISOString(), title: d.toLocaleString() }, text);
}

export function initials(name) {
  const parts = String(name || '?').replace(/[^\p{L}\p{N} ]/gu, ' ').trim().split(/\s+/);
  const s = parts.length > 1 ? parts[0][0] + parts[1][0] : (parts[0] || '?').slice(0, 2);
  return s.toUpperCase();
}

const HUES = [210, 260, 330, 20, 150, 190, 45, 290];
export function hueFor(key) {
  let x = 0;
  for (const ch of String(key)) x = (x * 31 + ch.charCodeAt(0)) >>> 0;
  return HUES[x % HUES.length];
}

export function avatar(name, key, extraClass = '') {
  const el = h('div', { class: `avatar ${extraClass}`.trim(), 'aria-hidden': 'true' }, initials(name));
  el.style.setProperty('--hue', hueFor(key));
  return el;
}

/** One line describing a message, for previews and notices. */
export function describe(m, store) {
  if (!m) return '';
  if (m.recalled) return 'message recalled';
  if (m.content_type === 'recall') return `${cap(store.nameOf(m.sender_id))} recalled a message`;
  if (m.content_type === 'system') return systemText(m, store);
  if (m.content_type === 'edit') return `${cap(store.nameOf(m.sender_id))} edited a message`;
  if (m.content_type === 'reaction') {
    const c = m.content || {};
    return c.op === 'remove' ? `${cap(store.nameOf(m.sender_id))} took back a reaction`
      : `${cap(store.nameOf(m.sender_id))} reacted ${c.emoji || ''}`.trim();
  }
  if (m.content_type === 'image' && m.content) return m.content.caption ? `📷 ${m.content.caption}` : '📷 Photo';
  if (m.content_type === 'file' && m.content) {
    const name = `📎 ${m.content.name || 'File'}`;
    return m.content.caption ? `${name}: ${m.content.caption}` : name;
  }
  if (m.content && typeof m.content.text === 'string') return m.content.text;
  return `[${m.content_type}]`;
}

export function systemText(m, store) {
  const c = m.content || {};
  const actor = cap(store.nameOf(c.actor ?? m.sender_id));
  const users = (c.user_ids || []).map((u) => store.nameOf(u)).join(', ');
  switch (c.event) {
    case 'members_added': return `${actor} added ${users}${c.with_history ? ' (with history)' : ''}`;
    case 'member_kicked': return `${actor} removed ${users}`;
    case 'member_left': return `${cap(store.nameOf((c.user_ids || [])[0] ?? c.actor))} left the group`;
    case 'member_muted': return `${actor} muted ${users} until ${fmtDateTime(c.until)}`;
    case 'member_unmuted': return `${actor} unmuted ${users}`;
    default: return c.event ? String(c.event).replace(/_/g, ' ') : 'group updated';
  }
}

export function cap(s) {
  s = String(s);
  return s === 'you' ? 'You' : s;
}

/** A short one-line excerpt (replies quote their original with it). */
export function excerpt(text, max = 80) {
  const one = String(text || '').replace(/\s+/g, ' ').trim();
  const chars = [...one];
  return chars.length > max ? `${chars.slice(0, max - 1).join('')}…` : one;
}

/** "online", "last seen 5 min ago", or '' when the presence is not mine to see. */
export function presenceText(p) {
  if (!p || p.online == null) return '';
  if (p.online) return 'online';
  return p.last_seen ? `last seen ${fmtAgo(p.last_seen)}` : 'offline';
}

/** Keep a presence dot in step with {online, last_seen}; hidden when unknown. */
export function setDot(dot, p) {
  const known = !!p && p.online != null;
  dot.hidden = !known;
  setAttr(dot, 'data-online', known ? String(!!p.online) : null);
  setAttr(dot, 'title', known ? presenceText(p) : null);
}

// http and https URLs in a message; nothing else ever becomes a link
const URL_IN_TEXT = /\bhttps?:\/\/[^\s<>"'`]+/giu;

/**
 * ``text`` as text nodes and links: each http(s) URL in it (trailing punctuation left
 * out) becomes an ``a`` opening in a new tab, without giving that tab this page
 * (``noopener noreferrer``). Built from nodes, never from markup.
 */
export function linkify(text) {
  const out = [];
  let last = 0;
  for (const hit of text.matchAll(URL_IN_TEXT)) {
    const raw = hit[0].replace(/[.,!?;:'")\]}]+$/u, '');
    let url;
    try { url = new URL(raw); } catch { continue; }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') continue;
    if (hit.index > last) out.push(text.slice(last, hit.index));
    out.push(h('a', {
      href: url.href, target: '_blank', rel: 'noopener noreferrer', class: 'msg-link', 'data-testid': 'msg-link',
    }, raw));
    last = hit.index + raw.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}
