// syncPages and pullPages, the recipe's network steps, against fake Http calls.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { pullPages, syncPages, type HistoryPage, type HistoryQuery, type SyncPage } from "../src/index.js";

const page = (version: number, has_more: boolean): SyncPage => ({ version, has_more, conversations: [] });

type SyncArgs = { since?: number; wait?: number; recent?: number; limit?: number };

function fakeSync(answers: SyncPage[]) {
  const calls: SyncArgs[] = [];
  const api = {
    sync: async (q: SyncArgs) => {
      calls.push({ ...q });
      const a = answers.shift();
      if (!a) throw new Error("no more pages");
      return a;
    },
  };
  return { api: api as unknown as Parameters<typeof syncPages>[0], calls };
}

describe("syncPages", () => {
  test("loops while has_more, each page asked from the version the last answer gave", async () => {
    const { api, calls } = fakeSync([page(5, true), page(9, true), page(12, false)]);
    let version = 0;
    const applied: number[] = [];
    const polls: boolean[] = [];
    await syncPages(
      api,
      () => version,
      (p) => {
        applied.push(p.version);
        version = p.version; // apply keeps the answer's version
      },
      { wait: 25, limit: 50, recent: 3, onLongPoll: (b) => polls.push(b) },
    );
    assert.deepEqual(applied, [5, 9, 12]);
    assert.equal(version, 12);
    assert.deepEqual(
      calls.map((c) => [c.since, c.wait]),
      [
        [0, 25], // only the first page long-polls
        [5, 0],
        [9, 0],
      ],
    );
    assert.ok(calls.every((c) => c.limit === 50 && c.recent === 3));
    assert.deepEqual(polls, [true, false]);
  });

  test("stops when an answer does not move the version (no endless loop), and at maxPages", async () => {
    const stuck = fakeSync([page(5, true), page(5, true), page(6, true)]);
    let version = 0;
    await syncPages(stuck.api, () => version, (p) => (version = Math.max(version, p.version)));
    assert.equal(stuck.calls.length, 2);
    assert.equal(version, 5);

    const many = fakeSync([page(1, true), page(2, true), page(3, true), page(4, true)]);
    version = 0;
    await syncPages(many.api, () => version, (p) => (version = p.version), { maxPages: 2 });
    assert.equal(many.calls.length, 2);
    assert.equal(version, 2);
  });

  test("a failed page rejects, and the long poll is still reported over", async () => {
    const polls: boolean[] = [];
    const { api } = fakeSync([]);
    await assert.rejects(
      syncPages(api, () => 0, () => undefined, { wait: 10, onLongPoll: (b) => polls.push(b) }),
      /no more pages/,
    );
    assert.deepEqual(polls, [true, false]);
  });
});

/** A conversation holding seqs 1..persisted (seqs up to `maxSeq` handed out). */
function fakeHistory(persisted: number, missing: Set<number> = new Set()) {
  const calls: Array<HistoryQuery & { conv: string }> = [];
  const api = {
    history: async (conv: string, q: HistoryQuery): Promise<HistoryPage> => {
      calls.push({ conv, ...q });
      const begin = q.begin ?? 1;
      const end = q.end ?? persisted;
      const messages = [];
      for (let s = begin; s <= Math.min(end, persisted); s++) {
        if (!missing.has(s)) messages.push({ conv_id: conv, seq: s });
      }
      return { messages, min_seq: 1, max_seq: persisted, is_end: true } as unknown as HistoryPage;
    },
  };
  return { api: api as unknown as Parameters<typeof pullPages>[0], calls };
}

describe("pullPages", () => {
  test("ascending pages that never span more than the limit", async () => {
    const { api, calls } = fakeHistory(1000);
    const got: number[] = [];
    const settled: Array<[number, number]> = [];
    const next = await pullPages(
      api,
      "g:7",
      3,
      257,
      (p, from, covered) => {
        got.push(...p.messages.map((m) => m.seq));
        settled.push([from, covered]);
      },
      100,
    );
    assert.equal(next, null);
    assert.deepEqual(
      calls.map((c) => [c.begin, c.end, c.limit, c.order]),
      [
        [3, 102, 100, "asc"],
        [103, 202, 100, "asc"],
        [203, 257, 100, "asc"],
      ],
    );
    assert.ok(calls.every((c) => c.conv === "g:7" && c.end! - c.begin! + 1 <= c.limit!));
    assert.deepEqual(settled, [
      [3, 102],
      [103, 202],
      [203, 257],
    ]);
    assert.deepEqual(got, Array.from({ length: 255 }, (_, i) => i + 3));
  });

  test("the page size is capped at 200 and at least 1", async () => {
    const big = fakeHistory(1000);
    await pullPages(big.api, "g:7", 1, 450, () => undefined, 500);
    assert.deepEqual(
      big.calls.map((c) => [c.begin, c.end, c.limit]),
      [
        [1, 200, 200],
        [201, 400, 200],
        [401, 450, 200],
      ],
    );
    const tiny = fakeHistory(1000);
    await pullPages(tiny.api, "g:7", 5, 7, () => undefined, 0);
    assert.deepEqual(
      tiny.calls.map((c) => [c.begin, c.end, c.limit]),
      [
        [5, 5, 1],
        [6, 6, 1],
        [7, 7, 1],
      ],
    );
  });

  test("seqs not persisted yet: stops, and answers the first one missing", async () => {
    // seqs up to 150 are persisted; 151..300 handed out but not written yet
    const { api, calls } = fakeHistory(150);
    const settled: Array<[number, number]> = [];
    const next = await pullPages(api, "s:1:2", 1, 300, (_p, from, covered) => settled.push([from, covered]), 100);
    assert.equal(next, 151);
    assert.deepEqual(settled, [
      [1, 100],
      [101, 150],
    ]);
    assert.equal(calls.length, 2);
  });

  test("seqs deleted or hidden inside a persisted range are settled, not waited for", async () => {
    const { api } = fakeHistory(50, new Set([10, 11, 12]));
    const got: number[] = [];
    const next = await pullPages(api, "s:1:2", 1, 50, (p) => got.push(...p.messages.map((m) => m.seq)), 20);
    assert.equal(next, null);
    assert.equal(got.length, 47);
  });

  test("an empty range asks nothing", async () => {
    const { api, calls } = fakeHistory(10);
    assert.equal(await pullPages(api, "g:7", 5, 4, () => undefined), null);
    assert.equal(calls.length, 0);
  });
});
