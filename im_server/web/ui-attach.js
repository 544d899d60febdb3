// Picture and file bubbles, and the full-size picture viewer. A picture's box is sized
// from the content's width and height before anything loads, so the timeline does not
// jump when the thumbnail arrives. Names and captions are text nodes, never markup.

import { $, h, setAttr, setText } from './dom.js';
import { fmtSize, isAttachment } from './uploads.js';

const BOX = 280;       // px: a picture's longer side in the timeline, at most
const MIN_SIDE = 48;   // px: a very long strip stays clickable
const NO_SIZE = { width: 240, height: 180 };

/** The on-screen box of a picture of width × height (scaled down, never up). */
export function boxFor(content) {
  const w = Number(content.width) || 0;
  const ht = Number(content.height) || 0;
  if (!(w > 0 && ht > 0)) return NO_SIZE;
  const k = Math.min(1, BOX / w, BOX / ht);
  return { width: Math.max(MIN_SIDE, Math.round(w * k)), height: Math.max(MIN_SIDE, Math.round(ht * k)) };
}

/** "PDF", "ZIP", … from the name; "FILE" when it has no short extension. */
function badge(name) {
  const m = /\.([A-Za-z0-9]{1,4})$/.exec(String(name || ''));
  return m ? m[1].toUpperCase() : 'FILE';
}

class Lightbox {
  constructor() {
    this.dlg = $('#lightbox');
    this.img = $('#lightbox-img');
    this.caption = $('#lightbox-caption');
    // a click beside the picture closes it, as Esc does (the dialog's own cancel)
    this.dlg.addEventListener('click', (e) => { if (e.target === this.dlg) this.dlg.close(); });
    $('#lightbox-close').addEventListener('click', () => this.dlg.close());
    this.dlg.addEventListener('close', () => this.img.removeAttribute('src'));
  }

  show(url, name, caption) {
    this.img.src = url;
    this.img.alt = name || 'picture';
    setText(this.caption, caption || '');
    this.caption.hidden = !caption;
    if (!this.dlg.open) this.dlg.showModal();
  }
}

export class Attachments {
  constructor(engine, toast) {
    this.engine = engine; // the session's, through main.js's proxy
    this.toast = toast;
    this.lightbox = new Lightbox();
  }

  get media() { return this.engine.media; }

  /** Keep a bubble's attachment slot in step with its message (hidden without one). */
  update(slot, m) {
    const on = isAttachment(m);
    slot.hidden = !on;
    if (!on) {
      if (slot.childElementCount) { slot.replaceChildren(); delete slot.dataset.key; }
      return;
    }
    const c = m.content;
    const key = JSON.stringify([m.content_type, c.upload_id, c.name, c.size, c.width, c.height]);
    if (slot.dataset.key !== key) {
      slot.dataset.key = key;
      slot.replaceChildren(m.content_type === 'image' ? this.image(m) : this.file(m), this.progress());
    }
    const uploading = m.state === 'uploading';
    const bar = slot.querySelector('.att-progress');
    bar.hidden = !uploading;
    if (uploading) {
      const pct = Math.round((m.progress || 0) * 100);
      bar.firstChild.style.width = `${pct}%`;
      setAttr(bar, 'aria-valuenow', String(pct));
    }
    const file = slot.querySelector('.att-file');
    if (file) file.disabled = uploading;
  }

  progress() {
    return h('div', {
      class: 'att-progress', role: 'progressbar', 'aria-label': 'Uploading', 'aria-valuemin': '0',
      'aria-valuemax': '100', 'data-testid': 'upload-progress', hidden: true,
    }, h('div', { class: 'bar' }));
  }

  image(m) {
    const c = m.content;
    const box = boxFor(c);
    const img = h('img', { alt: c.caption || c.name || 'picture', 'data-testid': 'attachment-thumb', decoding: 'async' });
    const btn = h('button', {
      type: 'button', class: 'att-image', 'data-testid': 'attachment-image', 'data-state': 'loading',
      'data-upload-id': c.upload_id, title: 'Open the picture', 'aria-label': `Open the picture ${c.name || ''}`.trim(),
    }, img);
    btn.style.width = `${box.width}px`;
    btn.style.height = `${box.height}px`;
    img.addEventListener('load', () => { btn.dataset.state = 'loaded'; });
    img.addEventListener('error', () => { if (img.src) btn.dataset.state = 'error'; });
    // a picture sent from this page shows from memory; the others' thumbnails are fetched
    const local = m.preview || (c.upload_id && this.media.previews.get(c.upload_id));
    if (local) {
      img.src = local;
      btn.dataset.preview = local;
    } else if (c.upload_id) {
      this.media.thumbnail(c.upload_id).then(
        (url) => { img.src = url; },
        () => { btn.dataset.state = 'error'; img.alt = 'picture unavailable'; },
      );
    }
    btn.addEventListener('click', () => this.open(btn, c));
    return btn;
  }

  async open(btn, c) {
    const id = btn.dataset.uploadId;
    const local = (id && this.media.previews.get(id)) || btn.dataset.preview;
    try {
      const url = local || (id && await this.media.link(id, false));
      if (url) this.lightbox.show(url, c.name, c.caption);
    } catch (e) {
      this.toast(`Could not open the picture: ${e.message}`);
    }
  }

  file(m) {
    const c = m.content;
    const btn = h('button', {
      type: 'button', class: 'att-file', 'data-testid': 'attachment-file', 'data-upload-id': c.upload_id,
      title: `Download ${c.name || 'the file'}`,
    },
    h('span', { class: 'att-icon', 'aria-hidden': 'true' }, badge(c.name)),
    h('span', { class: 'att-info' },
      h('span', { class: 'att-name', 'data-testid': 'attachment-name' }, c.name || 'file'),
      h('span', { class: 'att-size', 'data-testid': 'attachment-size' }, fmtSize(c.size))));
    btn.addEventListener('click', () => this.download(btn.dataset.uploadId));
    return btn;
  }

  /** A fresh link, followed: the store answers it as an attachment, so the page stays. */
  async download(id) {
    if (!id) return;
    try {
      const url = await this.media.link(id, false);
      const a = h('a', { href: url, rel: 'noopener', hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
    } catch (e) {
      this.toast(`Download failed: ${e.message}`);
    }
  }
}
