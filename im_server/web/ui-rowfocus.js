// The keyboard in the message list: one message row is the list's tab stop (the last
// one focused while it is there, else the newest); Up, Down, Home and End move between
// rows, and Tab goes on into the focused row's actions (shown while it has the focus).

export class RowFocus {
  constructor(timelineEl) {
    this.el = timelineEl;
    this.stop = null;     // the row Tab reaches
    this.chosen = false;  // focused by the person (else it follows the newest)
    timelineEl.addEventListener('keydown', (e) => this.onKey(e));
    timelineEl.addEventListener('focusin', (e) => {
      const row = e.target instanceof HTMLElement && e.target.closest('.msg');
      if (row) { this.moveTo(row); this.chosen = true; }
    });
  }

  rows() { return [...this.el.querySelectorAll(':scope > .msg')]; }

  /** Another chat: the stop follows its newest row again. */
  reset() {
    this.stop = null;
    this.chosen = false;
  }

  /** After a render: keep the chosen row while it is there, else the newest. */
  rendered() {
    if (this.stop && this.stop.isConnected && this.chosen) return;
    const rows = this.rows();
    if (rows.length) this.moveTo(rows[rows.length - 1]);
  }

  moveTo(row) {
    if (this.stop && this.stop !== row) this.stop.tabIndex = -1;
    this.stop = row;
    row.tabIndex = 0;
  }

  onKey(e) {
    const row = e.target;
    if (!(row instanceof HTMLElement) || !row.classList.contains('msg')) return;
    const rows = this.rows();
    const i = rows.indexOf(row);
    const to = { ArrowUp: i - 1, ArrowDown: i + 1, Home: 0, End: rows.length - 1 }[e.key];
    if (to === undefined || !rows[to]) return;
    e.preventDefault();
    this.moveTo(rows[to]);
    rows[to].focus();
  }
}
