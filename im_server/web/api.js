// REST: the SDK's Http (im_server/web/sdk, compiled from sdk/typescript) makes every
// call; this wrapper only holds the session's token, shapes errors for the views
// (ApiError {status, code, message}: the server's message; status 0: unreachable) and
// tells the page when a live token is refused (401).

import { ApiError as SdkApiError, Http } from './sdk/index.js';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

// calls whose 401 answers the request itself (a wrong password), not a dead token
const KEEP_SESSION = new Set(['deleteAccount', 'changePassword']);

export class Api {
  constructor(base = '') {
    this.base = base;
    this.http = new Http(base, '');
    this.onUnauthorized = null; // called when a request with a token answers 401
    // every REST call of the SDK, through the wrapper: api.friends(), api.history(...)...
    for (const name of Object.keys(this.http)) {
      if (typeof this.http[name] !== 'function' || name in this) continue;
      this[name] = (...args) => this.call((h) => h[name](...args), KEEP_SESSION.has(name));
    }
  }

  get token() { return this.http.token || null; }
  set token(t) { this.http = new Http(this.base, t || ''); }

  async call(fn, keepSession = false) {
    const token = this.token;
    try {
      const r = await fn(this.http);
      return r === undefined ? null : r;
    } catch (e) {
      if (e && e.name === 'AbortError') throw e;
      if (!(e instanceof SdkApiError)) throw new ApiError(0, 'network', 'network error: the server cannot be reached');
      const err = new ApiError(e.status, e.code, e.detail || `HTTP ${e.status}`);
      const live = token && token === this.token; // a late answer of an ended session is no news
      if (e.status === 401 && live && !keepSession && this.onUnauthorized) this.onUnauthorized(err);
      throw err;
    }
  }

  // the ones without a session, and the search signature the views use
  register(username, password) { return this.call(() => Http.register(this.base, username, password)); }
  login(username, password, deviceId) { return this.call(() => Http.login(this.base, username, password, deviceId)); }
  search(q, { convId, limit, before, signal } = {}) {
    return this.call((h) => h.search(q, { convId, limit, before }, signal));
  }
}
