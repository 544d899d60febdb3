// REST: one session (a bearer token) against one server. Every non-2xx answer throws
// ApiError(status, code, message); 204 resolves to undefined.

import { type AbortSignalLike, type FetchLike, g } from "./env.js";
import { apiErrorOf } from "./errors.js";
import type {
  AckOk,
  Cleared,
  Conversation,
  ConversationSettings,
  DownloadLink,
  Edited,
  Friend,
  FriendRequestSent,
  FriendRequests,
  GroupCreated,
  GroupMember,
  GroupState,
  HistoryPage,
  MembersAdded,
  Presence,
  PushConfig,
  PushRegistration,
  PushRegistrationBody,
  PublicUser,
  ReadResult,
  Receipts,
  Recalled,
  Registered,
  SearchPage,
  SessionInfo,
  SessionToken,
  SingleState,
  SyncPage,
  Unread,
  UploadTicket,
  UserProfile,
} from "./wire.js";

export type Query = Record<string, string | number | boolean | null | undefined>;

export interface HistoryQuery {
  begin?: number;
  end?: number;
  limit?: number;
  order?: "asc" | "desc";
}

export interface SendOptions {
  contentType?: string;
  clientMsgId?: string;
  mentions?: number[];
  mentionAll?: boolean;
  replyTo?: number;
}

export const convPath = (convId: string): string =>
  "/v1/conversations/" + encodeURIComponent(convId).replace(/%3A/gi, ":");

function resolveFetch(f?: FetchLike): FetchLike {
  const fn = f ?? g.fetch;
  if (!fn) throw new Error("no fetch: pass the `fetch` option");
  return f ? fn : (url, init) => (g.fetch as FetchLike)(url, init);
}

/** A bare REST call with no session (register, login). */
export async function rawRequest<T>(
  fetchFn: FetchLike | undefined,
  baseUrl: string,
  method: string,
  path: string,
  body?: unknown,
  token?: string,
  query?: Query,
  signal?: AbortSignalLike,
): Promise<T> {
  const headers: Record<string, string> = { accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  if (token) headers.authorization = `Bearer ${token}`;
  let url = baseUrl.replace(/\/+$/, "") + path;
  if (query) {
    const parts = Object.entries(query)
      .filter(([, v]) => v !== undefined && v !== null)
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`);
    if (parts.length) url += (url.includes("?") ? "&" : "?") + parts.join("&");
  }
  const res = await resolveFetch(fetchFn)(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  const text = await res.text();
  if (!res.ok) throw apiErrorOf(res.status, text);
  return (res.status === 204 || text === "" ? undefined : JSON.parse(text)) as T;
}

/** The REST API of one session. `ImClient.api` is one of these. */
export class Http {
  constructor(
    readonly baseUrl: string,
    readonly token: string,
    private readonly fetchFn?: FetchLike,
  ) {}

  request<T = unknown>(
    method: string,
    path: string,
    body?: unknown,
    query?: Query,
    signal?: AbortSignalLike,
  ): Promise<T> {
    return rawRequest<T>(this.fetchFn, this.baseUrl, method, path, body, this.token, query, signal);
  }

  static async register(
    baseUrl: string,
    username: string,
    password: string,
    displayName?: string,
    fetchFn?: FetchLike,
  ): Promise<Registered> {
    const body: Record<string, string> = { username, password };
    if (displayName) body.display_name = displayName;
    return rawRequest<Registered>(fetchFn, baseUrl, "POST", "/v1/users", body);
  }

  static async login(
    baseUrl: string,
    username: string,
    password: string,
    deviceId?: string,
    fetchFn?: FetchLike,
  ): Promise<SessionToken> {
    const body: Record<string, string> = { username, password };
    if (deviceId) body.device_id = deviceId;
    return rawRequest<SessionToken>(fetchFn, baseUrl, "POST", "/v1/sessions", body);
  }

  // accounts and sessions
  me = (): Promise<PublicUser> => this.request("GET", "/v1/me");
  logout = (): Promise<void> => this.request("DELETE", "/v1/sessions/current");
  sessions = (): Promise<SessionInfo[]> => this.request("GET", "/v1/sessions");
  lookupUser = (username: string): Promise<PublicUser> =>
    this.request("GET", "/v1/users/lookup", undefined, { username });
  user = (userId: number): Promise<UserProfile> => this.request("GET", `/v1/users/${userId}`);
  /** End one session of mine (by its device id). */
  revokeSession = (deviceId: string): Promise<void> =>
    this.request("DELETE", `/v1/sessions/${encodeURIComponent(deviceId)}`);
  /** End every session of mine, this one too. */
  logoutEverywhere = (): Promise<void> => this.request("DELETE", "/v1/sessions");
  /** A 401 here is a wrong password, not a dead session. */
  deleteAccount = (password: string): Promise<void> => this.request("DELETE", "/v1/me", { password });
  /** Every other session of mine is revoked. A 401 here is a wrong old password. */
  changePassword = (oldPassword: string, newPassword: string): Promise<void> =>
    this.request("PUT", "/v1/me/password", { old_password: oldPassword, new_password: newPassword });

  // friends and blocks
  requestFriend = (toUserId: number, note?: string): Promise<FriendRequestSent> =>
    this.request("POST", "/v1/friends/requests", { to_user_id: toUserId, note: note ?? "" });
  friendRequests = (): Promise<FriendRequests> => this.request("GET", "/v1/friends/requests");
  acceptFriend = (requestId: number): Promise<Conversation> =>
    this.request("POST", `/v1/friends/requests/${requestId}/accept`);
  /** Decline a request to me (its sender is not told). */
  declineFriend = (requestId: number): Promise<void> =>
    this.request("POST", `/v1/friends/requests/${requestId}/decline`);
  /** Cancel a request I sent. */
  cancelFriendRequest = (requestId: number): Promise<void> =>
    this.request("DELETE", `/v1/friends/requests/${requestId}`);
  friends = (): Promise<Friend[]> => this.request("GET", "/v1/friends");
  removeFriend = (userId: number): Promise<void> => this.request("DELETE", `/v1/friends/${userId}`);
  block = (userId: number): Promise<void> => this.request("PUT", `/v1/blocks/${userId}`);
  unblock = (userId: number): Promise<void> => this.request("DELETE", `/v1/blocks/${userId}`);
  presence = (userIds: number[]): Promise<Presence[]> =>
    this.request("GET", "/v1/presence", undefined, { user_ids: userIds.join(",") });

  // push: a browser's Web Push subscription is registered like a phone's token
  pushConfig = (): Promise<PushConfig> => this.request("GET", "/v1/push/config");
  registerPush = (body: PushRegistrationBody): Promise<void> =>
    this.request("PUT", "/v1/push/registration", body);
  unregisterPush = (): Promise<void> => this.request("DELETE", "/v1/push/registration");
  pushRegistrations = (): Promise<PushRegistration[]> => this.request("GET", "/v1/push/registrations");

  // groups
  createGroup = (name: string, memberIds: number[]): Promise<GroupCreated> =>
    this.request("POST", "/v1/groups", { name, member_ids: memberIds });
  addMembers = (groupId: number, userIds: number[], withHistory = false): Promise<MembersAdded> =>
    this.request("POST", `/v1/groups/${groupId}/members`, {
      user_ids: userIds,
      with_history: withHistory,
    });
  kick = (groupId: number, userId: number): Promise<void> =>
    this.request("DELETE", `/v1/groups/${groupId}/members/${userId}`);
  /** Mute a member until a time (ms since the epoch; 0 lifts it). Owner/admins. */
  muteMember = (groupId: number, userId: number, until: number): Promise<void> =>
    this.request("PUT", `/v1/groups/${groupId}/members/${userId}/mute`, { until });
  leave = (groupId: number): Promise<void> => this.request("POST", `/v1/groups/${groupId}/leave`);
  members = (groupId: number): Promise<GroupMember[]> =>
    this.request("GET", `/v1/groups/${groupId}/members`);

  // conversations
  conversations = (): Promise<Array<SingleState | GroupState>> =>
    this.request("GET", "/v1/conversations");
  history = (convId: string, q: HistoryQuery = {}, signal?: AbortSignalLike): Promise<HistoryPage> =>
    this.request("GET", convPath(convId) + "/messages", undefined, { ...q }, signal);
  sendRest = (
    convId: string,
    content: Record<string, unknown>,
    clientMsgId: string,
    opts: SendOptions = {},
  ): Promise<AckOk> =>
    this.request("POST", convPath(convId) + "/messages", sendBody(content, clientMsgId, opts));
  readRest = (convId: string, seq: number): Promise<ReadResult> =>
    this.request("POST", convPath(convId) + "/read", { seq });
  clear = (convId: string): Promise<Cleared> => this.request("POST", convPath(convId) + "/clear");
  hide = (convId: string): Promise<void> => this.request("DELETE", convPath(convId));
  recall = (convId: string, seq: number): Promise<Recalled> =>
    this.request("POST", `${convPath(convId)}/messages/${seq}/recall`);
  edit = (convId: string, seq: number, content: Record<string, unknown>): Promise<Edited> =>
    this.request("POST", `${convPath(convId)}/messages/${seq}/edit`, { content });
  react = (convId: string, seq: number, emoji: string): Promise<void> =>
    this.request("PUT", `${convPath(convId)}/messages/${seq}/reactions/${encodeURIComponent(emoji)}`);
  unreact = (convId: string, seq: number, emoji: string): Promise<void> =>
    this.request("DELETE", `${convPath(convId)}/messages/${seq}/reactions/${encodeURIComponent(emoji)}`);
  receipts = (convId: string, seq: number): Promise<Receipts> =>
    this.request("GET", `${convPath(convId)}/messages/${seq}/receipts`);
  settings = (
    convId: string,
    s: { muted?: boolean; pinned?: boolean },
  ): Promise<ConversationSettings> => this.request("PUT", convPath(convId) + "/settings", s);
  unread = (): Promise<Unread> => this.request("GET", "/v1/unread");
  search = (
    q: string,
    opts: { convId?: string; limit?: number; before?: string | null } = {},
    signal?: AbortSignalLike,
  ): Promise<SearchPage> =>
    this.request(
      "GET",
      "/v1/search",
      undefined,
      { q, conv_id: opts.convId, limit: opts.limit, before: opts.before },
      signal,
    );

  // attachments: a presigned PUT for the bytes, then send image|file with the upload_id
  createUpload = (contentType: string, size: number, filename?: string): Promise<UploadTicket> =>
    this.request("POST", "/v1/uploads", { content_type: contentType, size, filename });
  /** A short-lived download URL of an upload (or of its thumbnail: 404 until it is made). */
  uploadLink = (uploadId: string, thumbnail = false): Promise<DownloadLink> =>
    this.request(
      "GET",
      `/v1/uploads/${encodeURIComponent(uploadId)}${thumbnail ? "/thumbnail" : ""}`,
      undefined,
      { redirect: false },
    );
  sync = (
    q: { since: number; wait?: number; limit?: number; recent?: number },
    signal?: AbortSignalLike,
  ): Promise<SyncPage> => this.request("GET", "/v1/sync", undefined, { ...q }, signal);
}

export function sendBody(
  content: Record<string, unknown>,
  clientMsgId: string,
  opts: SendOptions,
): Record<string, unknown> {
  const body: Record<string, unknown> = {
    client_msg_id: clientMsgId,
    content_type: opts.contentType ?? "text",
    content,
  };
  if (opts.mentions?.length) body.mentions = opts.mentions;
  if (opts.mentionAll) body.mention_all = true;
  if (opts.replyTo !== undefined) body.reply_to = opts.replyTo;
  return body;
}
