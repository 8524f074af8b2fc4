// DOM helpers and formatting. Everything is built with createElement and
// textContent: nothing from the server is ever parsed as HTML.

/** `h('a', {href: '#/'}, 'text', child)`: an element. `on*` attributes are listeners. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Empties `el` and fills it with `children`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const pad = (n, w = 2) => String(n).padStart(w, '0');

/** Epoch ms as local `YYYY-MM-DD HH:MM:SS`. */
export function isoLocal(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

const rtf = new Intl.RelativeTimeFormat('en', { numeric: 'auto', style: 'short' });

/** `5 min. ago`, `in 2 hr.`: `ms` relative to `now`. */
export function relative(ms, now = Date.now()) {
  const s = Math.round((ms - now) / 1000);
  const a = Math.abs(s);
  if (a < 60) return rtf.format(s, 'second');
  if (a < 3600) return rtf.format(Math.round(s / 60), 'minute');
  if (a < 86400) return rtf.format(Math.round(s / 3600), 'hour');
  return rtf.format(Math.round(s / 86400), 'day');
}

/** A `<time>` showing the instant and how long ago (or until) it is. */
export function when(ms, now) {
  if (ms === undefined || ms === null) return h('span', { class: 'none' }, '—');
  return h(
    'time',
    { datetime: new Date(ms).toISOString(), title: new Date(ms).toISOString() },
    isoLocal(ms),
    h('span', { class: 'rel' }, ` (${relative(ms, now)})`),
  );
}

/** A compact `<time>`: how long ago (or until), the instant in its tooltip. */
export function ago(ms, now) {
  if (ms === undefined || ms === null) return h('span', { class: 'none' }, '—');
  return h('time', { datetime: new Date(ms).toISOString(), title: isoLocal(ms) }, relative(ms, now));
}

/** Pretty JSON in a `<pre>`. */
export function jsonBlock(value, label) {
  return h('pre', { class: 'json', tabindex: 0, 'aria-label': label || 'JSON' }, JSON.stringify(value, null, 2));
}

/** A short one-line rendering of a JSON value. */
export function compact(value, max = 160) {
  const s = JSON.stringify(value);
  return s.length > max ? `${s.slice(0, max - 1)}…` : s;
}

/** A small labelled badge. */
export function badge(text, kind = text) {
  return h('span', { class: `badge badge-${kind}` }, text);
}

/** A `<dl>` of `[term, description]` pairs (descriptions may be nodes). */
export function facts(pairs) {
  return h('dl', { class: 'facts' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

/** A length of time, short: `12 s`, `3 min 5 s`, `2 h 10 min`, `1 d 3 h`. */
export function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  const two = (a, ua, b, ub) => (b ? `${a} ${ua} ${b} ${ub}` : `${a} ${ua}`);
  if (s < 3600) return two(Math.floor(s / 60), 'min', s % 60, 's');
  if (s < 86400) return two(Math.floor(s / 3600), 'h', Math.floor((s % 3600) / 60), 'min');
  return two(Math.floor(s / 86400), 'd', Math.floor((s % 86400) / 3600), 'h');
}

/**
 * A text that may be long (an error message): shown whole when short and
 * on one line, else folded: its first line (cut) as a `<summary>`, the
 * whole text in a `<pre>` below. Always as text, never as HTML.
 */
export function folded(text, { max = 160, className = 'error-text' } = {}) {
  const s = String(text ?? '');
  const firstLine = s.split(/\r\n|\r|\n/, 1)[0];
  if (s.length <= max && firstLine === s) return h('span', { class: className }, s);
  const head = firstLine.length > max ? `${firstLine.slice(0, max - 1)}…` : `${firstLine} …`;
  return h(
    'details',
    { class: `fold ${className}` },
    h('summary', {}, h('span', { class: 'fold-head' }, head), h('span', { class: 'fold-note' }, ` (${s.length} characters; open to read it all)`)),
    h('pre', { class: 'fold-body', tabindex: 0 }, s),
  );
}
