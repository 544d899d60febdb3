// Outbox without a server: a fake write and Node's mocked timers (the module reads
// setTimeout off globalThis at call time, so the mock is the fake clock).
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, mock, test } from "node:test";

import { ImTimeoutError, Outbox, SendError, type AckOk } from "../src/index.js";

type Frame = Record<string, unknown>;

/** Lets the promise callbacks queued so far run. */
const settle = () => new Promise<void>((r) => setImmediate(r));

const ok = (id: string, seq = 1): AckOk => ({
  type: "ack",
  client_msg_id: id,
  ok: true,
  conv_id: "s:1:2",
  seq,
  server_time: 0,
  duplicate: false,
});
const refused = (id: string, code: string) =>
  ({ type: "ack", client_msg_id: id, ok: false, code, message: code }) as const;

function fake(open = true) {
  const frames: Frame[] = [];
  const state = { open };
  const write = (f: Frame) => {
    if (!state.open) return false;
    frames.push(f);
    return true;
  };
  return { frames, state, write };
}

const sendFrame = (id: string) => ({ type: "send", conv_id: "s:1:2", client_msg_id: id, content: { text: id } });
const ids = (frames: Frame[]) => frames.map((f) => f.client_msg_id);

/** Records how a promise ended, without leaving a rejection unhandled. */
function track<T>(p: Promise<T>) {
  const r: { value?: T; error?: unknown; done: boolean } = { done: false };
  p.then(
    (v) => Object.assign(r, { value: v, done: true }),
    (e) => Object.assign(r, { error: e, done: true }),
  );
  return r;
}

describe("Outbox", () => {
  beforeEach(() => mock.timers.enable({ apis: ["setTimeout"] }));
  afterEach(() => mock.timers.reset());

  test("a send is kept until acked, then resolves with the ack", async () => {
    const { frames, write } = fake();
    const box = new Outbox(write);
    let onAck: AckOk | null = null;
    const r = track(box.send(sendFrame("a"), { onAck: (a) => (onAck = a) }));
    assert.deepEqual(ids(frames), ["a"]);
    assert.equal(box.size, 1);
    assert.ok(box.has("a"));
    // an ack for another id is not ours
    assert.equal(box.onAck(ok("zzz")), false);
    assert.equal(box.onAck({ type: "ack", client_msg_id: null, ok: false, code: "bad_request", message: "" }), false);
    await settle();
    assert.equal(r.done, false);
    assert.equal(box.onAck(ok("a", 7)), true);
    await settle();
    assert.equal(r.done, true);
    assert.equal(r.value?.seq, 7);
    assert.equal((onAck as AckOk | null)?.seq, 7);
    assert.equal(box.size, 0);
    // a late duplicate ack is not ours any more, and nothing is written again
    assert.equal(box.onAck(ok("a", 7)), false);
    mock.timers.tick(60000);
    assert.deepEqual(ids(frames), ["a"]);
  });

  test("the same client_msg_id is written again after an ack timeout", async () => {
    const { frames, write } = fake();
    const box = new Outbox(write, { ackTimeoutMs: 1000 });
    const r = track(box.send(sendFrame("a")));
    mock.timers.tick(999);
    assert.deepEqual(ids(frames), ["a"]);
    mock.timers.tick(1);
    assert.deepEqual(ids(frames), ["a", "a"]);
    mock.timers.tick(1000);
    assert.deepEqual(ids(frames), ["a", "a", "a"]);
    // the very same frame each time
    assert.ok(frames.every((f) => f === frames[0]));
    box.onAck(ok("a"));
    await settle();
    assert.equal(r.done, true);
    mock.timers.tick(5000);
    assert.equal(frames.length, 3);
  });

  test("unacked sends are written again, same ids, after a reconnect", async () => {
    const { frames, state, write } = fake(false);
    const box = new Outbox(write, { ackTimeoutMs: 10000 });
    const a = track(box.send(sendFrame("a")));
    const b = track(box.send(sendFrame("b")));
    assert.deepEqual(frames, []); // no socket: kept
    assert.equal(box.size, 2);
    state.open = true;
    box.resendAll();
    assert.deepEqual(ids(frames), ["a", "b"]);
    box.onAck(ok("a"));
    // the socket drops and comes back: only the unacked one goes again
    box.resendAll();
    assert.deepEqual(ids(frames), ["a", "b", "b"]);
    box.onAck(ok("b", 2));
    await settle();
    assert.ok(a.done && b.done && a.error === undefined && b.error === undefined);
    assert.equal(box.size, 0);
  });

  for (const code of ["unavailable", "rate_limited"]) {
    test(`"${code}" is retried with back-off, then fails after maxRefusals`, async () => {
      const { frames, write } = fake();
      const box = new Outbox(write, { ackTimeoutMs: 60000, maxRefusals: 3 });
      const r = track(box.send(sendFrame("a")));
      for (let i = 1; i <= 3; i++) {
        assert.equal(box.onAck(refused("a", code)), true);
        await settle();
        assert.equal(r.done, false, `still pending after refusal ${i}`);
        const before = frames.length;
        // backoffDelay(i, base 200) is within [d/2, d], d = 200 * 2^i
        const d = 200 * 2 ** i;
        mock.timers.tick(d / 2 - 1);
        assert.equal(frames.length, before, `not again before the back-off (${i})`);
        mock.timers.tick(d / 2 + 1);
        assert.equal(frames.length, before + 1, `again after the back-off (${i})`);
        assert.equal(frames.at(-1)?.client_msg_id, "a");
      }
      box.onAck(refused("a", code));
      await settle();
      assert.ok(r.error instanceof SendError);
      assert.equal((r.error as SendError).code, code);
      assert.equal((r.error as SendError).clientMsgId, "a");
      assert.equal(box.size, 0);
      const n = frames.length;
      mock.timers.tick(120000);
      assert.equal(frames.length, n);
    });
  }

  test("other refusals reject at once", async () => {
    const { frames, write } = fake();
    const box = new Outbox(write);
    const r = track(box.send(sendFrame("a")));
    box.onAck(refused("a", "not_friends"));
    await settle();
    assert.ok(r.error instanceof SendError);
    assert.equal((r.error as SendError).code, "not_friends");
    assert.equal(box.size, 0);
    mock.timers.tick(60000);
    assert.equal(frames.length, 1);
  });

  test("a send with no ack by its deadline rejects with ImTimeoutError", async () => {
    const { write } = fake();
    const box = new Outbox(write, { ackTimeoutMs: 1000, sendTimeoutMs: 5000 });
    const r = track(box.send(sendFrame("a")));
    mock.timers.tick(4999);
    await settle();
    assert.equal(r.done, false);
    mock.timers.tick(1);
    await settle();
    assert.ok(r.error instanceof ImTimeoutError);
    assert.equal(box.size, 0);
  });

  test("rejectAll rejects every unacked send", async () => {
    const { write } = fake();
    const box = new Outbox(write);
    const a = track(box.send(sendFrame("a")));
    const b = track(box.send(sendFrame("b")));
    const err = new Error("closed");
    box.rejectAll(err);
    await settle();
    assert.equal(a.error, err);
    assert.equal(b.error, err);
    assert.equal(box.size, 0);
  });
});
