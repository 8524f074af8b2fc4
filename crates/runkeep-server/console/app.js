// The runkeep console: sign in with a token, the runs table, a run's page
// with its live transcript, park answers and operator actions. A client of
// the /v1 API only; what it offers follows the token's role (whoami).
// Routes are URL hashes, so a run's page is a link:
//   #/runs?show=parked&order=createdAt&project=P&session=S&limit=50
//   #/run/PROJECT/SESSION/RUN[?parent=PARENT]
//   #/schedules

import { api, ApiError, getToken, runPath, setToken, whenUnauthorized, withQuery } from './api.js';
import { tailEvents } from './sse.js';
import { ago, badge, compact, duration, facts, fill, folded, h, isoLocal, jsonBlock, when } from './views.js';

const main = document.getElementById('main');
const statusEl = document.getElementById('status');
const enc = encodeURIComponent;

/** The signed-in identity: `{tenant, role, tokenId}` or null. */
let me = null;
/** Aborted when the view changes (stops its fetches and its tail). */
let viewAbort = new AbortController();

const canOperate = () => me?.role === 'operator';

/** A message in the polite live region (screen readers announce it). */
function say(text, kind = 'info') {
  fill(statusEl, text ? h('p', { class: `msg msg-${kind}` }, text) : null);
}

function problemText(e) {
  if (e instanceof ApiError) {
    const p = e.problem;
    return [p.title, p.detail].filter(Boolean).join(': ') || e.message;
  }
  return String(e?.message || e);
}

// ---------------------------------------------------------------- sign-in

function signOut(message) {
  setToken(null);
  me = null;
  document.getElementById('who').hidden = true;
  document.getElementById('nav').hidden = true;
  viewAbort.abort();
  renderSignIn(message);
}

whenUnauthorized(() => signOut('The server refused the token (revoked or unknown). Sign in again.'));

function renderSignIn(message) {
  document.title = 'Sign in · runkeep console';
  const error = h('p', { class: 'msg msg-error', id: 'signin-error', role: 'alert' }, message || '');
  error.hidden = !message;
  const input = h('input', {
    id: 'token',
    name: 'token',
    type: 'password',
    autocomplete: 'off',
    spellcheck: 'false',
    required: true,
    'aria-describedby': 'token-help',
  });
  const form = h(
    'form',
    {
      class: 'signin',
      onsubmit: async (ev) => {
        ev.preventDefault();
        const token = input.value.trim();
        if (!token) return;
        try {
          const who = await api('/v1/whoami', { token });
          setToken(token);
          signedIn(who);
          route();
        } catch (e) {
          error.hidden = false;
          error.textContent =
            e instanceof ApiError && e.status === 401
              ? 'That token is not known to this server (or it was revoked).'
              : problemText(e);
          input.focus();
        }
      },
    },
    h('h1', {}, 'Sign in'),
    h('label', { for: 'token' }, 'Token'),
    input,
    h(
      'p',
      { id: 'token-help', class: 'help' },
      'A bearer token of this server (',
      h('code', {}, 'runkeep token create'),
      '). It is kept in this tab only and sent with every request; close the tab or sign out to forget it.',
    ),
    error,
    h('button', { type: 'submit' }, 'Sign in'),
  );
  fill(main, form);
  input.focus();
}

function signedIn(who) {
  me = who;
  fill(document.getElementById('who-text'), `${who.tenant} · `, badge(who.role, 'role'), ` · ${who.tokenId}`);
  document.getElementById('who').hidden = false;
  document.getElementById('nav').hidden = false;
}

document.getElementById('sign-out').addEventListener('click', () => signOut('Signed out.'));

// ---------------------------------------------------------------- routing

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/runs';
  const [path, query = ''] = raw.split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query) };
}

async function route() {
  viewAbort.abort();
  viewAbort = new AbortController();
  say('');
  if (!getToken()) return renderSignIn();
  if (!me) {
    try {
      signedIn(await api('/v1/whoami'));
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 401)) renderSignIn(problemText(e));
      return;
    }
  }
  const { parts, params } = parseHash();
  if (parts[0] === 'run' && parts.length === 4) {
    const run = {
      tenantId: me.tenant,
      projectId: parts[1],
      sessionId: parts[2],
      runId: parts[3],
      parentRunId: params.get('parent') || undefined,
    };
    return renderRun(run, viewAbort.signal);
  }
  if (parts[0] === 'schedules') return renderSchedules(viewAbort.signal);
  return renderRuns(params, viewAbort.signal);
}

window.addEventListener('hashchange', route);

function runHref(run) {
  const base = `#/run/${enc(run.projectId)}/${enc(run.sessionId)}/${enc(run.runId)}`;
  return run.parentRunId ? `${base}?parent=${enc(run.parentRunId)}` : base;
}

/** Moves focus to the view's heading, so keyboard and screen-reader users land in it. */
function focusHeading() {
  const h1 = main.querySelector('h1');
  if (h1) {
    h1.setAttribute('tabindex', '-1');
    h1.focus({ preventScroll: false });
  }
}

// ---------------------------------------------------------------- runs table

/** The table's filters: what each asks the listing for. */
const SHOWS = {
  all: { label: 'All runs', query: {} },
  parked: { label: 'Parked (waiting on a person)', query: { park: 'outstanding,expired' } },
  claimed: { label: 'Claimed (held live)', query: { claimed: 'true' } },
  unclaimed: { label: 'Unclaimed', query: { claimed: 'false' } },
  active: { label: 'Active', query: { status: 'active' } },
  finished: { label: 'Finished', query: { status: 'completed,failed,cancelled' } },
  'dead-lettered': { label: 'Dead-lettered', query: { status: 'failed' } },
};
const ORDERS = { runId: 'Run id', createdAt: 'Created (oldest first)' };
const LIMITS = [25, 50, 100, 200];

/** Cursors of the pages before the current one (the "previous" stack), per filter. */
let paging = { key: '', stack: [], cursor: null };

function tableKey(params) {
  const p = new URLSearchParams(params);
  p.delete('cursor');
  return p.toString();
}

function setHashParams(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  location.hash = `#/runs${q.toString() ? `?${q}` : ''}`;
}

async function renderRuns(params, signal) {
  document.title = 'Runs · runkeep console';
  const show = SHOWS[params.get('show')] ? params.get('show') : 'all';
  const order = ORDERS[params.get('order')] ? params.get('order') : 'runId';
  const limit = LIMITS.includes(Number(params.get('limit'))) ? Number(params.get('limit')) : 50;
  const project = params.get('project') || '';
  const session = params.get('session') || '';
  const key = tableKey(params);
  if (paging.key !== key) paging = { key, stack: [], cursor: null };

  const current = { show, order, limit: String(limit), project, session };
  const select = (id, label, value, options, onchange) =>
    h(
      'div',
      { class: 'field' },
      h('label', { for: id }, label),
      h(
        'select',
        { id, name: id, onchange },
        Object.entries(options).map(([v, text]) => h('option', { value: v, selected: v === value }, text)),
      ),
    );
  const text = (id, label, value, placeholder) =>
    h(
      'div',
      { class: 'field' },
      h('label', { for: id }, label),
      h('input', { id, name: id, value, placeholder, autocomplete: 'off', spellcheck: 'false' }),
    );
  const filters = h(
    'form',
    {
      class: 'filters',
      'aria-label': 'Filter the runs',
      onsubmit: (ev) => {
        ev.preventDefault();
        const f = new FormData(ev.target);
        setHashParams({ ...current, project: f.get('project').trim(), session: f.get('session').trim() });
      },
    },
    select('show', 'Show', show, Object.fromEntries(Object.entries(SHOWS).map(([k, v]) => [k, v.label])), (ev) =>
      setHashParams({ ...current, show: ev.target.value }),
    ),
    select('order', 'Order', order, ORDERS, (ev) => setHashParams({ ...current, order: ev.target.value })),
    select('limit', 'Per page', String(limit), Object.fromEntries(LIMITS.map((l) => [l, String(l)])), (ev) =>
      setHashParams({ ...current, limit: ev.target.value }),
    ),
    text('project', 'Project', project, 'every project'),
    text('session', 'Session', session, 'every session'),
    h('div', { class: 'field field-button' }, h('button', { type: 'submit' }, 'Apply')),
  );
  const summary = h('p', { class: 'page-info', id: 'page-info', 'aria-live': 'polite' }, 'Loading…');
  const tableWrap = h('div', { class: 'table-wrap' });
  const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' });
  fill(main, h('h1', {}, 'Runs'), filters, summary, tableWrap, pager);

  const query = {
    ...SHOWS[show].query,
    order,
    limit,
    project: project || undefined,
    session: session || undefined,
    cursor: paging.cursor || undefined,
  };
  let page;
  const started = performance.now();
  try {
    page = await api(withQuery(`/v1/tenants/${enc(me.tenant)}/runs`, query), { signal });
  } catch (e) {
    if (e.name === 'AbortError') return;
    summary.textContent = '';
    say(`Could not list the runs: ${problemText(e)}`, 'error');
    return;
  }
  let rows = page.entries;
  // The row says whether the store dead-lettered the run.
  const dead = new Set(rows.filter((r) => r.deadLettered));
  if (show === 'dead-lettered') rows = rows.filter((r) => dead.has(r));
  const ms = Math.round(performance.now() - started);
  const pageNo = paging.stack.length + 1;
  summary.textContent = `Page ${pageNo}: ${rows.length} run${rows.length === 1 ? '' : 's'}${page.cursor ? ', more after' : ''} (${ms} ms)`;
  summary.dataset.rows = String(rows.length);
  fill(tableWrap, runsTable(rows, dead));
  lastErrors(tableWrap, rows.filter((r) => dead.has(r)), signal);
  const prev = h('button', {
    type: 'button',
    class: 'quiet',
    disabled: paging.stack.length === 0,
    onclick: () => {
      paging.cursor = paging.stack.pop() ?? null;
      route();
    },
  }, '← Previous');
  const next = h('button', {
    type: 'button',
    class: 'quiet',
    disabled: !page.cursor,
    onclick: () => {
      paging.stack.push(paging.cursor);
      paging.cursor = page.cursor;
      route();
    },
  }, 'Next →');
  fill(pager, prev, h('span', {}, `Page ${pageNo}`), next);
}

/**
 * Under each dead-lettered row's status, its last error: one lifecycle
 * read per such row of the page (as `runkeep runs --dead-lettered` does).
 */
async function lastErrors(table, rows, signal) {
  await Promise.all(
    rows.map(async (r) => {
      let l;
      try {
        l = await api(runPath(r.run, '/lifecycle'), { signal });
      } catch {
        return;
      }
      const last = l.failures?.length ? l.failures[l.failures.length - 1] : null;
      const tr = [...table.querySelectorAll('tr[data-run]')].find((t) => t.dataset.run === r.run.runId && t.dataset.scope === scopeKey(r.run));
      const cell = tr?.querySelector('td[data-label=Status] > div');
      if (!last || !cell || signal.aborted) return;
      const message = last.message.length > 120 ? `${last.message.slice(0, 119)}…` : last.message;
      cell.append(h('span', { class: 'sub last-error', title: `${last.kind}: ${last.message}` }, `${last.kind}: ${message}`));
    }),
  );
}

function scopeKey(run) {
  return [run.projectId, run.sessionId, run.parentRunId || ''].join('/');
}

function parkCell(park, now) {
  if (!park) return h('span', { class: 'none' }, '—');
  return h(
    'span',
    {},
    badge(park.state, `park-${park.state}`),
    ' ',
    park.requestType,
    park.state !== 'resolved' && park.deadlineAt
      ? h('span', { class: 'sub' }, park.state === 'expired' ? 'was due ' : 'due ', ago(park.deadlineAt, now))
      : null,
  );
}

function leaseCell(claim, now) {
  if (!claim || !claim.holder) return h('span', { class: 'none' }, '—');
  return h(
    'span',
    {},
    h('span', { class: 'holder' }, claim.holder),
    ` · fence ${claim.fence}`,
    h('span', { class: 'sub' }, claim.expired ? 'expired ' : 'expires ', ago(claim.expiresAt, now)),
    claim.expired ? [' ', badge('stuck', 'stuck')] : null,
  );
}

function statusCell(row, dead) {
  if (row.damaged) return badge('damaged', 'failed');
  if (dead.has(row)) return badge('dead-lettered', 'dead');
  if (row.status === 'active' && row.availableAt && row.availableAt > Date.now()) {
    return h('span', {}, badge('active'), h('span', { class: 'sub' }, 'not before ', ago(row.availableAt)));
  }
  return badge(row.status);
}

function runsTable(rows, dead) {
  if (rows.length === 0) return h('p', { class: 'empty' }, 'No run matches.');
  const now = Date.now();
  const cols = ['Run', 'Status', 'Park', 'Lease (holder · fence · expiry)', 'Attempts', 'Created', 'Updated'];
  return h(
    'table',
    { class: 'runs', id: 'runs' },
    h('caption', { class: 'visually-hidden' }, 'Runs of this page'),
    h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c)))),
    h(
      'tbody',
      {},
      rows.map((r) => {
        const updated = Math.max(r.latestCheckpointAt || 0, r.finishedAt || 0) || null;
        const cell = (label, ...content) => h('td', { 'data-label': label, class: label === 'Attempts' ? 'num' : undefined }, h('div', {}, content));
        return h(
          'tr',
          { dataset: { run: r.run.runId, scope: scopeKey(r.run), status: r.status, ...(dead.has(r) ? { dead: 'true' } : {}) } },
          cell(
            'Run',
            h('a', { href: runHref(r.run), class: 'run-link' }, r.run.runId),
            h('span', { class: 'sub scope' }, `${r.run.projectId} / ${r.run.sessionId}`),
            r.priority ? h('span', { class: 'sub priority', title: 'Priority: workers take the highest first' }, `priority ${r.priority}`) : null,
            r.concurrencyKey ? h('span', { class: 'sub key', title: 'Concurrency key' }, `key ${r.concurrencyKey}`) : null,
          ),
          cell('Status', statusCell(r, dead)),
          cell('Park', parkCell(r.park, now)),
          cell('Lease', leaseCell(r.claim, now)),
          cell('Attempts', String(r.attempts)),
          cell('Created', ago(r.runCreatedAt, now)),
          cell('Updated', ago(updated, now)),
        );
      }),
    ),
  );
}

// ---------------------------------------------------------------- a run

/**
 * The state of a park at `now`, by the store's rule (answered: resolved;
 * else past its deadline: expired; else outstanding), for display only.
 */
function parkState(p, now) {
  if (!p) return null;
  if (p.resolvedAt !== undefined && p.resolvedAt !== null) return 'resolved';
  if (p.deadlineAt !== undefined && p.deadlineAt !== null && p.deadlineAt <= now) return 'expired';
  return 'outstanding';
}

async function renderRun(run, signal) {
  document.title = `${run.runId} · runkeep console`;
  const head = h(
    'div',
    { class: 'run-head' },
    h('p', { class: 'crumbs' }, h('a', { href: '#/runs' }, 'Runs'), ` / ${run.projectId} / ${run.sessionId}`),
    h('h1', {}, run.runId),
  );
  const body = h('div', { class: 'run-body' }, h('p', {}, 'Loading…'));
  const tail = transcriptSection();
  fill(main, head, body, tail.section);
  focusHeading();
  let summary;
  try {
    summary = await api(runPath(run), { signal });
  } catch (e) {
    if (e.name === 'AbortError') return;
    fill(body, h('p', { class: 'msg msg-error', role: 'alert' }, problemText(e)));
    tail.section.remove();
    return;
  }
  const since = Math.max(0, summary.lastSeq - 200);
  tail.start(runPath(run, '/events/stream'), since, signal);
  await refreshRun(run, body, summary, signal);
}

async function refreshRun(run, body, summary, signal) {
  const get = (suffix) => api(runPath(run, suffix), { signal }).catch((e) => (e.name === 'AbortError' ? null : { error: e }));
  const [s, checkpoints, audit, report] = await Promise.all([
    summary ? Promise.resolve(summary) : get(''),
    // Summaries (no states; a state is read when its row is opened), the
    // server's largest page.
    get('/checkpoints?fields=summary&limit=1000'),
    get('/audit'),
    get('/report'),
  ]);
  if (signal.aborted || !s) return;
  if (s.error) {
    fill(body, h('p', { class: 'msg msg-error', role: 'alert' }, problemText(s.error)));
    return;
  }
  const now = s.now;
  const reload = () => refreshRun(run, body, null, signal);
  const cps = Array.isArray(checkpoints) ? checkpoints : [];
  const parked = [...cps].reverse().find((c) => c.pending);
  fill(
    body,
    deadBanner(s.lifecycle, now),
    parked ? parkSection(run, parked, now, reload) : null,
    overviewSection(run, s, now, reload),
    attemptsSection(s.lifecycle, now, signal),
    checkpointsSection(run, cps, now),
    auditSection(audit),
    reportSection(report),
  );
}

function section(title, id, ...children) {
  return h('section', { class: 'card', 'aria-labelledby': `${id}-h`, id }, h('h2', { id: `${id}-h` }, title), children);
}

function overviewSection(run, s, now, reload) {
  const l = s.lifecycle;
  const lease = s.lease;
  const leaseText = lease && lease.holder
    ? h(
        'span',
        { id: 'lease' },
        h('span', { class: 'holder' }, lease.holder),
        ` · fence ${lease.fence} · `,
        lease.expired ? 'expired ' : 'until ',
        when(lease.expiresAt, now),
        lease.expired ? [' ', badge('stuck', 'stuck')] : null,
      )
    : h('span', { id: 'lease', class: 'none' }, 'nobody holds it');
  const dead = l.deadLettered === true;
  return section(
    'Status, lease and attempts',
    'overview',
    facts([
      ['Status', h('span', { id: 'run-status' }, dead ? badge('dead-lettered', 'dead') : badge(l.status))],
      l.finishedAt ? ['Finished', when(l.finishedAt, now)] : null,
      l.reason ? ['Reason', l.reason] : null,
      l.result !== undefined && l.result !== null ? ['Result', jsonBlock(l.result, 'Result')] : null,
      ['Lease', leaseText],
      ['Attempts', attemptsText(l)],
      ['Priority', h('span', { id: 'run-priority' }, String(l.priority || 0))],
      l.concurrency
        ? ['Concurrency key', h('span', { id: 'run-key' }, `${l.concurrency.key} (at most ${l.concurrency.limit} held at once)`)]
        : null,
      l.availableAt ? ['Not before', when(l.availableAt, now)] : null,
      ['Transcript', `${s.lastSeq} event${s.lastSeq === 1 ? '' : 's'}`],
    ]),
    actionsBlock(run, s, reload),
  );
}

/** `3 of at most 3`: the attempts counted and the run's limit. */
function attemptsText(l) {
  return `${l.attempts}${l.maxAttempts ? ` of at most ${l.maxAttempts}` : ''}`;
}

/** `kind: message` of a failed attempt, the message folded when long. */
function errorView(f) {
  return h('span', { class: 'error' }, h('strong', { class: 'error-kind' }, f.kind), ': ', folded(f.message));
}

/**
 * A `<time>` of `at` and how long until (or since) it, kept current each
 * second while the view is shown: `2026-… (in 12 s)`, then `(3 s ago)`.
 * `skew` is the store's clock minus this browser's.
 */
function countdown(at, skew, signal, { id, future, past }) {
  const rel = h('span', { class: 'rel' });
  const label = h('span', { class: 'countdown-label' });
  const el = h(
    'span',
    { id, class: 'countdown', dataset: { at: String(at) } },
    label,
    ' ',
    h('time', { datetime: new Date(at).toISOString(), title: new Date(at).toISOString() }, isoLocal(at)),
    rel,
  );
  const tick = () => {
    const left = at - (Date.now() + skew);
    el.dataset.state = left > 0 ? 'waiting' : 'over';
    label.textContent = left > 0 ? future : past;
    rel.textContent = left > 0 ? ` (in ${duration(left)})` : ` (${duration(-left)} ago)`;
    return left;
  };
  if (tick() > 0) {
    const timer = setInterval(() => {
      if (signal.aborted || !el.isConnected || tick() <= 0) clearInterval(timer);
    }, 1000);
    signal.addEventListener('abort', () => clearInterval(timer), { once: true });
  }
  return el;
}

/** The banner of a dead-lettered run: it stopped at its limit; the last error. */
function deadBanner(l, now) {
  if (l.deadLettered !== true) return null;
  const last = l.failures?.length ? l.failures[l.failures.length - 1] : null;
  return h(
    'section',
    { class: 'banner banner-dead', id: 'dead-banner', 'aria-labelledby': 'dead-banner-h' },
    h('h2', { id: 'dead-banner-h' }, 'Dead-lettered'),
    h(
      'p',
      {},
      `The run failed ${l.attempts} attempt${l.attempts === 1 ? '' : 's'}${l.maxAttempts ? `, its limit of ${l.maxAttempts}` : ', its limit'}${l.reason ? ` (${l.reason})` : ''}: the store stopped retrying it`,
      l.finishedAt ? [' at ', when(l.finishedAt, now)] : null,
      '. No worker takes it again unless an operator reopens it.',
    ),
    last
      ? h('p', { class: 'last-error', id: 'dead-last-error' }, h('span', { class: 'label' }, `Last error (attempt ${last.attempt}): `), errorView(last))
      : h('p', { class: 'none' }, 'No error was kept: its holders lost the run (expired leases) until the limit.'),
  );
}

/**
 * Attempts: the count and its limit, the retry policy, when the run may
 * be claimed again (its backoff), and the failed attempts, oldest first,
 * each with its error and when the run was claimable again after it.
 */
function attemptsSection(l, now, signal) {
  const failures = Array.isArray(l.failures) ? l.failures : [];
  const skew = now - Date.now();
  const waiting = l.status === 'active' && l.availableAt && l.availableAt > now;
  const lastFailure = failures.length ? failures[failures.length - 1] : null;
  const backingOff = waiting && lastFailure && lastFailure.retryAt === l.availableAt;
  const policy = !l.retry
    ? null
    : l.retry.baseMs === 0 && l.retry.capMs === 0
      ? 'none: retried at once'
      : `${duration(l.retry.baseMs)} after the first failure, ×${l.retry.factor} after each next one, at most ${duration(l.retry.capMs)}; each wait is between half and all of that (jitter)`;
  const pairs = [
    ['Attempts', h('span', { id: 'attempts-count' }, attemptsText(l))],
    policy ? ['Retry backoff', policy] : null,
    waiting
      ? [
          backingOff ? 'Next attempt' : 'Not before',
          countdown(l.availableAt, skew, signal, {
            id: 'run-backoff',
            future: backingOff ? 'backoff until' : 'deferred until',
            past: backingOff ? 'backoff ended' : 'claimable since',
          }),
        ]
      : null,
  ];
  const note = h(
    'p',
    { class: 'help' },
    'An attempt is counted when a failed step is reported (its error is listed below) and when a holder loses its lease and another takes the run over (no error). The store keeps the newest 20 errors.',
  );
  if (failures.length === 0) {
    return section('Attempts', 'attempts', facts(pairs), h('p', { class: 'none', id: 'no-failures' }, 'No failed attempt.'), note);
  }
  const cols = ['Attempt', 'Fence', 'Failed', 'Error', 'Then'];
  const rows = failures.map((f, i) => {
    let then;
    if (f.retryAt !== undefined && f.retryAt !== null) {
      const wait = f.retryAt - f.at;
      then = h(
        'span',
        {},
        f.retryAt > now && l.status === 'active' && i === failures.length - 1
          ? countdown(f.retryAt, skew, signal, { future: 'backoff until', past: 'claimable again' })
          : [h('span', { class: 'countdown-label' }, 'claimable again '), when(f.retryAt, now)],
        h('span', { class: 'sub' }, wait > 0 ? `after a backoff of ${duration(wait)}` : 'at once (no backoff)'),
      );
    } else {
      then = l.deadLettered && i === failures.length - 1
        ? h('span', {}, badge('dead-lettered', 'dead'), h('span', { class: 'sub' }, 'the limit was reached: not retried'))
        : h('span', { class: 'none' }, 'not retried');
    }
    const cell = (label, ...content) => h('td', { 'data-label': label, class: label === 'Attempt' || label === 'Fence' ? 'num' : undefined }, h('div', {}, content));
    return h(
      'tr',
      { dataset: { attempt: String(f.attempt) } },
      cell('Attempt', String(f.attempt)),
      cell('Fence', String(f.fence)),
      cell('Failed', when(f.at, now)),
      cell('Error', errorView(f)),
      cell('Then', then),
    );
  });
  return section(
    `Attempts (${failures.length} failed)`,
    'attempts',
    facts(pairs),
    h(
      'div',
      { class: 'table-wrap' },
      h(
        'table',
        { class: 'failures', id: 'failures' },
        h('caption', { class: 'visually-hidden' }, 'Failed attempts, oldest first'),
        h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, rows),
      ),
    ),
    note,
  );
}

/** Operator actions, each behind a confirmation. Nothing at all for other roles. */
function actionsBlock(run, s, reload) {
  if (!canOperate()) {
    return h(
      'p',
      { class: 'help', id: 'no-actions' },
      `Your token's role (${me.role}) can look, not act: answering parks, releasing, cancelling, reopening, setting priorities and pruning need an operator token.`,
    );
  }
  const buttons = [];
  if (s.lease && s.lease.holder) {
    buttons.push(
      h('button', {
        type: 'button',
        id: 'release',
        onclick: () =>
          act(
            'Release the lease?',
            `${s.lease.holder} holds ${run.runId} at fence ${s.lease.fence}${s.lease.expired ? ' (expired)' : ''}. Releasing makes the run claimable at once; the holder's next write is refused (fenced out).`,
            'Release',
            () => api(runPath(run, '/release'), { method: 'POST', body: {} }),
            (r) => (r.done ? 'Released.' : 'Nothing to release: the lease had changed hands or ended.'),
            reload,
          ),
      }, 'Release lease…'),
    );
  }
  if (s.lifecycle.status === 'active') {
    buttons.push(
      h('button', {
        type: 'button',
        id: 'cancel-run',
        class: 'danger',
        onclick: () =>
          act(
            'Cancel the run?',
            `${run.runId} is active${s.lease && s.lease.holder && !s.lease.expired ? ` and held by ${s.lease.holder}` : ''}. Cancelling finishes it as cancelled: its holding ends, its holder's next write is refused, and no worker takes it again unless it is reopened. Its checkpoints and transcript stay.`,
            'Cancel run',
            ({ reason }) => api(runPath(run, '/cancel'), { method: 'POST', body: reason ? { reason } : {} }),
            (l) => `Cancelled: the run is finished as ${l.status}${l.reason ? ` (${l.reason})` : ''}.`,
            reload,
            { reason: true, dismiss: 'Keep running', dismissed: 'Not cancelled; nothing was changed.' },
          ),
      }, 'Cancel run…'),
    );
  }
  if (s.lifecycle.status !== 'active') {
    buttons.push(
      h('button', {
        type: 'button',
        id: 'reopen',
        onclick: () =>
          act(
            'Reopen the run?',
            `${run.runId} is ${s.lifecycle.status}. Reopening makes it active and claimable again with its attempts reset; its checkpoints and transcript stay.`,
            'Reopen',
            () => api(runPath(run, '/reopen'), { method: 'POST' }),
            () => 'Reopened: the run is active again.',
            reload,
          ),
      }, 'Reopen…'),
    );
  }
  if (s.lifecycle.status === 'active') {
    const prio = h('input', { id: 'priority-value', type: 'number', min: -1000000, max: 1000000, step: 1, value: s.lifecycle.priority || 0, inputmode: 'numeric', class: 'short' });
    buttons.push(
      h(
        'div',
        { class: 'inline' },
        h('label', { for: 'priority-value' }, 'Priority'),
        prio,
        h('button', {
          type: 'button',
          id: 'set-priority',
          onclick: () => {
            const n = Number(prio.value);
            if (!Number.isInteger(n) || n < -1000000 || n > 1000000) {
              say('Give a whole number from -1000000 to 1000000 (higher runs are taken first).', 'error');
              prio.focus();
              return;
            }
            act(
              'Set the priority?',
              `Workers take ${run.runId} before runs of lower priority: from ${s.lifecycle.priority || 0} to ${n}. A holding is not touched.`,
              'Set priority',
              () => api(runPath(run, '/priority'), { method: 'POST', body: { priority: n } }),
              (l) => `Priority set to ${l.priority || 0}.`,
              reload,
            );
          },
        }, 'Set priority…'),
      ),
    );
  }
  const keep = h('input', { id: 'keep-last', type: 'number', min: 0, value: 1, inputmode: 'numeric', class: 'short' });
  const prune = h(
    'div',
    { class: 'inline' },
    h('label', { for: 'keep-last' }, 'Keep the newest'),
    keep,
    h('button', {
      type: 'button',
      id: 'prune',
      onclick: () => {
        const n = Number(keep.value);
        if (!Number.isInteger(n) || n < 0) {
          say('Give a whole number of checkpoints to keep (0 or more).', 'error');
          keep.focus();
          return;
        }
        act(
          'Prune checkpoints?',
          `Delete every checkpoint of ${run.runId} but the newest ${n}. Unanswered parks are always kept. This cannot be undone.`,
          'Prune',
          () => api(runPath(run, '/prune'), { method: 'POST', body: { keepLast: n } }),
          (r) => `Pruned ${r.deleted.length} checkpoint${r.deleted.length === 1 ? '' : 's'}.`,
          reload,
        );
      },
    }, 'Prune…'),
  );
  return h('div', { class: 'actions', id: 'actions' }, h('h3', {}, 'Operator actions'), h('div', { class: 'buttons' }, buttons, prune));
}

const dialog = document.getElementById('confirm');

/**
 * Asks for confirmation in a modal dialog. Resolves null when dismissed
 * (its dismiss button, Escape), else `{reason}`: the optional reason typed
 * in the dialog when `opts.reason` asks for one (`''` when left empty).
 * `opts.dismiss` names the dismiss button (`Cancel` by default).
 */
function confirmDialog(title, text, okLabel, opts = {}) {
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-text').textContent = text;
  const ok = document.getElementById('confirm-ok');
  const cancel = document.getElementById('confirm-cancel');
  const fields = document.getElementById('confirm-fields');
  ok.textContent = okLabel;
  cancel.textContent = opts.dismiss || 'Cancel';
  const reason = opts.reason
    ? h('input', { id: 'confirm-reason', name: 'reason', type: 'text', maxlength: 4096, autocomplete: 'off', 'aria-describedby': 'confirm-reason-help' })
    : null;
  fill(
    fields,
    reason
      ? [
          h('label', { for: 'confirm-reason' }, 'Reason (optional)'),
          reason,
          h('p', { class: 'help', id: 'confirm-reason-help' }, 'Kept as the run\'s finish reason.'),
        ]
      : null,
  );
  fields.hidden = !reason;
  return new Promise((resolve) => {
    const done = (v) => {
      ok.removeEventListener('click', onOk);
      cancel.removeEventListener('click', onCancel);
      dialog.removeEventListener('close', onClose);
      if (dialog.open) dialog.close();
      fill(fields);
      fields.hidden = true;
      resolve(v);
    };
    const onOk = () => done({ reason: reason ? reason.value.trim() : '' });
    const onCancel = () => done(null);
    const onClose = () => done(null);
    ok.addEventListener('click', onOk);
    cancel.addEventListener('click', onCancel);
    dialog.addEventListener('close', onClose);
    dialog.showModal();
    (reason || cancel).focus();
  });
}

async function act(title, text, okLabel, call, message, reload, opts) {
  const answer = await confirmDialog(title, text, okLabel, opts);
  if (!answer) {
    say(opts?.dismissed || 'Cancelled; nothing was changed.');
    return;
  }
  try {
    const r = await call(answer);
    say(message(r), 'ok');
  } catch (e) {
    say(`Refused: ${problemText(e)}`, 'error');
  }
  await reload();
}

// ---------------------------------------------------------------- schedules

/** The path of one schedule. */
function schedulePath(entry) {
  return `/v1/tenants/${enc(entry.tenantId)}/projects/${enc(entry.projectId)}/sessions/${enc(entry.sessionId)}/schedules/${enc(entry.schedule.name)}`;
}

function missedText(m) {
  if (!m || m.policy === 'skip') return 'skip';
  return `catch up (at most ${m.max})`;
}

/**
 * The tenant's recurring schedules: cron and zone, missed-tick policy, the
 * next tick, the run of the last tick enqueued (a link), and, for an
 * operator, pause and resume (a resume does not enqueue the pause's ticks).
 */
async function renderSchedules(signal) {
  document.title = 'Schedules · runkeep console';
  const summary = h('p', { class: 'page-info', id: 'schedules-info', 'aria-live': 'polite' }, 'Loading…');
  const tableWrap = h('div', { class: 'table-wrap' });
  fill(main, h('h1', {}, 'Schedules'), summary, tableWrap);
  focusHeading();
  let list;
  try {
    list = await api(`/v1/tenants/${enc(me.tenant)}/schedules`, { signal });
  } catch (e) {
    if (e.name === 'AbortError') return;
    summary.textContent = '';
    say(`Could not list the schedules: ${problemText(e)}`, 'error');
    return;
  }
  const entries = list.schedules;
  summary.textContent = `${entries.length} schedule${entries.length === 1 ? '' : 's'}`;
  summary.dataset.rows = String(entries.length);
  if (!entries.length) {
    fill(tableWrap, h('p', { class: 'empty' }, 'No schedules. Create one with ', h('code', {}, 'runkeep schedule create NAME --cron "*/5 * * * *"'), '.'));
    return;
  }
  const now = Date.now();
  const head = ['Name', 'Session', 'Cron', 'Missed ticks', 'Next tick', 'Last run', canOperate() ? 'Actions' : null].filter(Boolean);
  const rows = entries.map((e) => {
    const s = e.schedule;
    const last = s.lastRun
      ? h('a', { href: runHref({ projectId: e.projectId, sessionId: e.sessionId, runId: s.lastRun }) }, s.lastRun)
      : '—';
    const next = s.paused ? badge('paused', 'paused') : s.nextTick != null ? when(s.nextTick, now) : '—';
    const cells = [
      h('td', {}, h('code', {}, s.name)),
      h('td', {}, `${e.projectId} / ${e.sessionId}`),
      h('td', {}, h('code', {}, s.cron), ` (${s.timezone || 'UTC'})`),
      h('td', {}, missedText(s.missed)),
      h('td', { class: 'next-tick' }, next),
      h('td', { class: 'last-run' }, last),
    ];
    if (canOperate()) {
      const label = s.paused ? 'Resume' : 'Pause';
      cells.push(
        h(
          'td',
          {},
          h(
            'button',
            {
              type: 'button',
              class: 'quiet',
              'data-schedule': s.name,
              onclick: () =>
                act(
                  `${label} schedule ${s.name}?`,
                  s.paused
                    ? 'Its ticks are enqueued again from now on; the ticks of the pause are not.'
                    : 'No tick is enqueued until it is resumed.',
                  label,
                  () => {
                    const { nextTick, lastRun, cursor, ...body } = s;
                    return api(schedulePath(e), { method: 'PUT', body: { ...body, paused: !s.paused } });
                  },
                  () => `${s.paused ? 'Resumed' : 'Paused'} schedule ${s.name}.`,
                  () => route(),
                ),
            },
            label,
          ),
        ),
      );
    }
    return h('tr', { 'data-schedule': s.name }, cells);
  });
  fill(
    tableWrap,
    h(
      'table',
      { class: 'runs', id: 'schedules' },
      h('caption', { class: 'visually-hidden' }, 'Recurring schedules'),
      h('thead', {}, h('tr', {}, head.map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, rows),
    ),
  );
}

// ---------------------------------------------------------------- the park

/** The request's human-facing fields first; everything else below. */
function requestView(req) {
  const { type, question, options, plan, runId, checkpointId, ...rest } = req;
  const parts = [];
  if (question) parts.push(h('p', { class: 'question', id: 'park-question' }, String(question)));
  if (Array.isArray(plan)) parts.push(h('ol', { class: 'plan' }, plan.map((p) => h('li', {}, typeof p === 'string' ? p : compact(p)))));
  if (Array.isArray(options)) {
    parts.push(h('p', { class: 'options' }, 'Options: ', options.map((o, i) => [i ? ', ' : '', h('code', {}, typeof o === 'string' ? o : compact(o))])));
  }
  const pairs = Object.entries(rest).map(([k, v]) => [k, typeof v === 'string' ? (k === 'command' ? h('code', {}, v) : v) : typeof v === 'object' && v !== null ? jsonBlock(v, k) : String(v)]);
  if (pairs.length) parts.push(facts(pairs));
  parts.push(h('details', {}, h('summary', {}, 'The whole request (JSON)'), jsonBlock(req, 'The request')));
  return parts;
}

function parkSection(run, cp, now, reload) {
  const p = cp.pending;
  const state = parkState(p, now);
  const result = h('div', { id: 'park-result', 'aria-live': 'polite' });
  const content = [
    h(
      'p',
      { class: 'park-meta' },
      h('span', { id: 'park-state' }, badge(state, `park-${state}`)),
      ' ',
      h('strong', {}, p.request.type || 'request'),
      ` · checkpoint ${cp.id} · parked `,
      when(p.parkedAt, now),
      p.deadlineAt ? [' · due ', when(p.deadlineAt, now)] : null,
    ),
    requestView(p.request),
  ];
  if (state === 'resolved') {
    content.push(answeredView('Answered', p.resolvedAt, p.decision, now));
  } else if (canOperate()) {
    content.push(answerForm(run, cp, state, result, reload));
  } else {
    content.push(h('p', { class: 'help' }, 'Answering a park needs an operator token.'));
  }
  content.push(result);
  const s = section(state === 'resolved' ? 'Park (answered)' : 'Waiting on a person', 'park', content);
  s.classList.add(`park-${state}`);
  return s;
}

function answeredView(title, at, decision, now) {
  return h(
    'div',
    { class: 'answered', id: 'park-answer' },
    h('p', {}, h('strong', {}, title), at ? [' ', when(at, now)] : null),
    jsonBlock(decision ?? null, 'The answer'),
  );
}

function answerForm(run, cp, state, result, reload) {
  const path = runPath(run, `/checkpoints/by-id/${enc(cp.id)}/answer`);
  const controls = [];
  const send = async (resolution, describe) => {
    for (const b of controls) b.disabled = true;
    try {
      const stored = await api(path, { method: 'POST', body: { resolution } });
      fill(result, answeredView(`Recorded: ${describe}`, stored.pending?.resolvedAt, stored.pending?.decision, Date.now()));
      say(`Your answer was recorded (${describe}).`, 'ok');
    } catch (e) {
      if (e instanceof ApiError && e.kind === 'conflict' && 'firstAnswer' in e.problem) {
        // Exactly once: somebody answered first; show their answer, not ours.
        fill(
          result,
          h('p', { class: 'msg msg-error', role: 'alert', id: 'park-refused' }, 'Not recorded: this park was answered already. The answer that stands:'),
          answeredView('First answer', e.problem.resolvedAt, e.problem.firstAnswer, Date.now()),
        );
        say('Your answer was refused: the park was answered already.', 'error');
        // Show the park as answered here, keeping the refusal in view.
        form.remove();
        const card = result.closest('section');
        card?.classList.remove('park-outstanding', 'park-expired');
        card?.classList.add('park-resolved');
        const title = card?.querySelector('h2');
        if (title) title.textContent = 'Park (answered)';
        const stateBadge = card?.querySelector('#park-state');
        if (stateBadge) fill(stateBadge, badge('resolved', 'park-resolved'));
        return;
      }
      fill(result, h('p', { class: 'msg msg-error', role: 'alert' }, `Refused: ${problemText(e)}`));
      for (const b of controls) b.disabled = false;
      return;
    }
    form.remove();
    await reload();
  };
  const by = `console:${me.tokenId}`;
  const approve = h('button', { type: 'button', id: 'approve', class: 'ok', onclick: () => send({ action: 'answer', decision: { action: 'approve', by } }, 'approve') }, 'Approve');
  const reject = h('button', { type: 'button', id: 'reject', class: 'danger', onclick: () => send({ action: 'answer', decision: { action: 'reject', by } }, 'reject') }, 'Reject');
  const textarea = h('textarea', { id: 'answer-json', rows: 4, spellcheck: 'false', 'aria-describedby': 'answer-help' }, '{"action": "answer", "choice": ""}');
  const jsonError = h('p', { class: 'msg msg-error', id: 'answer-json-error', role: 'alert' });
  jsonError.hidden = true;
  const sendJson = h('button', {
    type: 'submit',
    id: 'answer-send',
  }, 'Send this answer');
  controls.push(approve, reject, sendJson);
  const form = h(
    'form',
    {
      class: 'answer',
      'aria-label': 'Answer the park',
      onsubmit: (ev) => {
        ev.preventDefault();
        let decision;
        try {
          decision = JSON.parse(textarea.value);
        } catch (e) {
          jsonError.hidden = false;
          jsonError.textContent = `Not JSON: ${e.message}. Nothing was sent.`;
          textarea.setAttribute('aria-invalid', 'true');
          textarea.focus();
          return;
        }
        jsonError.hidden = true;
        textarea.removeAttribute('aria-invalid');
        send({ action: 'answer', decision }, 'a JSON answer');
      },
    },
    h('div', { class: 'buttons' }, approve, reject),
    h('label', { for: 'answer-json' }, 'Or answer with JSON'),
    textarea,
    h('p', { id: 'answer-help', class: 'help' }, 'Sent as the decision, exactly as written. A park takes one answer: a second one, from here or elsewhere, is refused and shows the first.'),
    jsonError,
    h('div', { class: 'buttons' }, sendJson),
    state === 'expired'
      ? h('p', { class: 'help' }, 'Its deadline passed; it can still be answered, or given up: ', h('button', {
          type: 'button',
          id: 'expire',
          class: 'quiet',
          onclick: () => send({ action: 'expire' }, 'give up (pause)'),
        }, 'Give up'))
      : null,
  );
  return form;
}

// ---------------------------------------------------------------- the rest of a run

/** A checkpoint's state, read by id when its row is first opened. */
function lazyState(run, c) {
  const holder = h('div', {}, h('p', { class: 'none' }, 'Open to read the state.'));
  let asked = false;
  const load = async () => {
    if (asked) return;
    asked = true;
    fill(holder, h('p', { class: 'none' }, 'Reading the state…'));
    try {
      const got = await api(runPath(run, `/checkpoints/by-id/${enc(c.id)}`));
      fill(holder, jsonBlock(got.checkpoint ? got.checkpoint.state : null, `State of ${c.id}`));
    } catch (e) {
      asked = false;
      fill(holder, h('p', { class: 'msg msg-error', role: 'alert' }, problemText(e)));
    }
  };
  return { holder, load };
}

function checkpointsSection(run, cps, now) {
  if (cps.length === 0) return section('Checkpoints', 'checkpoints', h('p', { class: 'none' }, 'None.'));
  return section(
    `Checkpoints (${cps.length})`,
    'checkpoints',
    h(
      'ol',
      { class: 'checkpoints' },
      cps.map((c) => {
        const state = c.state !== undefined ? { holder: jsonBlock(c.state, `State of ${c.id}`), load: () => {} } : lazyState(run, c);
        return h(
          'li',
          {},
          h(
            'details',
            { ontoggle: (ev) => ev.target.open && state.load() },
            h(
              'summary',
              {},
              h('code', {}, c.id),
              ' · ',
              when(c.createdAt, now),
              c.fence !== undefined ? ` · fence ${c.fence}` : '',
              c.pending ? [' · ', badge(`park ${parkState(c.pending, now)}`, `park-${parkState(c.pending, now)}`)] : null,
            ),
            state.holder,
            c.pending ? jsonBlock(c.pending, `Park of ${c.id}`) : null,
          ),
        );
      }),
    ),
  );
}

function auditSection(audit) {
  if (!audit || audit.error) {
    return section('Audit', 'audit', h('p', { class: 'msg msg-error' }, audit ? problemText(audit.error) : 'Not loaded.'));
  }
  const records = audit.records || [];
  if (records.length === 0) return section('Audit', 'audit', h('p', { class: 'none' }, 'Nothing audited.'));
  return section(
    'Audit',
    'audit',
    h(
      'div',
      { class: 'table-wrap' },
      h(
        'table',
        { class: 'audit' },
        h('caption', { class: 'visually-hidden' }, 'Audit trail'),
        h('thead', {}, h('tr', {}, ['#', 'When', 'Who', 'What', 'Outcome'].map((c) => h('th', { scope: 'col' }, c)))),
        h(
          'tbody',
          {},
          records.map((r) =>
            h(
              'tr',
              {},
              h('td', { 'data-label': '#', class: 'num' }, String(r.seq)),
              h('td', { 'data-label': 'When' }, when(r.timestamp)),
              h('td', { 'data-label': 'Who' }, r.who),
              h('td', { 'data-label': 'What' }, r.what),
              h('td', { 'data-label': 'Outcome' }, r.outcome),
            ),
          ),
        ),
      ),
    ),
  );
}

function reportSection(report) {
  if (!report || report.error || !report.report) {
    return section('Report', 'report', h('p', { class: 'none' }, report?.error ? problemText(report.error) : 'No report yet.'));
  }
  return section('Report', 'report', h('pre', { class: 'report', tabindex: 0 }, report.report));
}

/** The live transcript: the last events, then each new one as it arrives. */
function transcriptSection() {
  const MAX_SHOWN = 1000;
  const state = h('p', { class: 'tail-state', id: 'tail-state', dataset: { state: 'connecting', reconnects: '0' } }, 'Connecting…');
  const list = h('ol', { class: 'events', id: 'events', role: 'log', 'aria-live': 'polite', 'aria-relevant': 'additions', 'aria-label': 'Transcript events' });
  const earlier = h('p', { class: 'help', hidden: true });
  const s = section('Transcript (live)', 'transcript', state, earlier, list);
  let shown = 0;
  return {
    section: s,
    start(url, since, signal) {
      if (since > 0) {
        earlier.hidden = false;
        earlier.textContent = `Showing the events after #${since}; the earlier ones are in the API (GET …/events).`;
      }
      tailEvents(url, {
        since,
        signal,
        onEvent: (ev) => {
          list.append(
            h(
              'li',
              { dataset: { seq: String(ev.seq) } },
              h('span', { class: 'seq' }, `#${ev.seq}`),
              ' ',
              h('time', { datetime: new Date(ev.timestamp).toISOString() }, isoLocal(ev.timestamp)),
              ' ',
              h('strong', { class: 'etype' }, ev.type),
              ev.generation !== undefined ? h('span', { class: 'sub' }, ` fence ${ev.generation}`) : null,
              ' ',
              h('code', { class: 'payload' }, compact(ev.payload, 300)),
            ),
          );
          shown += 1;
          if (shown > MAX_SHOWN) list.firstElementChild?.remove();
          state.dataset.last = String(ev.seq);
        },
        onState: (st, detail) => {
          state.dataset.state = st;
          if (st === 'live') state.textContent = 'Live: new events appear as they are written.';
          else if (st === 'connecting') state.textContent = 'Connecting…';
          else if (st === 'reconnecting') {
            state.dataset.reconnects = String(detail);
            state.textContent = `Connection lost; resuming after #${state.dataset.last || since}…`;
          } else if (st === 'ended') state.textContent = `The tail stopped: ${[detail?.title, detail?.detail].filter(Boolean).join(': ')}`;
        },
      });
    },
  };
}

route();
