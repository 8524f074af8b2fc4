// What the console's browser tests share: `runkeep serve --demo` started on
// a free port (its address and one token per role read from its JSON
// lines), a headless Chromium (Debian's, driven by playwright-core), direct
// API calls, and a browser context signed in with a role's token.

import { spawn } from 'node:child_process';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, '../../../..');
export const BIN = process.env.RUNKEEP_BIN || path.join(repo, 'target/debug/runkeep');
export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
export const SHOTS = process.env.CONSOLE_SCREENSHOTS || path.join(repo, 'docs/console');

/** Starts `runkeep serve --demo`: `{child, address, tokens, runs}`. */
export function startDemo() {
  return new Promise((resolve, reject) => {
    const child = spawn(BIN, ['--json', 'serve', '--demo', '--listen', '127.0.0.1:0'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('exit', (code) => reject(new Error(`runkeep serve --demo exited (${code}): ${stderr}`)));
    const lines = readline.createInterface({ input: child.stdout });
    let address;
    lines.on('line', (line) => {
      const ev = JSON.parse(line);
      if (ev.event === 'listening') address = ev.address;
      if (ev.event === 'demo') resolve({ child, address, tokens: ev.tokens, runs: ev.runs });
    });
  });
}

/** Stops what `startDemo` started. */
export function stopDemo(child) {
  if (!child) return;
  child.removeAllListeners('exit');
  child.kill('SIGTERM');
}

/** Debian's Chromium, headless, with nothing reaching out on its own. */
export function launchBrowser() {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}

/**
 * `call(role, method, path, body)`: a direct API call with `role`'s token.
 * Resolves to the JSON body; a refusal throws an Error carrying `status`
 * and the `problem`.
 */
export function caller(api, tokens) {
  return async (role, method, p, body) => {
    const res = await fetch(api + p, {
      method,
      headers: {
        Authorization: `Bearer ${tokens[role]}`,
        ...(body === undefined ? {} : { 'Content-Type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    const data = text ? JSON.parse(text) : null;
    if (!res.ok) {
      const err = new Error(`${method} ${p}: ${res.status} ${text}`);
      err.status = res.status;
      err.problem = data;
      throw err;
    }
    return data;
  };
}

export const runPath = (project, session, run, suffix = '') =>
  `/v1/tenants/default/projects/${project}/sessions/${session}/runs/${run}${suffix}`;

/**
 * A fresh browser context at `origin` signed in with `token` (typed into
 * the focused token field, Enter): `{context, page, outside, errors}`,
 * the requests that left the origin and the page's uncaught errors.
 */
export async function signIn(browser, origin, token, viewport = { width: 1280, height: 900 }) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  const outside = [];
  page.on('request', (r) => {
    if (!r.url().startsWith(origin) && !r.url().startsWith('data:')) outside.push(r.url());
  });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${origin}/`);
  await page.waitForSelector('#token');
  await page.keyboard.type(token);
  await page.keyboard.press('Enter');
  await page.waitForSelector('#runs');
  return { context, page, outside, errors };
}
