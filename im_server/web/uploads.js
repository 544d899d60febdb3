// Attachments in the browser: what a picked file becomes (kind, type, name, size, picture
// size), the PUT of its bytes to the presigned URL (XMLHttpRequest: fetch has no upload
// progress), and the short-lived download links of pictures and files (an <img> cannot
// send the token, so the page asks for {url, expires_at} and uses the URL).

import { ApiError } from './api.js';

// what an "image" message may carry (the server's IMAGE_TYPES); anything else is a file
export const IMAGE_TYPES = new Set(['image/jpeg', 'image/png', 'image/gif', 'image/webp']);
const MIME = /^[a-z0-9][a-z0-9!#$&^_.+-]{0,63}\/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}$/;
const NAME_MAX = 255;
// XMLHttpRequest refuses to set these itself (and says so on the console)
const BROWSER_HEADERS = new Set(['content-length', 'host', 'connection', 'expect']);
// a thumbnail is made after the send: ask again after these pauses, then show the original
const THUMB_RETRY_MS = [400, 700, 1000, 1500, 2000, 3000];
const LINK_MARGIN_MS = 30000; // a link this close to its end is asked for anew

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export const isAttachment = (m) => !!m && (m.content_type === 'image' || m.content_type === 'file')
  && !!m.content && !m.recalled;

/** The media type the server accepts: the file's own without parameters, else a generic one. */
export function mimeOf(file) {
  const t = String(file.type || '').split(';')[0].trim().toLowerCase();
  return MIME.test(t) ? t : 'application/octet-stream';
}

/** A name the server keeps: the file's (pasted pictures have a generic one), at most 255 characters. */
export function nameOf(file, mime) {
  let name = String(file.name || '').trim();
  if (!name) name = mime.startsWith('image/') ? `image.${mime.split('/')[1]}` : 'file';
  const chars = [...name];
  if (chars.length <= NAME_MAX) return name;
  const dot = name.lastIndexOf('.');
  const ext = dot > 0 && name.length - dot <= 16 ? name.slice(dot) : '';
  return chars.slice(0, NAME_MAX - [...ext].length).join('') + ext;
}

/** "512 B", "2.9 KB", "14 MB" (binary multiples, as file managers show them). */
export function fmtSize(bytes) {
  const n = Number(bytes) || 0;
  if (n < 1024) return `${n} B`;
  const units = ['KB', 'MB', 'GB', 'TB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

/** {width, height} of a picture file, or null when the browser cannot read it. */
export async function imageSize(file) {
  if (typeof createImageBitmap !== 'function') return null;
  try {
    const bmp = await createImageBitmap(file);
    const size = { width: bmp.width, height: bmp.height };
    bmp.close();
    return size;
  } catch {
    return null;
  }
}

/**
 * PUT the file to the ticket's URL with its headers; onProgress(fraction) as bytes go.
 * Resolves when the store took it; ApiError otherwise (status 0: unreachable).
 */
export function putBytes(ticket, file, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open(ticket.method || 'PUT', ticket.url);
    for (const [k, v] of Object.entries(ticket.headers || {})) {
      if (!BROWSER_HEADERS.has(k.toLowerCase())) xhr.setRequestHeader(k, v);
    }
    xhr.upload.addEventListener('progress', (e) => {
      if (e.lengthComputable && onProgress) onProgress(e.loaded / e.total);
    });
    xhr.addEventListener('load', () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve();
      else reject(new ApiError(xhr.status, 'store', `the file store refused the upload (HTTP ${xhr.status})`));
    });
    xhr.addEventListener('error', () => reject(new ApiError(0, 'network', 'the file store cannot be reached')));
    xhr.addEventListener('abort', () => reject(new ApiError(0, 'aborted', 'the upload was cancelled')));
    xhr.send(file);
  });
}

/** Download links of this session's uploads, each asked for once while it is good. */
export class Media {
  constructor(api) {
    this.api = api;
    this.links = new Map();    // `${id}|thumb|full` -> {url, expires_at}
    this.asking = new Map();   // the same key -> promise of the link
    this.previews = new Map(); // upload_id -> blob: URL of a picture sent from this page
  }

  /** A URL of the upload (or its thumbnail); rejects with the server's ApiError. */
  async link(id, thumb = false) {
    const key = `${id}|${thumb ? 'thumb' : 'full'}`;
    const held = this.links.get(key);
    if (held && held.expires_at - Date.now() > LINK_MARGIN_MS) return held.url;
    if (!this.asking.has(key)) {
      const run = this.api.uploadLink(id, thumb).then((r) => { this.links.set(key, r); return r.url; });
      this.asking.set(key, run);
      run.finally(() => this.asking.delete(key)).catch(() => {});
    }
    return this.asking.get(key);
  }

  /** The thumbnail once it is made (404 until then), else after a while the picture itself. */
  async thumbnail(id) {
    for (let i = 0; ; i += 1) {
      try {
        return await this.link(id, true);
      } catch (e) {
        if (e.status !== 404 || i >= THUMB_RETRY_MS.length) break;
        await sleep(THUMB_RETRY_MS[i]);
      }
    }
    return this.link(id, false);
  }
}
