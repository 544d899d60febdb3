// A view's held segment of one conversation (no I/O): the contiguous seqs [floor, top]
// a client shows, where every seq is held or known not to exist. It answers which seqs
// to pull to close the segment up to the newest known seq (restarting a far-behind
// conversation at its newest page), which older page to load when scrolling up or
// jumping back to a message, and what an answer adds. The messages themselves stay
// with the caller: `holds(seq)` says whether one is held. The web client's Conv uses it.

import type { Interval } from "./syncstate.js";

export class Segment {
  /** floor/top are set (a start point is known). */
  started = false;
  floor = 1;
  top = 0;
  /** Nothing older than floor is left to load. */
  olderEnd = false;
  /** The oldest seq of my window (from the server). */
  minSeq = 1;

  constructor(private readonly holds: (seq: number) => boolean) {}

  /** Start (or restart) the segment at `floor`, empty, then take in held seqs. */
  start(floor: number): void {
    this.started = true;
    this.floor = floor;
    this.top = floor - 1;
    this.olderEnd = floor <= this.minSeq;
    this.advance();
  }

  /** Keep the segment inside the window (after minSeq changed). */
  clamp(): void {
    if (!this.started) return;
    if (this.floor < this.minSeq) this.floor = this.minSeq;
    if (this.top < this.floor - 1) this.top = this.floor - 1;
    if (this.floor <= this.minSeq) this.olderEnd = true;
  }

  /** Grow the segment over held seqs at both ends. */
  advance(): void {
    while (this.holds(this.top + 1)) this.top += 1;
    while (this.floor - 1 >= this.minSeq && this.holds(this.floor - 1)) this.floor -= 1;
    if (this.floor <= this.minSeq) this.olderEnd = true;
  }

  /** Everything in [top+1, seq] that is not held does not exist for me. */
  resolveTo(seq: number): void {
    if (seq > this.top) this.top = seq;
    this.advance();
  }

  /** Messages came: a segment not started yet starts at the lowest of them. */
  took(seqs: number[]): void {
    if (!seqs.length) return;
    if (!this.started) this.start(Math.min(...seqs));
    this.advance();
  }

  /** The seqs to pull to close the segment up to `newest` (the newest known seq), or null. */
  gap(newest: number): Interval | null {
    if (!this.started) return null;
    return this.top < newest ? [this.top + 1, newest] : null;
  }

  /**
   * The range to pull next, or null. When more than `maxGap` seqs are missing the
   * segment restarts at the newest `page` seqs (older ones load on scrolling up):
   * `dropHeld` is called first, so the caller forgets what it held.
   */
  nextPull(newest: number, page: number, maxGap: number, dropHeld: () => void): Interval | null {
    const gap = this.gap(newest);
    if (!gap) return null;
    let [begin, end] = gap;
    if (end - begin + 1 > maxGap) {
      dropHeld();
      this.start(end - page + 1);
      this.olderEnd = false;
      begin = this.top + 1;
    }
    return [begin, end];
  }

  /** Scrolling up: the page of `size` seqs just below the segment, or null (none left: olderEnd). */
  olderPage(size: number): Interval | null {
    if (this.olderEnd) return null;
    const end = this.floor - 1;
    if (end < this.minSeq) {
      this.olderEnd = true;
      return null;
    }
    return [end - size + 1, end];
  }

  /** The floor a jump to `seq` wants: a few (`margin`) older seqs held above it. */
  revealFloor(seq: number, margin: number): number {
    return Math.max(this.minSeq, seq - margin);
  }

  /** The next older page (at most `page` seqs) on the way down to `want`, or null when reached. */
  towards(want: number, page: number): Interval | null {
    if (this.floor <= want || this.olderEnd) return null;
    const end = this.floor - 1;
    return [Math.max(want, end - page + 1), end];
  }

  /**
   * An older page answered for [begin, ...]: the segment now reaches down to begin
   * (or the answer's min_seq), and olderEnd is set when it is the end.
   */
  coveredOlder(begin: number, answerMinSeq: number, isEnd = false): void {
    this.floor = Math.min(this.floor, Math.max(answerMinSeq, begin));
    this.advance();
    if (isEnd || this.floor <= this.minSeq) this.olderEnd = true;
  }
}
