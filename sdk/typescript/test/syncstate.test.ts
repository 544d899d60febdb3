// SyncState, the catch-up arithmetic (no I/O): the cases of the Python SyncState's tests.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { SyncState, backoffDelay } from "../src/index.js";

const msg = (conv_id: string, seq: number) => ({ conv_id, seq });

describe("SyncState", () => {
  test("a sync answer gives the ranges not held, embedded messages left out", () => {
    const s = new SyncState();
    const ranges = s.apply({
      version: 7,
      has_more: false,
      conversations: [{ conv_id: "g:1", min_seq: 1, max_seq: 100, messages: [msg("g:1", 99), msg("g:1", 100)] }],
    });
    assert.deepEqual(ranges, [["g:1", 1, 98]]);
    assert.equal(s.version, 7);
    assert.equal(s.add([msg("g:1", 99), msg("g:1", 100)]).length, 2);
    // requested ranges are not handed out twice
    assert.deepEqual(s.apply({ version: 8, conversations: [{ conv_id: "g:1", min_seq: 1, max_seq: 100 }] }), []);
    s.markPulled("g:1", 1, 98);
    assert.equal(s.contiguous("g:1"), 100);
  });

  test("dedupe by (conv_id, seq), and nothing below the window", () => {
    const s = new SyncState();
    s.apply({ version: 1, conversations: [{ conv_id: "s:1:2", min_seq: 5, max_seq: 4 }] });
    assert.deepEqual(s.add([msg("s:1:2", 3), msg("s:1:2", 5), msg("s:1:2", 5), msg("s:1:2", 6)]).map((m) => m.seq), [5, 6]);
    assert.equal(s.add([msg("s:1:2", 6)]).length, 0);
  });

  test("a pushed seq that skips gives the gap, once", () => {
    const s = new SyncState();
    s.apply({ version: 1, conversations: [{ conv_id: "g:2", min_seq: 1, max_seq: 3 }] });
    s.add([1, 2, 3].map((q) => msg("g:2", q)));
    s.markPulled("g:2", 1, 3);
    assert.equal(s.onPush(msg("g:2", 4)), null);
    s.add([msg("g:2", 4)]);
    assert.deepEqual(s.onPush(msg("g:2", 9)), ["g:2", 5, 8]);
    s.add([msg("g:2", 9)]);
    assert.equal(s.onPush(msg("g:2", 10)), null, "5-8 already requested");
    s.add([msg("g:2", 6)]);
    s.markPulled("g:2", 5, 8); // 5, 7, 8 do not exist for me
    assert.equal(s.contiguous("g:2"), 9);
  });

  test("a released range is asked again; a raised min_seq drops what is below", () => {
    const s = new SyncState();
    const [r] = s.apply({ version: 1, conversations: [{ conv_id: "g:3", min_seq: 1, max_seq: 10 }] });
    assert.deepEqual(r, ["g:3", 1, 10]);
    s.release("g:3", 1, 10);
    assert.deepEqual(s.missing("g:3"), [["g:3", 1, 10]]);
    s.add([msg("g:3", 1), msg("g:3", 2)]);
    s.apply({ version: 2, conversations: [{ conv_id: "g:3", min_seq: 11, max_seq: 12 }] });
    assert.equal(s.held("g:3", 2), false);
    assert.equal(s.minSeq("g:3"), 11);
  });

  test("a snapshot restores what is held", () => {
    const s = new SyncState();
    s.apply({ version: 4, conversations: [{ conv_id: "g:4", min_seq: 1, max_seq: 5 }] });
    s.add([1, 2, 4].map((q) => msg("g:4", q)));
    const back = SyncState.restore(JSON.parse(JSON.stringify(s.snapshot())));
    assert.equal(back.version, 4);
    assert.deepEqual([1, 2, 3, 4, 5].map((q) => back.held("g:4", q)), [true, true, false, true, false]);
    assert.equal(back.add([msg("g:4", 4), msg("g:4", 3)]).length, 1);
    assert.equal(back.contiguous("g:4"), 4);
  });

  test("back-off grows, is capped and jittered", () => {
    for (let a = 0; a < 30; a++) {
      const d = backoffDelay(a, { baseMs: 100, maxMs: 1000 });
      const top = Math.min(1000, 100 * 2 ** a);
      assert.ok(d >= top / 2 && d <= top, `${a}: ${d}`);
    }
  });
});
