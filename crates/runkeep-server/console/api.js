// The API client of the console: every call carries the bearer token kept
// in sessionStorage (never in the URL); every error is the server's
// problem details (RFC 9457) as an ApiError.

const KEY = 'runkeep.console.token';

export function getToken() {
  return sessionStorage.getItem(KEY);
}

export function setToken(token) {
  if (token) sessionStorage.setItem(KEY, token);
  else sessionStorage.removeItem(KEY);
}

/** A refused call: `status` and the problem (`type`, `title`, `detail`, …). */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }

  /** The problem's kind: the end of its `type` URI (`conflict`, `fenced-out`, …). */
  get kind() {
    const t = this.problem.type || '';
    return t.startsWith('urn:runkeep:problem:') ? t.slice('urn:runkeep:problem:'.length) : '';
  }
}

/** Called with the ApiError when the token is refused (401). */
let onUnauthorized = () => {};
export function whenUnauthorized(f) {
  onUnauthorized = f;
}

/** One API call; resolves to the parsed JSON body. */
export async function api(path, { method = 'GET', body, signal, token = getToken() } = {}) {
  const headers = { Accept: 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: 'no-store',
      credentials: 'omit',
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, { title: 'Server unreachable', detail: `the server did not answer: ${e.message}` });
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { title: res.statusText, detail: text.slice(0, 300) };
    }
  }
  if (!res.ok) {
    const err = new ApiError(res.status, data);
    // The kept token refused (revoked): sign out. A token being tried at
    // sign-in is not kept yet; the sign-in form says why it failed.
    if (res.status === 401 && token && token === getToken()) onUnauthorized(err);
    throw err;
  }
  return data;
}

const enc = encodeURIComponent;

/** The path of a run's routes (`run` is a listing row's `run` address). */
export function runPath(run, suffix = '') {
  const base = `/v1/tenants/${enc(run.tenantId)}/projects/${enc(run.projectId)}/sessions/${enc(run.sessionId)}/runs/${enc(run.runId)}${suffix}`;
  return run.parentRunId ? `${base}?parent=${enc(run.parentRunId)}` : base;
}

/** `path` with the query parameters of `params` whose value is set. */
export function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  if (!s) return path;
  return path + (path.includes('?') ? '&' : '?') + s;
}
