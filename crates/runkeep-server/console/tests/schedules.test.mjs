// Browser tests of the console's Schedules page: the tenant's schedules
// with their cron, zone, missed-tick policy, next tick and the run of the
// last tick (a link to the run); an operator's Pause and Resume behind the
// confirmation, checked through the API (a resume is stamped by the
// store, so the ticks of the pause are never enqueued); a reader sees no
// actions. A real headless Chromium against its own `runkeep serve --demo`
// (see harness.mjs).
//
// Run by ci.sh: RUNKEEP_BIN=target/debug/runkeep node --test schedules.test.mjs

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { caller, launchBrowser, signIn, startDemo, stopDemo } from './harness.mjs';

let server;
let origin;
let tokens;
let browser;
let call;

const schedule = (name) => `/v1/tenants/default/projects/sched/sessions/browser/schedules/${name}`;

before(async () => {
  const s = await startDemo();
  server = s.child;
  origin = s.address;
  tokens = s.tokens;
  call = caller(origin, tokens);
  browser = await launchBrowser();
  await call('operator', 'PUT', schedule('nightly'), {
    cron: '0 3 * * *',
    timezone: 'Europe/Paris',
    input: { report: 'daily' },
    missed: { policy: 'catchUp', max: 5 },
  });
  await call('operator', 'PUT', schedule('every-second'), { cron: '* * * * * *' });
  // A scheduler's work, as `runkeep schedule run` does it: the tick's run,
  // then the cursor.
  const tick = Math.floor(Date.now() / 1000) * 1000;
  const stamp = new Date(tick).toISOString().replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z');
  const runId = `run_every-second-${stamp}`;
  await call('worker', 'POST', `/v1/tenants/default/projects/sched/sessions/browser/runs/${runId}/enqueue`, {
    checkpoint: { id: 'scheduled', createdAt: tick, state: { input: null } },
  });
  const moved = await call('worker', 'POST', `${schedule('every-second')}/advance`, { to: tick });
  assert.equal(moved.done, true);
});

after(async () => {
  await browser?.close();
  stopDemo(server);
});

describe('the Schedules page', () => {
  test('lists each schedule with its cron, zone, policy, next tick and last run', async () => {
    const { context, page, outside, errors } = await signIn(browser, origin, tokens.reader);
    await page.goto(`${origin}/#/schedules`);
    await page.waitForFunction(() => document.querySelector('#schedules-info')?.dataset.rows === '2');
    const nightly = page.locator('tr[data-schedule="nightly"]');
    assert.match(await nightly.textContent(), /0 3 \* \* \*/);
    assert.match(await nightly.textContent(), /Europe\/Paris/);
    assert.match(await nightly.textContent(), /catch up \(at most 5\)/);
    assert.equal((await nightly.locator('.last-run').textContent()).trim(), '—');
    const every = page.locator('tr[data-schedule="every-second"]');
    const link = every.locator('.last-run a');
    assert.match(await link.textContent(), /^run_every-second-\d{8}T\d{6}Z$/);
    assert.match(await link.getAttribute('href'), /^#\/run\/sched\/browser\/run_every-second-/);
    // A reader has no actions.
    assert.equal(await page.locator('button[data-schedule]').count(), 0);
    await link.click();
    await page.waitForSelector('h1');
    assert.match(page.url(), /#\/run\/sched\/browser\/run_every-second-/);
    assert.deepEqual(outside, []);
    assert.deepEqual(errors, []);
    await context.close();
  });

  test("an operator pauses and resumes a schedule behind the confirmation", async () => {
    const { context, page, errors } = await signIn(browser, origin, tokens.operator);
    await page.goto(`${origin}/#/schedules`);
    await page.waitForSelector('button[data-schedule="nightly"]');
    await page.click('button[data-schedule="nightly"]');
    await page.waitForSelector('#confirm[open]');
    await page.click('#confirm-ok');
    await page.waitForFunction(() => document.querySelector('tr[data-schedule="nightly"] .next-tick')?.textContent.includes('paused'));
    let s = (await call('reader', 'GET', schedule('nightly'))).schedule;
    assert.equal(s.paused, true);
    assert.equal(s.nextTick, undefined);
    const before = Date.now();
    await page.click('button[data-schedule="nightly"]');
    await page.waitForSelector('#confirm[open]');
    await page.click('#confirm-ok');
    await page.waitForFunction(() => !document.querySelector('tr[data-schedule="nightly"] .next-tick')?.textContent.includes('paused'));
    s = (await call('reader', 'GET', schedule('nightly'))).schedule;
    assert.equal(s.paused, false);
    assert.ok(s.resumedAt >= before - 5000, `resumedAt ${s.resumedAt} is the store's instant of the resume`);
    assert.ok(typeof s.nextTick === 'number');
    assert.deepEqual(errors, []);
    await context.close();
  });
});
