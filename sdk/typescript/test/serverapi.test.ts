// The server entry ("im-server-client/server") against a real server: a key made with
// `im-server apikey create` on the server's own data folder, users imported, a token
// minted and used by the browser client, a bot that answers.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { after, before, test } from "node:test";

import { ImClient } from "../src/index.js";
import { ApiError, ServerClient } from "../src/server.js";
import { PYTHON, TestServer } from "./server.js";

let server: TestServer;
let app: ServerClient;
const run = Math.random().toString(36).slice(2, 8);
const clients: ImClient[] = [];

before(async () => {
  server = await TestServer.create();
  const made = spawnSync(
    PYTHON,
    ["-m", "im_server", "apikey", "--data-dir", server.dataDir, "create", "--name", `sdk${run}`, "--scope", "all"],
    { encoding: "utf8", timeout: 120000 },
  );
  assert.equal(made.status, 0, made.stderr);
  app = new ServerClient(server.url, made.stdout.trim());
});

after(async () => {
  for (const c of clients) c.close();
  await server?.destroy();
});

test("import users, mint a token, send as a bot", async () => {
  const [ann, bob] = [`ann-${run}`, `bob-${run}`];
  const ids = await app.importUsers([
    { external_id: ann, display_name: "Ann" },
    { external_id: bob, display_name: "Bob" },
  ]);
  assert.deepEqual(
    ids.map((u) => u.external_id),
    [ann, bob],
  );
  const bot = await app.putUser(`helper-${run}`, { displayName: "Helper", kind: "bot" });
  assert.equal(bot.created, true);
  assert.equal((await app.getUser(`helper-${run}`)).kind, "bot");

  const minted = await app.mintToken(ann, { deviceId: "web" });
  const c = await ImClient.fromToken(server.url, minted.token, minted.user_id, minted.device_id);
  clients.push(c);
  const { conv_id } = await c.api.request<{ conv_id: string }>("POST", `/v1/bots/${bot.user_id}/chat`);
  const ack = await app.sendMessage(`helper-${run}`, conv_id, `hello-${run}`, { text: "hi Ann" }, { idempotencyKey: run });
  assert.equal(ack.ok, true);
  const again = await app.sendMessage(`helper-${run}`, conv_id, `hello-${run}`, { text: "hi Ann" }, { idempotencyKey: run });
  assert.equal(again.seq, ack.seq);
  // the bot's message reaches Ann's history once persisted
  const deadline = Date.now() + 15000;
  for (;;) {
    const page = await c.api.request<{ messages: { seq: number; sender_id: number }[] }>(
      "GET",
      `/v1/conversations/${conv_id}/messages`,
    );
    if (page.messages.some((m) => m.seq === ack.seq && m.sender_id === bot.user_id)) break;
    assert.ok(Date.now() < deadline, "the bot's message never reached the history");
    await new Promise((r) => setTimeout(r, 100));
  }

  const group = await app.createGroup("team", ann, [bob]);
  await app.addMember(group.group_id, `helper-${run}`);
  await app.removeMember(group.group_id, `helper-${run}`);
  assert.equal(await app.befriend(ann, bob), `s:${Math.min(ids[0]!.user_id, ids[1]!.user_id)}:${Math.max(ids[0]!.user_id, ids[1]!.user_id)}`);
});

test("errors are ApiError with the contract's code", async () => {
  await assert.rejects(app.getUser(`nobody-${run}`), (e: unknown) => e instanceof ApiError && e.status === 404 && e.code === "not_found");
  const wrong = new ServerClient(server.url, "imk_not-a-key");
  await assert.rejects(wrong.getUser("x"), (e: unknown) => e instanceof ApiError && e.status === 401);
  await app.putUser(`gone-${run}`);
  await app.revokeTokens(`gone-${run}`);
  await app.deleteUser(`gone-${run}`);
  await assert.rejects(app.getUser(`gone-${run}`), (e: unknown) => e instanceof ApiError && e.status === 404);
});
