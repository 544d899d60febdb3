// Segment, the web client's held-segment arithmetic (no I/O).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Segment } from "../src/index.js";

function seg(held: Iterable<number> = [], minSeq = 1): { s: Segment; held: Set<number> } {
  const h = new Set(held);
  const s = new Segment((q) => h.has(q));
  s.minSeq = minSeq;
  return { s, held: h };
}

describe("Segment", () => {
  test("not started: no gap; started at a floor it takes in held seqs on both ends", () => {
    const { s } = seg([8, 9, 10, 12]);
    assert.equal(s.gap(20), null);
    s.start(10);
    assert.equal(s.started, true);
    assert.deepEqual([s.floor, s.top, s.olderEnd], [8, 10, false]);
    assert.deepEqual(s.gap(20), [11, 20]);
    assert.equal(s.gap(10), null);
  });

  test("starting at the window's floor means nothing older is left", () => {
    const { s } = seg([], 5);
    s.start(5);
    assert.deepEqual([s.floor, s.top, s.olderEnd], [5, 4, true]);
    assert.equal(s.olderPage(50), null);
  });

  test("messages taken start the segment at the lowest and grow it", () => {
    const { s, held } = seg();
    s.took([]);
    assert.equal(s.started, false);
    for (const q of [7, 8, 9]) held.add(q);
    s.took([9, 7, 8]);
    assert.deepEqual([s.floor, s.top], [7, 9]);
    held.add(10);
    s.took([10]);
    assert.equal(s.top, 10);
  });

  test("resolveTo: seqs not held up to there do not exist; held ones above join", () => {
    const { s } = seg([1, 2, 6, 7]);
    s.start(1);
    assert.deepEqual(s.gap(7), [3, 7]);
    s.resolveTo(5);
    assert.equal(s.top, 7);
    assert.equal(s.gap(7), null);
    s.resolveTo(3); // never goes down
    assert.equal(s.top, 7);
  });

  test("nextPull: a small gap as it is; a far-behind one restarts at the newest page", () => {
    const { s, held } = seg([1, 2, 3]);
    s.start(1);
    let dropped = 0;
    assert.deepEqual(s.nextPull(500, 200, 1000, () => dropped++), [4, 500]);
    assert.equal(dropped, 0);
    const range = s.nextPull(5000, 200, 1000, () => { dropped++; held.clear(); });
    assert.equal(dropped, 1);
    assert.deepEqual(range, [4801, 5000]);
    assert.deepEqual([s.floor, s.top, s.olderEnd], [4801, 4800, false]);
    assert.equal(s.nextPull(4800, 200, 1000, () => dropped++), null);
  });

  test("window: clamp keeps floor and top inside and marks the end", () => {
    const { s } = seg([]);
    s.clamp(); // not started: nothing
    assert.deepEqual([s.floor, s.top], [1, 0]);
    s.start(10);
    s.minSeq = 20;
    s.clamp();
    assert.deepEqual([s.floor, s.top, s.olderEnd], [20, 19, true]);
  });

  test("older pages: the page below the floor, then what the answer covered", () => {
    const { s, held } = seg([100, 101], 1);
    s.start(100);
    assert.deepEqual(s.olderPage(50), [50, 99]);
    for (let q = 60; q <= 99; q++) held.add(q);
    s.coveredOlder(50, 1);
    assert.deepEqual([s.floor, s.olderEnd], [50, false]);
    // the answer's min_seq above the page's begin: the floor stops there, which is the end
    s.minSeq = 30;
    s.coveredOlder(1, 30);
    assert.deepEqual([s.floor, s.olderEnd], [30, true]);
    assert.equal(s.olderPage(50), null);
    // is_end ends it too
    const b = seg([], 1).s;
    b.start(100);
    b.coveredOlder(50, 1, true);
    assert.equal(b.olderEnd, true);
  });

  test("an older page below the window sets olderEnd", () => {
    const { s } = seg([], 1);
    s.start(10);
    s.olderEnd = false;
    s.floor = 1;
    assert.equal(s.olderPage(50), null);
    assert.equal(s.olderEnd, true);
  });

  test("a jump back: pages of at most `page` seqs down to the wanted floor", () => {
    const { s } = seg([], 1);
    s.start(1000);
    const want = s.revealFloor(505, 10);
    assert.equal(want, 495);
    assert.equal(seg([], 3).s.revealFloor(5, 10), 3);
    assert.deepEqual(s.towards(want, 200), [800, 999]);
    s.coveredOlder(800, 1);
    assert.deepEqual(s.towards(want, 200), [600, 799]);
    s.coveredOlder(600, 1);
    assert.deepEqual(s.towards(want, 200), [495, 599]);
    s.coveredOlder(495, 1);
    assert.equal(s.towards(want, 200), null);
  });
});
