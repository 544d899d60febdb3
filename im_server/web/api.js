// REST client: JSON in and out, bearer token, errors as ApiError {status, code, message}.

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

export class Api {
  constructor(base = '') {
    this.base = base;
    this.token = null;
    this.onUnauthorized = null; // called when a request with a token answers 401
  }

  // keepSession: a 401 answers the request itself (a wrong password), not a dead token
  async request(method, path, body, { signal, keepSession = false } = {}) {
    const headers = {};
    const token = this.token;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (token) headers['Authorization'] = `Bearer ${token}`;
    let res;
    try {
      res = await fetch(this.base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      });
    } catch (e) {
      if (e.name === 'AbortError') throw e;
      throw new ApiError(0, 'network', 'network error: the server cannot be reached');
    }
    if (res.status === 204) return null;
    let data = null;
    const text = await res.text();
    if (text) {
      try { data = JSON.parse(text); } catch { data = null; }
    }
    if (!res.ok) {
      const err = (data && data.error) || {};
      const e = new ApiError(res.status, err.code || (data && data.detail) || 'error', err.message || `HTTP ${res.status}`);
      const live = token && token === this.token; // a late answer of an ended session is no news
      if (res.status === 401 && live && !keepSession && this.onUnauthorized) this.onUnauthorized(e);
      throw e;
    }
    return data;
  }

  get(path, opts) { return this.request('GET', path, undefined, opts); }
  post(path, body = {}) { return this.request('POST', path, body); }
  put(path, body = {}) { return this.request('PUT', path, body); }
  del(path) { return this.request('DELETE', path); }

  // accounts
  register(username, password) { return this.post('/v1/users', { username, password }); }
  login(username, password, deviceId) {
    const body = { username, password };
    if (deviceId) body.device_id = deviceId;
    return this.post('/v1/sessions', body);
  }
  logout() { return this.del('/v1/sessions/current'); }
  me() { return this.get('/v1/me'); }
  sessions() { return this.get('/v1/sessions'); }
  revokeSession(deviceId) { return this.del(`/v1/sessions/${encodeURIComponent(deviceId)}`); }
  logoutEverywhere() { return this.del('/v1/sessions'); }
  deleteAccount(password) { return this.request('DELETE', '/v1/me', { password }, { keepSession: true }); }
  changePassword(oldPassword, newPassword) {
    const body = { old_password: oldPassword, new_password: newPassword };
    return this.request('PUT', '/v1/me/password', body, { keepSession: true });
  }
  user(userId) { return this.get(`/v1/users/${userId}`); }
  lookupUser(username) { return this.get(`/v1/users/lookup?username=${encodeURIComponent(username)}`); }

  // contacts
  friends() { return this.get('/v1/friends'); }
  friendRequests() { return this.get('/v1/friends/requests'); }
  requestFriend(toUserId, note) { return this.post('/v1/friends/requests', { to_user_id: toUserId, note: note || '' }); }
  acceptFriend(requestId) { return this.post(`/v1/friends/requests/${requestId}/accept`); }

  // groups
  createGroup(name, memberIds) { return this.post('/v1/groups', { name, member_ids: memberIds }); }
  members(groupId) { return this.get(`/v1/groups/${groupId}/members`); }
  addMembers(groupId, userIds, withHistory) {
    return this.post(`/v1/groups/${groupId}/members`, { user_ids: userIds, with_history: !!withHistory });
  }
  kick(groupId, userId) { return this.del(`/v1/groups/${groupId}/members/${userId}`); }
  muteMember(groupId, userId, until) { return this.request('PUT', `/v1/groups/${groupId}/members/${userId}/mute`, { until }); }
  leave(groupId) { return this.post(`/v1/groups/${groupId}/leave`); }

  // conversations
  conversations() { return this.get('/v1/conversations'); }
  history(convId, { begin, end, limit, order } = {}) {
    const q = new URLSearchParams();
    if (begin != null) q.set('begin', begin);
    if (end != null) q.set('end', end);
    if (limit != null) q.set('limit', limit);
    if (order) q.set('order', order);
    return this.get(`/v1/conversations/${encodeURIComponent(convId)}/messages?${q}`);
  }
  sendMessage(convId, clientMsgId, content, contentType = 'text') {
    return this.post(`/v1/conversations/${encodeURIComponent(convId)}/messages`,
      { client_msg_id: clientMsgId, content_type: contentType, content });
  }
  settings(convId, body) { return this.put(`/v1/conversations/${encodeURIComponent(convId)}/settings`, body); }
  read(convId, seq) { return this.post(`/v1/conversations/${encodeURIComponent(convId)}/read`, { seq }); }
  recall(convId, seq) { return this.post(`/v1/conversations/${encodeURIComponent(convId)}/messages/${seq}/recall`); }
  edit(convId, seq, content) {
    return this.post(`/v1/conversations/${encodeURIComponent(convId)}/messages/${seq}/edit`, { content });
  }
  react(convId, seq, emoji) {
    return this.request('PUT', `/v1/conversations/${encodeURIComponent(convId)}/messages/${seq}/reactions/${encodeURIComponent(emoji)}`);
  }
  unreact(convId, seq, emoji) {
    return this.del(`/v1/conversations/${encodeURIComponent(convId)}/messages/${seq}/reactions/${encodeURIComponent(emoji)}`);
  }
  // attachments: a presigned PUT for the bytes (then send image|file with the upload_id)
  createUpload(contentType, size, filename) {
    return this.post('/v1/uploads', { content_type: contentType, size, filename });
  }
  // search: messages I can see containing q, newest first; next_before pages on
  search(q, { convId, limit, before, signal } = {}) {
    const p = new URLSearchParams({ q });
    if (convId) p.set('conv_id', convId);
    if (limit != null) p.set('limit', limit);
    if (before) p.set('before', before);
    return this.get(`/v1/search?${p}`, { signal });
  }
  presence(userIds) { return this.get(`/v1/presence?user_ids=${userIds.join(',')}`); }
  receipts(convId, seq) { return this.get(`/v1/conversations/${encodeURIComponent(convId)}/messages/${seq}/receipts`); }
  sync(since, { wait = 0, recent = 20, limit = 100, signal } = {}) {
    return this.get(`/v1/sync?since=${since}&wait=${wait}&recent=${recent}&limit=${limit}`, { signal });
  }
}
