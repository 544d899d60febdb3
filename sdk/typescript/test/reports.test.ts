// Reporter without a server: a fake write and REST read report, Node's mocked timers
// and Date as the clock.
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, mock, test } from "node:test";

import { ApiError, Reporter } from "../src/index.js";

type Frame = Record<string, unknown>;

/** Lets the promise callbacks queued so far run. */
const settle = () => new Promise<void>((r) => setImmediate(r));

function fake(open = true) {
  const frames: Frame[] = [];
  const rest: Array<[string, number]> = [];
  const state: { open: boolean; restError: Error | null } = { open, restError: null };
  const write = (f: Frame) => {
    if (!state.open) return false;
    frames.push(f);
    return true;
  };
  const readRest = async (conv: string, seq: number) => {
    rest.push([conv, seq]);
    if (state.restError) throw state.restError;
    return {};
  };
  return { frames, rest, state, write, readRest };
}

const of = (frames: Frame[], type: string) =>
  frames.filter((f) => f.type === type).map((f) => [f.conv_id, f.seq]);

/** Advances the mocked clock, letting the async flush run. */
async function tick(ms: number): Promise<void> {
  mock.timers.tick(ms);
  await settle();
}

describe("Reporter", () => {
  beforeEach(() => mock.timers.enable({ apis: ["setTimeout", "Date"], now: 1_000_000 }));
  afterEach(() => mock.timers.reset());

  test("several reads of one conversation become one report of the highest seq", async () => {
    const { frames, write, readRest } = fake();
    const r = new Reporter(write, readRest, { reportDelayMs: 100 });
    const done = [r.read("s:1:2", 3), r.read("s:1:2", 9), r.read("s:1:2", 5), r.read("g:7", 2)];
    await tick(99);
    assert.deepEqual(frames, []); // gathered, not sent yet
    await tick(1);
    assert.deepEqual(of(frames, "read"), [
      ["s:1:2", 9],
      ["g:7", 2],
    ]);
    await Promise.all(done); // every caller's promise resolves with the batch
    r.stop();
  });

  test("delivered is batched the same way and never goes down", async () => {
    const { frames, write, readRest } = fake();
    const r = new Reporter(write, readRest, { reportDelayMs: 100 });
    r.delivered("s:1:2", 4);
    r.delivered("s:1:2", 6);
    r.delivered("s:1:2", 5);
    await tick(100);
    assert.deepEqual(of(frames, "delivered"), [["s:1:2", 6]]);
    r.delivered("s:1:2", 6);
    r.delivered("s:1:2", 2);
    await tick(1000);
    assert.deepEqual(of(frames, "delivered"), [["s:1:2", 6]]);
    r.delivered("s:1:2", 8);
    await tick(100);
    assert.deepEqual(of(frames, "delivered"), [
      ["s:1:2", 6],
      ["s:1:2", 8],
    ]);
    r.stop();
  });

  test("never a lower read seq after a higher one", async () => {
    const { frames, write, readRest } = fake();
    const r = new Reporter(write, readRest, { reportDelayMs: 100 });
    const first = r.read("s:1:2", 10);
    await tick(100);
    await first;
    const lower = r.read("s:1:2", 4);
    await tick(100);
    await lower; // resolves: the cursor is already past it
    r.read("s:1:2", 12).catch(() => undefined);
    await tick(100);
    const seqs = of(frames, "read").map(([, s]) => s as number);
    assert.deepEqual(seqs, [10, 12]);
    r.stop();
  });

  test("with no socket, reads go over REST; delivered waits for a socket", async () => {
    const { frames, rest, state, write, readRest } = fake(false);
    const r = new Reporter(write, readRest, { reportDelayMs: 100 });
    const done = r.read("g:7", 3);
    r.read("g:7", 5).catch(() => undefined);
    r.delivered("g:7", 5);
    await tick(100);
    await done;
    assert.deepEqual(rest, [["g:7", 5]]);
    assert.deepEqual(frames, []);
    state.open = true;
    r.reopened();
    await tick(100);
    assert.deepEqual(of(frames, "delivered"), [["g:7", 5]]);
    r.stop();
  });

  test("reports written to a socket that died are sent again after the reconnect", async () => {
    const { frames, write, readRest } = fake();
    const r = new Reporter(write, readRest, { reportDelayMs: 100 });
    r.read("s:1:2", 7).catch(() => undefined);
    r.delivered("s:1:2", 8);
    await tick(100);
    assert.equal(frames.length, 2);
    frames.length = 0;
    r.reopened();
    await tick(100);
    assert.deepEqual(of(frames, "read"), [["s:1:2", 7]]);
    assert.deepEqual(of(frames, "delivered"), [["s:1:2", 8]]);
    // a higher read queued meanwhile wins over the one re-sent
    frames.length = 0;
    r.read("s:1:2", 9).catch(() => undefined);
    r.reopened();
    await tick(100);
    assert.deepEqual(of(frames, "read"), [["s:1:2", 9]]);
    r.stop();
  });

  test("a REST read that could not reach the server is tried again, backing off", async () => {
    const { rest, state, write, readRest } = fake(false);
    const r = new Reporter(write, readRest, { reportDelayMs: 100 });
    state.restError = new Error("network down");
    const first = assert.rejects(r.read("g:7", 3), /network down/);
    await tick(100);
    await first;
    assert.equal(rest.length, 1);
    // the retry waits backoffDelay(1, base 500) = within [500, 1000]
    await tick(499);
    assert.equal(rest.length, 1);
    state.restError = null;
    await tick(501);
    assert.deepEqual(rest, [
      ["g:7", 3],
      ["g:7", 3],
    ]);
    // a refusal (4xx) is final: not tried again
    state.restError = new ApiError(403, "forbidden", "no");
    const refused = assert.rejects(r.read("g:8", 1), ApiError);
    await tick(100);
    await refused;
    await tick(60000);
    assert.deepEqual(rest.at(-1), ["g:8", 1]);
    assert.equal(rest.length, 3);
    r.stop();
  });

  test("typing goes out at most once per interval per conversation", async () => {
    const { frames, state, write, readRest } = fake();
    const r = new Reporter(write, readRest, { typingEveryMs: 3000 });
    assert.equal(r.typing("s:1:2"), true);
    assert.equal(r.typing("s:1:2"), false);
    assert.equal(r.typing("g:7"), true); // another conversation has its own interval
    await tick(2999);
    assert.equal(r.typing("s:1:2"), false);
    await tick(1);
    assert.equal(r.typing("s:1:2"), true);
    assert.deepEqual(of(frames, "typing"), [
      ["s:1:2", undefined],
      ["g:7", undefined],
      ["s:1:2", undefined],
    ]);
    // a message sent: the next keystroke says it again at once
    r.typingEnded("s:1:2");
    assert.equal(r.typing("s:1:2"), true);
    // no socket: not sent, and not counted against the interval
    state.open = false;
    await tick(3000);
    assert.equal(r.typing("g:7"), false);
    state.open = true;
    assert.equal(r.typing("g:7"), true);
    assert.equal(of(frames, "typing").length, 5);
    r.stop();
  });
});
