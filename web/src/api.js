// The coordinator's REST API, same origin. The bearer token from
// POST /api/v1/session lives in sessionStorage (per tab, gone when the tab
// closes) and goes out in the Authorization header; no cookies, so no
// cross-site request can act with it.

const KEY = 'crowdtrain.session';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function session() {
  try {
    const s = JSON.parse(sessionStorage.getItem(KEY) || 'null');
    if (s && s.token && s.expires_at * 1000 > Date.now()) return s;
  } catch (e) { /* a damaged entry counts as logged out */ }
  return null;
}

export function role() {
  const s = session();
  return s ? s.role : 'anonymous';
}

let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

async function request(method, path, body, { raw = false } = {}) {
  const headers = {};
  const s = session();
  if (s) headers.Authorization = `Bearer ${s.token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store', credentials: 'omit',
  });
  if (raw && r.ok) return r;
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (e) { json = null; }
  if (!r.ok) {
    const err = (json && json.error) || {};
    if (r.status === 401 && s) {
      sessionStorage.removeItem(KEY);
      onUnauthorized();
    }
    throw new ApiError(r.status, err.code || `http_${r.status}`, err.message || `${method} ${path}: HTTP ${r.status}`);
  }
  return json;
}

export const api = {
  get: (p, o) => request('GET', p, undefined, o),
  post: (p, b) => request('POST', p, b === undefined ? {} : b),
  put: (p) => request('PUT', p),
  patch: (p, b) => request('PATCH', p, b),
  del: (p) => request('DELETE', p),
};

export async function login(username, password) {
  const r = await request('POST', '/api/v1/session', { username, password });
  sessionStorage.setItem(KEY, JSON.stringify({
    token: r.token, expires_at: r.expires_at, username: r.username, role: r.role,
  }));
  return r;
}

export async function logout() {
  try { await request('DELETE', '/api/v1/session'); } catch (e) { /* already gone */ }
  sessionStorage.removeItem(KEY);
}

// Path segment of a run or user name (they are [A-Za-z0-9_.-], but encode anyway).
export const seg = (s) => encodeURIComponent(s);
