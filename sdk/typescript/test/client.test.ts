// The TypeScript client against a real server (started here, restarted once).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import WS from "ws";

import { ImClient, type ImClientOptions, MemoryStorage, type Message, type WebSocketConstructor } from "../src/index.js";
import { TestServer } from "./server.js";

let server: TestServer;
const run = Math.random().toString(36).slice(2, 8);
let n = 0;
const opts: ImClientOptions = { backoff: { baseMs: 100, maxMs: 1000, connectTimeoutMs: 2000 }, ackTimeoutMs: 3000 };
const clients: ImClient[] = [];

async function user(name: string, extra: ImClientOptions & { deviceId?: string } = {}): Promise<ImClient> {
  const c = await ImClient.register(server.url, `${name}${run}${n++}`, "password-1", { ...opts, ...extra });
  clients.push(c);
  return c;
}

async function login(c: ImClient, deviceId: string, extra: ImClientOptions = {}): Promise<ImClient> {
  const me = await c.api.me();
  const d = await ImClient.login(server.url, me.username, "password-1", { ...opts, ...extra, deviceId });
  clients.push(d);
  return d;
}

async function friends(a: ImClient, b: ImClient): Promise<string> {
  const sent = await a.api.requestFriend(b.userId);
  const { conv_id } = await b.api.acceptFriend(sent.request_id);
  return conv_id;
}

async function until<T>(what: string, fn: () => T | Promise<T>, timeoutMs = 20000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Every message of a conversation, through history pages of `limit`, oldest first. */
async function allHistory(c: ImClient, conv: string, limit = 50): Promise<Message[]> {
  const out: Message[] = [];
  let before: number | undefined;
  for (;;) {
    const page = await c.history(conv, { before, limit });
    out.unshift(...page.messages);
    if (page.next_before === null) return out;
    before = page.next_before;
  }
}

before(async () => {
  server = await TestServer.create();
});

after(async () => {
  for (const c of clients) await c.close().catch(() => undefined);
  await server?.destroy();
});

describe("ImClient", () => {
  test("sends and pushes between two clients", async () => {
    const alice = await user("alice");
    const bob = await user("bob");
    const conv = await friends(alice, bob);
    assert.equal(conv, `s:${Math.min(alice.userId, bob.userId)}:${Math.max(alice.userId, bob.userId)}`);
    await alice.connect();
    await bob.connect();
    const got: Message[] = [];
    bob.on("message", (m) => {
      if (m.content_type === "text") got.push(m);
    });
    const typing: number[] = [];
    bob.on("typing", (t) => typing.push(t.user_id));
    const peerRead: number[] = [];
    alice.on("read", (r) => peerRead.push(r.seq));
    const delivered: number[] = [];
    alice.on("delivered", (d) => delivered.push(d.seq));

    assert.ok(alice.typing(conv));
    const ack = await alice.send(conv, { text: "hi" });
    assert.equal(ack.ok, true);
    assert.equal(ack.duplicate, false);
    const ack2 = await alice.send(conv, "second");
    assert.equal(ack2.seq, ack.seq + 1);
    await until("bob gets both", () => got.length === 2);
    assert.deepEqual(got.map((m) => [m.seq, m.content]), [
      [ack.seq, { text: "hi" }],
      [ack2.seq, { text: "second" }],
    ]);
    await until("typing", () => typing.includes(alice.userId));
    assert.equal(bob.state.get(conv)?.unread, 2);
    await until("delivered reported by itself", () => delivered.includes(ack2.seq));
    await bob.read(conv, ack2.seq);
    assert.equal(bob.state.get(conv)?.unread, 0);
    await until("alice sees bob's read", () => peerRead.includes(ack2.seq));
    assert.equal(alice.state.get(conv)?.peer_read_seq, ack2.seq);

    // the same client_msg_id twice is one message
    const again = await alice.send(conv, { text: "hi" }, { clientMsgId: ack.client_msg_id });
    assert.equal(again.seq, ack.seq);
    assert.equal(again.duplicate, true);
  });

  test("reconnects through a server restart and retries unacked sends once each", async () => {
    const alice = await user("alice");
    const bob = await user("bob");
    const conv = await friends(alice, bob);
    await alice.connect();
    await bob.connect();
    const bobGot = new Map<number, Message>();
    let bobDupes = 0;
    bob.on("message", (m) => {
      if (m.conv_id !== conv || m.content_type !== "text") return;
      if (bobGot.has(m.seq)) bobDupes += 1;
      bobGot.set(m.seq, m);
    });
    const statuses: string[] = [];
    alice.on("connection", (s) => statuses.push(s));

    const before = Array.from({ length: 30 }, (_, i) => alice.send(conv, { text: `before ${i}` }));
    // stop while some of those may still be in flight
    await server.stop();
    await until("alice sees the drop", () => !alice.connected);
    const during = Array.from({ length: 20 }, (_, i) => alice.send(conv, { text: `during ${i}` }));
    assert.ok(alice.unacked >= 20);
    await server.start();
    const acks = await Promise.all([...before, ...during]);
    assert.equal(alice.unacked, 0);
    assert.ok(statuses.includes("open"), "reconnected by itself");
    const ids = new Set(acks.map((a) => a.client_msg_id));
    assert.equal(ids.size, 50);
    assert.equal(new Set(acks.map((a) => a.seq)).size, 50, "one seq per send");

    // history: every send exactly once, no loss, no duplicates
    const hist = await until("all 50 persisted", async () => {
      const h = (await allHistory(bob, conv)).filter((m) => m.content_type === "text");
      return h.length >= 50 ? h : null;
    });
    assert.equal(hist.length, 50);
    assert.deepEqual(new Set(hist.map((m) => m.client_msg_id)), ids);
    const texts = hist.map((m) => (m.content as { text: string }).text).sort();
    const expected = [...Array.from({ length: 30 }, (_, i) => `before ${i}`), ...Array.from({ length: 20 }, (_, i) => `during ${i}`)].sort();
    assert.deepEqual(texts, expected);

    // bob got each one once, through pushes or the catch-up after his reconnect
    await until("bob catches up", async () => {
      if (bobGot.size < 50) await bob.sync();
      return bobGot.size === 50;
    });
    await bob.drain();
    assert.equal(bobDupes, 0);
  });

  test("offline catch-up of 10,000 messages over 100 conversations, exactly once", async () => {
    const alice = await user("alice");
    const storage = new MemoryStorage();
    const bob = await user("bob", { storage, deviceId: "phone" });
    const convs: string[] = [];
    for (let i = 0; i < 100; i++) {
      const g = await alice.api.createGroup(`g${i}`, [bob.userId]);
      convs.push(g.conv_id);
    }
    // bob's device knows the groups (system messages included), then goes offline
    await bob.sync();
    await bob.close();

    await alice.connect();
    const t0 = Date.now();
    for (let k = 0; k < 100; k += 10) {
      const batch: Promise<unknown>[] = [];
      for (const conv of convs) for (let j = k; j < k + 10; j++) batch.push(alice.send(conv, { text: `m${j}` }));
      await Promise.all(batch);
    }
    const sendMs = Date.now() - t0;
    await until("persisted", async () => (await bob.api.unread()).total === 10000, 60000);

    // the same device comes back (its state restored from the storage)
    const back = await ImClient.fromToken(server.url, bob.token, bob.userId, "phone", { ...opts, storage });
    clients.push(back);
    const seen = new Map<string, Set<number>>();
    let events = 0;
    back.on("message", (m) => {
      events += 1;
      let s = seen.get(m.conv_id);
      if (!s) seen.set(m.conv_id, (s = new Set()));
      s.add(m.seq);
    });
    const t1 = Date.now();
    const res = await back.sync();
    const syncMs = Date.now() - t1;
    console.log(`# 10,000 sends in ${sendMs} ms; catch-up in ${syncMs} ms`);
    assert.equal(events, 10000);
    assert.equal(res.messages, 10000);
    assert.equal(seen.size, 100);
    for (const conv of convs) assert.equal(seen.get(conv)?.size, 100, conv);
    assert.equal(back.totalUnread, 10000);
    // a second sync finds nothing new
    const again = await back.sync();
    assert.equal(again.messages, 0);
    assert.ok(syncMs < 30000);

    // history paging to the start of one of them
    const conv = convs[7]!;
    const all = await allHistory(back, conv, 15);
    const seqs = all.map((m) => m.seq);
    assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1), "seqs 1..N, no gap, ascending");
    assert.equal(all.filter((m) => m.content_type === "text").length, 100);
    const page = await back.history(conv, { before: seqs[seqs.length - 1]!, limit: 10 });
    assert.deepEqual(page.messages.map((m) => m.seq), seqs.slice(-11, -1));
  });

  test("unread follows reads made on another device of the same user", async () => {
    const alice = await user("alice");
    const bobA = await user("bob", { deviceId: "a" });
    const bobB = await login(bobA, "b");
    const conv = await friends(alice, bobA);
    await alice.connect();
    await bobA.connect();
    await bobB.connect();
    let last = 0;
    for (let i = 0; i < 5; i++) last = (await alice.send(conv, `u${i}`)).seq;
    await until("both devices count 5", () => bobA.state.get(conv)?.unread === 5 && bobB.state.get(conv)?.unread === 5);
    await bobA.read(conv, last - 2);
    assert.equal(bobA.state.get(conv)?.unread, 2);
    await until("device b follows", () => bobB.state.get(conv)?.unread === 2);
    await bobA.read(conv, last);
    await until("device b at zero", () => bobB.state.get(conv)?.unread === 0 && bobB.state.get(conv)?.read_seq === last);
    await bobB.sync();
    assert.equal(bobB.state.get(conv)?.unread, 0);
    assert.equal((await bobB.api.unread()).total, 0);
    // and the long poll carries changes while a device has no socket
    const bobC = await login(bobA, "c");
    await bobC.sync();
    bobC.startPolling();
    const polled: Message[] = [];
    bobC.on("message", (m) => polled.push(m));
    const ack = await alice.send(conv, "while polling");
    await until("long poll delivers", () => polled.some((m) => m.seq === ack.seq));
    assert.equal(bobC.state.get(conv)?.unread, 1);
  });

  test("loads the `ws` package by itself where there is no global WebSocket (Node 20)", async () => {
    // as on Node 20 without a flag: no global WebSocket, and no constructor passed
    const saved = Object.getOwnPropertyDescriptor(globalThis, "WebSocket");
    delete (globalThis as { WebSocket?: unknown }).WebSocket;
    try {
      assert.equal((globalThis as { WebSocket?: unknown }).WebSocket, undefined);
      const alice = await user("alice");
      const bob = await user("bob");
      const conv = await friends(alice, bob);
      await alice.connect();
      await bob.connect();
      assert.ok(alice.connected && bob.connected);
      const got: Message[] = [];
      bob.on("message", (m) => {
        if (m.conv_id === conv && m.content_type === "text") got.push(m);
      });
      const ack = await alice.send(conv, { text: "found ws by itself" });
      assert.equal(ack.ok, true);
      await until("bob gets the push", () => got.length === 1);
      assert.deepEqual(got[0]?.content, { text: "found ws by itself" });
    } finally {
      if (saved) Object.defineProperty(globalThis, "WebSocket", saved);
    }
  });

  test("runs on the `ws` package passed as the WebSocket option (Node 20 without a global)", async () => {
    // counts the sockets made, so the test shows `ws` carried them, not a global WebSocket
    let made = 0;
    class CountingWS extends WS {
      constructor(url: string) {
        super(url);
        made += 1;
      }
    }
    const WebSocket = CountingWS as unknown as WebSocketConstructor;
    const alice = await user("alice", { WebSocket });
    const bob = await user("bob", { WebSocket });
    const conv = await friends(alice, bob);
    await alice.connect();
    await bob.connect();
    assert.ok(alice.connected && bob.connected);
    assert.equal(made, 2);
    const got: Message[] = [];
    bob.on("message", (m) => {
      if (m.conv_id === conv && m.content_type === "text") got.push(m);
    });
    const ack = await alice.send(conv, { text: "over ws" });
    assert.equal(ack.ok, true);
    await until("bob gets the push", () => got.length === 1);
    assert.deepEqual([got[0]?.seq, got[0]?.content], [ack.seq, { text: "over ws" }]);
    // and back the other way
    const aliceGot: Message[] = [];
    alice.on("message", (m) => {
      if (m.conv_id === conv && m.content_type === "text") aliceGot.push(m);
    });
    const ack2 = await bob.send(conv, "reply");
    await until("alice gets the reply", () => aliceGot.some((m) => m.seq === ack2.seq));
    assert.equal(ack2.seq, ack.seq + 1);
  });
});
