// REST: one session (a bearer token) against one server. Every non-2xx answer throws
// ApiError(status, code, message); 204 resolves to undefined.
import { g } from "./env.js";
import { apiErrorOf } from "./errors.js";
export const convPath = (convId) => "/v1/conversations/" + encodeURIComponent(convId).replace(/%3A/gi, ":");
function resolveFetch(f) {
    const fn = f ?? g.fetch;
    if (!fn)
        throw new Error("no fetch: pass the `fetch` option");
    return f ? fn : (url, init) => g.fetch(url, init);
}
/** A bare REST call with no session (register, login). */
export async function rawRequest(fetchFn, baseUrl, method, path, body, token, query, signal) {
    const headers = { accept: "application/json" };
    if (body !== undefined)
        headers["content-type"] = "application/json";
    if (token)
        headers.authorization = `Bearer ${token}`;
    let url = baseUrl.replace(/\/+$/, "") + path;
    if (query) {
        const parts = Object.entries(query)
            .filter(([, v]) => v !== undefined && v !== null)
            .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`);
        if (parts.length)
            url += (url.includes("?") ? "&" : "?") + parts.join("&");
    }
    const res = await resolveFetch(fetchFn)(url, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
    });
    const text = await res.text();
    if (!res.ok)
        throw apiErrorOf(res.status, text);
    return (res.status === 204 || text === "" ? undefined : JSON.parse(text));
}
/** The REST API of one session. `ImClient.api` is one of these. */
export class Http {
    baseUrl;
    token;
    fetchFn;
    constructor(baseUrl, token, fetchFn) {
        this.baseUrl = baseUrl;
        this.token = token;
        this.fetchFn = fetchFn;
    }
    request(method, path, body, query, signal) {
        return rawRequest(this.fetchFn, this.baseUrl, method, path, body, this.token, query, signal);
    }
    static async register(baseUrl, username, password, displayName, fetchFn) {
        const body = { username, password };
        if (displayName)
            body.display_name = displayName;
        return rawRequest(fetchFn, baseUrl, "POST", "/v1/users", body);
    }
    static async login(baseUrl, username, password, deviceId, fetchFn) {
        const body = { username, password };
        if (deviceId)
            body.device_id = deviceId;
        return rawRequest(fetchFn, baseUrl, "POST", "/v1/sessions", body);
    }
    // accounts and sessions
    me = () => this.request("GET", "/v1/me");
    logout = () => this.request("DELETE", "/v1/sessions/current");
    sessions = () => this.request("GET", "/v1/sessions");
    lookupUser = (username) => this.request("GET", "/v1/users/lookup", undefined, { username });
    user = (userId) => this.request("GET", `/v1/users/${userId}`);
    /** End one session of mine (by its device id). */
    revokeSession = (deviceId) => this.request("DELETE", `/v1/sessions/${encodeURIComponent(deviceId)}`);
    /** End every session of mine, this one too. */
    logoutEverywhere = () => this.request("DELETE", "/v1/sessions");
    /** A 401 here is a wrong password, not a dead session. */
    deleteAccount = (password) => this.request("DELETE", "/v1/me", { password });
    /** Every other session of mine is revoked. A 401 here is a wrong old password. */
    changePassword = (oldPassword, newPassword) => this.request("PUT", "/v1/me/password", { old_password: oldPassword, new_password: newPassword });
    // friends and blocks
    requestFriend = (toUserId, note) => this.request("POST", "/v1/friends/requests", { to_user_id: toUserId, note: note ?? "" });
    friendRequests = () => this.request("GET", "/v1/friends/requests");
    acceptFriend = (requestId) => this.request("POST", `/v1/friends/requests/${requestId}/accept`);
    /** Decline a request to me (its sender is not told). */
    declineFriend = (requestId) => this.request("POST", `/v1/friends/requests/${requestId}/decline`);
    /** Cancel a request I sent. */
    cancelFriendRequest = (requestId) => this.request("DELETE", `/v1/friends/requests/${requestId}`);
    friends = () => this.request("GET", "/v1/friends");
    removeFriend = (userId) => this.request("DELETE", `/v1/friends/${userId}`);
    block = (userId) => this.request("PUT", `/v1/blocks/${userId}`);
    unblock = (userId) => this.request("DELETE", `/v1/blocks/${userId}`);
    presence = (userIds) => this.request("GET", "/v1/presence", undefined, { user_ids: userIds.join(",") });
    // push: a browser's Web Push subscription is registered like a phone's token
    pushConfig = () => this.request("GET", "/v1/push/config");
    registerPush = (body) => this.request("PUT", "/v1/push/registration", body);
    unregisterPush = () => this.request("DELETE", "/v1/push/registration");
    pushRegistrations = () => this.request("GET", "/v1/push/registrations");
    // groups
    createGroup = (name, memberIds) => this.request("POST", "/v1/groups", { name, member_ids: memberIds });
    addMembers = (groupId, userIds, withHistory = false) => this.request("POST", `/v1/groups/${groupId}/members`, {
        user_ids: userIds,
        with_history: withHistory,
    });
    kick = (groupId, userId) => this.request("DELETE", `/v1/groups/${groupId}/members/${userId}`);
    /** Mute a member until a time (ms since the epoch; 0 lifts it). Owner/admins. */
    muteMember = (groupId, userId, until) => this.request("PUT", `/v1/groups/${groupId}/members/${userId}/mute`, { until });
    leave = (groupId) => this.request("POST", `/v1/groups/${groupId}/leave`);
    members = (groupId) => this.request("GET", `/v1/groups/${groupId}/members`);
    // conversations
    conversations = () => this.request("GET", "/v1/conversations");
    history = (convId, q = {}, signal) => this.request("GET", convPath(convId) + "/messages", undefined, { ...q }, signal);
    sendRest = (convId, content, clientMsgId, opts = {}) => this.request("POST", convPath(convId) + "/messages", sendBody(content, clientMsgId, opts));
    readRest = (convId, seq) => this.request("POST", convPath(convId) + "/read", { seq });
    clear = (convId) => this.request("POST", convPath(convId) + "/clear");
    hide = (convId) => this.request("DELETE", convPath(convId));
    recall = (convId, seq) => this.request("POST", `${convPath(convId)}/messages/${seq}/recall`);
    edit = (convId, seq, content) => this.request("POST", `${convPath(convId)}/messages/${seq}/edit`, { content });
    react = (convId, seq, emoji) => this.request("PUT", `${convPath(convId)}/messages/${seq}/reactions/${encodeURIComponent(emoji)}`);
    unreact = (convId, seq, emoji) => this.request("DELETE", `${convPath(convId)}/messages/${seq}/reactions/${encodeURIComponent(emoji)}`);
    receipts = (convId, seq) => this.request("GET", `${convPath(convId)}/messages/${seq}/receipts`);
    settings = (convId, s) => this.request("PUT", convPath(convId) + "/settings", s);
    unread = () => this.request("GET", "/v1/unread");
    search = (q, opts = {}, signal) => this.request("GET", "/v1/search", undefined, { q, conv_id: opts.convId, limit: opts.limit, before: opts.before }, signal);
    // attachments: a presigned PUT for the bytes, then send image|file with the upload_id
    createUpload = (contentType, size, filename) => this.request("POST", "/v1/uploads", { content_type: contentType, size, filename });
    /** A short-lived download URL of an upload (or of its thumbnail: 404 until it is made). */
    uploadLink = (uploadId, thumbnail = false) => this.request("GET", `/v1/uploads/${encodeURIComponent(uploadId)}${thumbnail ? "/thumbnail" : ""}`, undefined, { redirect: false });
    sync = (q, signal) => this.request("GET", "/v1/sync", undefined, { ...q }, signal);
}
export function sendBody(content, clientMsgId, opts) {
    const body = {
        client_msg_id: clientMsgId,
        content_type: opts.contentType ?? "text",
        content,
    };
    if (opts.mentions?.length)
        body.mentions = opts.mentions;
    if (opts.mentionAll)
        body.mention_all = true;
    if (opts.replyTo !== undefined)
        body.reply_to = opts.replyTo;
    return body;
}
