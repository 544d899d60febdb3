// The service worker of Web Push: with no tab open, a message pushed by the gateway's
// Web Push sender (its payload: the notification's room_id, event_id, sender_display_name,
// content and unread count) is shown as the page shows it, one per message; a click
// focuses an open tab on that chat, or opens one at the chat's address.

const PREVIEW_MAX = 120;

function preview(content) {
  if (!content || typeof content !== 'object') return 'New message';
  const text = typeof content.text === 'string' ? content.text
    : typeof content.caption === 'string' && content.caption ? content.caption
      : content.upload_id ? (typeof content.mime === 'string' && content.mime.startsWith('image/') ? 'Sent a picture' : 'Sent a file')
        : 'New message';
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length > PREVIEW_MAX ? `${flat.slice(0, PREVIEW_MAX - 1)}…` : flat || 'New message';
}

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil(self.clients.claim()));

self.addEventListener('push', (e) => {
  let p = {};
  try { p = e.data ? e.data.json() : {}; } catch { p = {}; }
  if (typeof p.unread === 'number' && self.navigator.setAppBadge) {
    self.navigator.setAppBadge(p.unread).catch(() => {});
  }
  if (!p.event_id || !p.room_id) return; // a badge-only push (events_only keeps them away)
  const title = typeof p.sender_display_name === 'string' && p.sender_display_name
    ? p.sender_display_name : 'New message';
  e.waitUntil(self.registration.showNotification(title, {
    body: preview(p.content),
    tag: String(p.event_id), // a message notifies once, whatever else shows it
    data: { conv_id: String(p.room_id) },
  }));
});

self.addEventListener('notificationclick', (e) => {
  e.notification.close();
  const conv = e.notification.data && e.notification.data.conv_id;
  const url = new URL(conv ? `/#/c/${encodeURIComponent(conv)}` : '/', self.location.origin).href;
  e.waitUntil((async () => {
    const tabs = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
    const tab = tabs.find((t) => new URL(t.url).origin === self.location.origin);
    if (tab) {
      await tab.focus();
      return tab.navigate ? tab.navigate(url) : null;
    }
    return self.clients.openWindow(url);
  })());
});
