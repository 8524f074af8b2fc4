// A LangGraph interrupt answered in the console reaches the graph, end to
// end with real processes: a plain `runkeep serve` (memory store, a token
// file with a worker and an operator token), the Python example's first
// worker (clients/python-langgraph/examples/approval.py,
// `worker_one`) runs the approval graph to its `interrupt()` — the saver
// parks the run — and releases it; a headless Chromium signs in to the
// console with the operator token, opens the parked run and clicks Approve;
// then the example's second worker, another process, takes the run with
// claim_next (answered parks only), resumes the graph with
// `Command(resume=<the console's answer>)` and finishes the run, shipped.
//
// The Python venv is the one clients/python/scripts/ci.sh makes under
// target/python-clients (scripts/test.sh runs it before this step). Without
// it the test fails and says what to run.
//
//   RUNKEEP_BIN=target/debug/runkeep node --test parks.test.mjs

import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../../../..');
const BIN = process.env.RUNKEEP_BIN || path.join(repo, 'target/debug/runkeep');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = process.env.CONSOLE_SCREENSHOTS || path.join(repo, 'docs/console');
const PYTHON = path.join(repo, 'target/python-clients/venv/bin/python');
const PYTHONPATH = ['clients/python/src', 'clients/python-langgraph/src', 'clients/python-langgraph/examples']
  .map((p) => path.join(repo, p))
  .join(path.delimiter);

let dir; // the server's token file lives here
let server;
let api;
const tokens = {};
let browser;

function cleanEnv() {
  const env = { ...process.env };
  for (const k of ['RUNKEEP_STORE', 'RUNKEEP_TENANT', 'RUNKEEP_PROJECT', 'RUNKEEP_SESSION', 'RUNKEEP_TOKENS', 'RUNKEEP_TOKEN', 'RUNKEEP_LOG']) {
    delete env[k];
  }
  return env;
}

function createToken(role) {
  const out = execFileSync(
    BIN,
    ['--tenant', 'default', '--json', 'token', 'create', '--role', role, '--label', 'parks-test', '--tokens', path.join(dir, 'tokens.json')],
    { env: cleanEnv(), encoding: 'utf8' },
  );
  return JSON.parse(out).token;
}

/** `runkeep serve` on a memory store with the test's token file; answers its address. */
function startServer() {
  return new Promise((resolve, reject) => {
    const child = spawn(BIN, ['--store', 'memory:', '--json', 'serve', '--listen', '127.0.0.1:0', '--tokens', path.join(dir, 'tokens.json')], {
      env: cleanEnv(),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('exit', (code) => reject(new Error(`runkeep serve exited (${code}): ${stderr}`)));
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      const ev = JSON.parse(line);
      if (ev.event === 'listening') resolve({ child, address: ev.address });
    });
  });
}

/**
 * Runs a Python snippet with the example importable; resolves with its
 * output once it exits 0 (rejects with the output otherwise, or after
 * `timeoutMs`: a bound, not a wait).
 */
function python(code, args, timeoutMs = 120_000) {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, ['-c', code, ...args], {
      cwd: repo,
      env: { ...cleanEnv(), PYTHONPATH, PYTHONDONTWRITEBYTECODE: '1', PYTHONUNBUFFERED: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve(out);
      else reject(new Error(`python exited ${code ?? signal}\n--- stdout\n${out}\n--- stderr\n${err}`));
    });
  });
}

const PRELUDE = `
import json, sys
import approval
from runkeep import RunkeepClient
from langgraph.checkpoint.runkeep import RunkeepSaver
url, token, session, thread = sys.argv[1:5]
client = RunkeepClient(url, token)
saver = RunkeepSaver(client, project="examples", session=session)
`;
const WORKER_ONE = `${PRELUDE}
approval.worker_one(client, saver, thread)
`;
const WORKER_TWO = `${PRELUDE}
out = approval.worker_two(client, saver, wait_s=60)
print("RESULT " + json.dumps(out["log"]))
`;

async function call(role, method, p) {
  const res = await fetch(api + p, { method, headers: { Authorization: `Bearer ${tokens[role]}` } });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${text}`);
  return JSON.parse(text);
}

before(async () => {
  if (!existsSync(PYTHON)) {
    throw new Error(
      `no Python venv at ${PYTHON}: run \`bash clients/python/scripts/ci.sh\` first (it creates target/python-clients/venv; scripts/test.sh runs it before this step)`,
    );
  }
  dir = mkdtempSync(path.join(os.tmpdir(), 'runkeep-parks-'));
  tokens.worker = createToken('worker');
  tokens.operator = createToken('operator');
  tokens.reader = createToken('reader');
  const s = await startServer();
  server = s.child;
  api = s.address;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  await browser?.close();
  if (server) {
    server.removeAllListeners('exit');
    server.kill('SIGTERM');
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test("a LangGraph interrupt answered in the console resumes the graph on another worker, which finishes it approved", async () => {
  const session = `approvals-${process.pid}`;
  const thread = 'approval-console';
  const runId = `run_${thread}`; // thread_run_id of an id-safe thread id
  const run = `/v1/tenants/default/projects/examples/sessions/${session}/runs/${runId}`;
  const transcript = [];

  // Worker 1: the graph runs to its interrupt; the saver parks the run; the worker releases it.
  transcript.push(...(await python(WORKER_ONE, [api, tokens.worker, session, thread])).trim().split('\n'));
  const parked = (await call('reader', 'GET', `${run}/checkpoints/pending`)).checkpoint;
  assert.ok(parked, 'the interrupt parked the run');
  assert.equal(parked.pending.request.type, 'langgraph-interrupt');
  assert.equal(parked.pending.resolvedAt, undefined);
  assert.equal((await call('reader', 'GET', `${run}/lease`)).lease?.holder || '', '', 'worker 1 released the run');

  // The console: sign in with the operator token, open the parked run, approve.
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${api}/`);
  await page.waitForSelector('#token');
  await page.fill('#token', tokens.operator);
  await page.keyboard.press('Enter');
  await page.waitForSelector('#runs');
  const row = page.locator(`tr[data-run="${runId}"]`);
  await row.waitFor();
  assert.match(await row.textContent(), /outstanding\s*langgraph-interrupt/);
  await row.locator('a.run-link').click();
  await page.waitForSelector(`h1:text("${runId}")`);
  await page.waitForSelector('#approve');
  assert.match(await page.textContent('#park'), /Ship the draft\?/, 'the interrupt’s question is shown');
  await page.screenshot({ path: path.join(SHOTS, 'langgraph-interrupt.png'), fullPage: true });
  await page.click('#approve');
  await page.waitForSelector('#park-answer');
  assert.match(await page.textContent('#status'), /recorded/);
  transcript.push('console: operator clicked Approve');
  const answered = (await call('reader', 'GET', `${run}/checkpoints/by-id/${parked.id}`)).checkpoint;
  assert.equal(answered.pending.decision.action, 'approve');

  // Worker 2, another process: claim_next (answered parks), resume with the console's answer, finish.
  const out = await python(WORKER_TWO, [api, tokens.worker, session, thread]);
  transcript.push(...out.trim().split('\n').filter((l) => !l.startsWith('RESULT ')));
  const result = JSON.parse(out.split('\n').find((l) => l.startsWith('RESULT ')).slice('RESULT '.length));
  assert.deepEqual(result, ['drafted', 'approval: yes', 'shipped'], 'the console’s Approve reached the graph');
  const lifecycle = await call('reader', 'GET', `${run}/lifecycle`);
  assert.equal(lifecycle.status, 'completed');
  assert.deepEqual(lifecycle.result, { log: ['drafted', 'approval: yes', 'shipped'] });

  // The console shows it finished.
  await page.reload();
  await page.waitForSelector('#run-status');
  assert.match(await page.textContent('#run-status'), /completed/);
  assert.deepEqual(errors, []);
  await context.close();
  console.log(`--- parks from interrupts, answered in the console ---\n${transcript.join('\n')}`);
});
