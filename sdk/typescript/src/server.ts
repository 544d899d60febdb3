// The server API's client, for an app's backend (Node, Deno, Bun): X-Api-Key on every
// call, an optional Idempotency-Key on every write. A separate entry point
// ("im-server-client/server") that the browser entry never imports, so a web bundle
// never carries it (nor, by mistake, an API key).

import { type FetchLike, g } from "./env.js";
import { apiErrorOf } from "./errors.js";
import type {
  AckOk,
  AppUserInfo,
  AppUserWritten,
  Conversation,
  GroupCreated,
  ImportedId,
  ImportedUser,
  MintedToken,
} from "./wire.js";

export interface WriteOptions {
  /** the same key and request within 24 h get the first answer and change nothing again */
  idempotencyKey?: string;
}

export interface ServerSendOptions extends WriteOptions {
  contentType?: string;
  mentions?: number[];
  replyTo?: number;
}

export class ServerClient {
  private readonly baseUrl: string;
  private readonly fetchFn: FetchLike;

  constructor(
    baseUrl: string,
    private readonly apiKey: string,
    opts: { fetch?: FetchLike } = {},
  ) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    const f = opts.fetch ?? g.fetch;
    if (!f) throw new Error("no fetch: pass the `fetch` option");
    this.fetchFn = opts.fetch ?? ((url, init) => (g.fetch as FetchLike)(url, init));
  }

  /** One call: the decoded body (undefined for 204); ApiError for any non-2xx. */
  async request<T = unknown>(method: string, path: string, body?: unknown, opts: WriteOptions = {}): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json", "x-api-key": this.apiKey };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (opts.idempotencyKey !== undefined) headers["idempotency-key"] = opts.idempotencyKey;
    const res = await this.fetchFn(this.baseUrl + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
      if (!res.ok) throw apiErrorOf(res.status, text);
    return (res.status === 204 || text === "" ? undefined : JSON.parse(text)) as T;
  }

  // ---- users ---------------------------------------------------------------------

  putUser(
    externalId: string,
    fields: { displayName?: string; kind?: "user" | "bot" } = {},
    opts: WriteOptions = {},
  ): Promise<AppUserWritten> {
    const body: Record<string, string> = {};
    if (fields.displayName !== undefined) body.display_name = fields.displayName;
    if (fields.kind !== undefined) body.kind = fields.kind;
    return this.request("PUT", userPath(externalId), body, opts);
  }

  async importUsers(users: ImportedUser[], opts: WriteOptions = {}): Promise<ImportedId[]> {
    const r = await this.request<{ users: ImportedId[] }>("POST", "/v1/server/users/import", { users }, opts);
    return r.users;
  }

  getUser(externalId: string): Promise<AppUserInfo> {
    return this.request("GET", userPath(externalId));
  }

  async deleteUser(externalId: string): Promise<void> {
    await this.request("DELETE", userPath(externalId));
  }

  mintToken(
    externalId: string,
    fields: { deviceId?: string; ttlS?: number } = {},
    opts: WriteOptions = {},
  ): Promise<MintedToken> {
    const body: Record<string, string | number> = {};
    if (fields.deviceId !== undefined) body.device_id = fields.deviceId;
    if (fields.ttlS !== undefined) body.ttl_s = fields.ttlS;
    return this.request("POST", userPath(externalId) + "/tokens", body, opts);
  }

  async revokeTokens(externalId: string): Promise<void> {
    await this.request("POST", userPath(externalId) + "/revoke-tokens");
  }

  async befriend(a: string, b: string, opts: WriteOptions = {}): Promise<string> {
    const r = await this.request<Conversation>("POST", "/v1/server/friendships", { a, b }, opts);
    return r.conv_id;
  }

  // ---- messages and groups -------------------------------------------------------

  /** Send as the user `from` (an external id): the same ack, rules and dedupe as its own send. */
  sendMessage(
    from: string,
    convId: string,
    clientMsgId: string,
    content: Record<string, unknown>,
    opts: ServerSendOptions = {},
  ): Promise<AckOk> {
    const body: Record<string, unknown> = {
      from,
      conv_id: convId,
      client_msg_id: clientMsgId,
      content_type: opts.contentType ?? "text",
      content,
    };
    if (opts.mentions?.length) body.mentions = opts.mentions;
    if (opts.replyTo !== undefined) body.reply_to = opts.replyTo;
    return this.request("POST", "/v1/server/messages", body, opts);
  }

  createGroup(name: string, owner: string, members: string[] = [], opts: WriteOptions = {}): Promise<GroupCreated> {
    return this.request("POST", "/v1/server/groups", { name, owner, members }, opts);
  }

  async addMember(groupId: number, externalId: string, withHistory = false): Promise<void> {
    await this.request("PUT", memberPath(groupId, externalId), { with_history: withHistory });
  }

  async removeMember(groupId: number, externalId: string): Promise<void> {
    await this.request("DELETE", memberPath(groupId, externalId));
  }
}

const userPath = (externalId: string): string => "/v1/server/users/" + encodeURIComponent(externalId);
const memberPath = (groupId: number, externalId: string): string =>
  `/v1/server/groups/${groupId}/members/${encodeURIComponent(externalId)}`;

export { ApiError } from "./errors.js";
export type { AckOk, AppUserInfo, AppUserWritten, GroupCreated, ImportedId, ImportedUser, MintedToken } from "./wire.js";
