// Browser tests of a run's attempts in the console: the failure history
// (each failed attempt's error, when the run was claimable again, the
// backoff still running), the dead-lettered banner, an operator's Cancel
// behind its confirmation, a run's priority and concurrency key with an
// operator's priority change, and store text (error kinds and messages, a
// cancel's reason) shown as text, never parsed as HTML. A real headless
// Chromium against its own `runkeep serve --demo` (see harness.mjs).
//
// Run by ci.sh: RUNKEEP_BIN=target/debug/runkeep node --test attempts.test.mjs
// It takes docs/console/dead-lettered.png.

import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { caller, launchBrowser, runPath, SHOTS, signIn, startDemo, stopDemo } from './harness.mjs';

let server;
let origin; // the server's address, the console's origin
let tokens;
let browser;
let call;

const signedIn = (role, viewport) => signIn(browser, origin, tokens[role], viewport);

/** Texts of `selector`'s matches, trimmed. */
const texts = async (page, selector) => (await page.locator(selector).allTextContents()).map((t) => t.trim());

/**
 * A new run in project `attempts`, enqueued with `options` (maxAttempts,
 * retry) and claimed by a worker: `{path, fence, hash}`.
 */
async function claimedRun(runId, options = {}) {
  const p = runPath('attempts', 'browser', runId);
  await call('worker', 'POST', `${p}/enqueue`, {
    checkpoint: { id: 'cp_1', createdAt: Date.now(), state: { goal: runId } },
    ...options,
  });
  const claim = await call('worker', 'POST', `${p}/claim`, { holder: 'browser-test-worker', ttlMs: 600000 });
  assert.equal(claim.outcome, 'acquired');
  return { path: p, fence: claim.lease.fence, hash: `#/run/attempts/browser/${runId}` };
}

/** `duration()` of the console: `2 min 5 s`. */
function waitText(ms) {
  const s = Math.round(ms / 1000);
  return s % 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s / 60} min`;
}

/** Reports a failed attempt of the holding at `fence`: the lifecycle. */
const fail = (p, fence, kind, message) => call('worker', 'POST', `${p}/attempts/failed`, { fence, error: { kind, message } });

before(async () => {
  const s = await startDemo();
  server = s.child;
  origin = s.address;
  tokens = s.tokens;
  call = caller(origin, tokens);
  browser = await launchBrowser();
  mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  await browser?.close();
  stopDemo(server);
});

describe("a run's attempts in the console", () => {
  test("a dead-lettered demo run shows the banner with its last error and its three errors in order", async () => {
    const { context, page, outside, errors } = await signedIn('operator');
    // The table marks it, with its last error; the dead-lettered filter finds it.
    const row = page.locator('tr[data-run="enrich-crm-3"]');
    assert.match(await row.locator('td[data-label=Status]').textContent(), /dead-lettered/);
    await row.locator('.last-error').waitFor();
    assert.equal(
      (await row.locator('.last-error').textContent()).trim(),
      'ValueError: tool `fetch_invoice` returned malformed JSON at line 1 column 318',
    );
    await page.selectOption('#show', 'dead-lettered');
    await page.waitForFunction(() => document.querySelector('#page-info')?.dataset.rows === '3');
    assert.equal(await page.locator('#runs tbody tr[data-dead=true]').count(), 3);

    await page.click('a.run-link:text("enrich-crm-3")');
    await page.waitForSelector('#dead-banner');
    const banner = await page.textContent('#dead-banner');
    assert.match(banner, /Dead-lettered/);
    assert.match(banner, /failed 3 attempts, its limit of 3/);
    assert.match(banner, /attempts exhausted/);
    assert.equal(
      (await page.textContent('#dead-last-error')).trim(),
      'Last error (attempt 3): ValueError: tool `fetch_invoice` returned malformed JSON at line 1 column 318',
    );
    // The banner comes before everything else of the run.
    assert.ok(
      await page.evaluate(() => {
        const b = document.querySelector('#dead-banner');
        return b.compareDocumentPosition(document.querySelector('#overview')) & Node.DOCUMENT_POSITION_FOLLOWING;
      }),
    );
    assert.equal((await page.textContent('#run-status')).trim(), 'dead-lettered');
    assert.equal((await page.textContent('#attempts-count')).trim(), '3 of at most 3');
    // The three failed attempts, oldest first, each with its fence and error.
    assert.deepEqual(await texts(page, '#failures tbody td[data-label=Attempt]'), ['1', '2', '3']);
    assert.deepEqual(await texts(page, '#failures tbody .error-kind'), ['RateLimitError', 'TimeoutError', 'ValueError']);
    assert.deepEqual(await texts(page, '#failures tbody .error-text'), [
      '429 Too Many Requests from api.example.com: retry after 20 s',
      'tool `fetch_invoice` did not answer within 30 s',
      'tool `fetch_invoice` returned malformed JSON at line 1 column 318',
    ]);
    const fences = (await texts(page, '#failures tbody td[data-label=Fence]')).map(Number);
    assert.deepEqual(fences, [...fences].sort((a, b) => a - b), 'fences grow');
    assert.equal(new Set(fences).size, 3, 'three holdings');
    const then = await texts(page, '#failures tbody td[data-label=Then]');
    assert.match(then[0], /claimable again .*at once \(no backoff\)/);
    assert.match(then[1], /claimable again .*at once \(no backoff\)/);
    assert.match(then[2], /dead-lettered.*not retried/);
    assert.match(await page.textContent('#attempts'), /Retry backoff\s*none: retried at once/);
    // The failures' times are instants, as the store recorded them.
    const lifecycle = await call('reader', 'GET', runPath('support-bot', 'prod', 'enrich-crm-3', '/lifecycle'));
    const shown = await page.locator('#failures tbody td[data-label=Failed] time').evaluateAll((ts) => ts.map((t) => Date.parse(t.getAttribute('datetime'))));
    assert.deepEqual(shown, lifecycle.failures.map((f) => f.at));
    // Dead-lettered: no Cancel, Reopen offered.
    assert.equal(await page.$('#cancel-run'), null);
    assert.ok(await page.$('#reopen'));
    await page.screenshot({ path: path.join(SHOTS, 'dead-lettered.png'), fullPage: true });
    assert.deepEqual(outside, [], 'no request leaves the server');
    assert.deepEqual(errors, []);
    await context.close();
  });

  test('a failed attempt backing off shows when the next attempt may start, counting down', async () => {
    const run = await claimedRun('backoff-1', { maxAttempts: 4, retry: { baseMs: 240000, factor: 2, capMs: 600000 } });
    const l = await fail(run.path, run.fence, 'ConnectionError', 'connection reset by peer');
    assert.equal(l.status, 'active');
    // Equal jitter: the wait is between half and all of the 4 min.
    assert.ok(l.availableAt > Date.now() + 110000, `backing off: ${JSON.stringify(l)}`);
    const { context, page } = await signedIn('reader');
    await page.goto(`${origin}/${run.hash}`);
    await page.waitForSelector('#run-backoff');
    const first = (await page.textContent('#run-backoff')).trim();
    assert.match(first, /^backoff until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(in [234] min( \d+ s)?\)$/);
    assert.equal(Number(await page.getAttribute('#run-backoff', 'data-at')), l.availableAt);
    // It counts down while the page is open.
    await page.waitForFunction((t) => document.querySelector('#run-backoff').textContent.trim() !== t, first, { timeout: 5000 });
    assert.equal((await page.textContent('#attempts-count')).trim(), '1 of at most 4');
    assert.match(await page.textContent('#attempts'), /Retry backoff\s*4 min after the first failure, ×2 after each next one, at most 10 min; each wait is between half and all of that \(jitter\)/);
    assert.deepEqual(await texts(page, '#failures tbody .error-kind'), ['ConnectionError']);
    assert.match(await page.textContent('#failures tbody td[data-label=Then]'), new RegExp(`backoff until .*\\(in [234] min.*after a backoff of ${waitText(l.availableAt - l.failures[0].at)}`));
    assert.equal(await page.$('#dead-banner'), null, 'not dead-lettered');
    await context.close();
  });

  test('store text is shown as text: HTML in an error kind, a message (short or folded) and a reason is not parsed', async () => {
    const img = '<img src=x onerror="document.body.dataset.xss=1">';
    const run = await claimedRun('escaping-1', { maxAttempts: 2, retry: { baseMs: 0, factor: 1, capMs: 0 } });
    await fail(run.path, run.fence, '<b>BoldError</b>', `short ${img}`);
    const again = await call('worker', 'POST', `${run.path}/claim`, { holder: 'browser-test-worker', ttlMs: 600000 });
    const long = `first line ${img}\n${'a traceback line <script>document.body.dataset.xss=2</script>\n'.repeat(40)}last ${img}`;
    const dead = await fail(run.path, again.lease.fence, 'panic', long);
    assert.equal(dead.deadLettered, true);

    const { context, page, errors } = await signedIn('operator');
    await page.goto(`${origin}/${run.hash}`);
    await page.waitForSelector('#failures');
    const kinds = await texts(page, '#failures tbody .error-kind');
    assert.deepEqual(kinds, ['<b>BoldError</b>', 'panic']);
    // The short message whole, as written.
    assert.equal((await page.textContent('#failures tbody tr[data-attempt="1"] .error-text')).trim(), `short ${img}`);
    // The long one folded: its first line shown, the whole in the disclosure.
    const fold = page.locator('#failures tbody tr[data-attempt="2"] details.fold');
    assert.equal(await fold.evaluate((d) => d.open), false, 'folded');
    assert.match(await fold.locator('summary').textContent(), /^first line <img src=x onerror="document\.body\.dataset\.xss=1"> …/);
    await fold.locator('summary').click();
    assert.equal(await fold.locator('pre.fold-body').textContent(), long);
    // The banner's last error is the same message, folded too.
    assert.equal(await page.locator('#dead-last-error pre.fold-body').textContent(), long);
    // Nothing of it became an element, nothing ran.
    assert.equal(await page.locator('main img, main script, main b').count(), 0, 'no element made of store text');
    assert.equal(await page.evaluate(() => document.body.dataset.xss), undefined);

    // A cancel's reason, shown as the finish reason, is text too.
    await page.click('#reopen');
    await page.click('#confirm-ok');
    await page.waitForSelector('#cancel-run');
    await page.click('#cancel-run');
    await page.fill('#confirm-reason', `stop ${img}`);
    await page.click('#confirm-ok');
    await page.waitForFunction(() => document.querySelector('#run-status')?.textContent.trim() === 'cancelled');
    assert.match(await page.textContent('#overview'), /Reason\s*stop <img src=x onerror=/);
    assert.equal(await page.locator('main img, main script, main b').count(), 0);
    assert.equal(await page.evaluate(() => document.body.dataset.xss), undefined);
    assert.deepEqual(errors, []);
    await context.close();
  });

  test('Cancel asks first: dismissing changes nothing; confirming cancels the run with the reason given', async () => {
    const p = runPath('support-bot', 'prod', 'summarise-thread-55');
    const held = await call('reader', 'GET', `${p}/lease`);
    assert.equal(held.lease.holder, 'worker-a', 'a demo run held live');
    const { context, page } = await signedIn('operator');
    await page.goto(`${origin}/#/run/support-bot/prod/summarise-thread-55`);
    await page.waitForSelector('#cancel-run');
    assert.equal((await page.textContent('#run-status')).trim(), 'active');
    assert.equal(await page.$('#reopen'), null);

    // Dismissed with the dialog's own button: nothing changes.
    await page.click('#cancel-run');
    await page.waitForSelector('#confirm[open]');
    assert.match(await page.textContent('#confirm-title'), /Cancel the run\?/);
    assert.match(await page.textContent('#confirm-text'), /held by worker-a/);
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'confirm-reason', 'the reason field has the focus');
    await page.fill('#confirm-reason', 'not this time');
    await page.click('#confirm-cancel');
    await page.waitForSelector('#confirm:not([open])', { state: 'attached' });
    await page.waitForFunction(() => /nothing was changed/.test(document.querySelector('#status').textContent));
    assert.equal((await call('reader', 'GET', `${p}/lifecycle`)).status, 'active', 'dismissing changed nothing');
    // Escape too.
    await page.click('#cancel-run');
    await page.waitForSelector('#confirm[open]');
    assert.equal(await page.inputValue('#confirm-reason'), '', 'the dialog starts empty again');
    await page.keyboard.press('Escape');
    await page.waitForSelector('#confirm:not([open])', { state: 'attached' });
    assert.equal((await call('reader', 'GET', `${p}/lifecycle`)).status, 'active', 'Escape changed nothing');
    assert.equal((await page.textContent('#run-status')).trim(), 'active');

    // Confirmed, with a reason.
    await page.click('#cancel-run');
    await page.fill('#confirm-reason', 'the customer withdrew the request');
    await page.click('#confirm-ok');
    await page.waitForFunction(() => /^Cancelled: the run is finished as cancelled/.test(document.querySelector('#status').textContent));
    await page.waitForFunction(() => document.querySelector('#run-status')?.textContent.trim() === 'cancelled');
    assert.match(await page.textContent('#overview'), /Reason\s*the customer withdrew the request/);
    assert.equal(await page.$('#cancel-run'), null, 'a finished run offers no Cancel');
    assert.ok(await page.$('#reopen'));
    const l = await call('reader', 'GET', `${p}/lifecycle`);
    assert.equal(l.status, 'cancelled');
    assert.equal(l.reason, 'the customer withdrew the request');
    await context.close();
  });

  test("a refused Cancel shows the server's problem detail", async () => {
    // The page shows the run active; a worker finishes it before the operator confirms.
    const run = await claimedRun('finished-meanwhile');
    const { context, page } = await signedIn('operator');
    await page.goto(`${origin}/${run.hash}`);
    await page.waitForSelector('#cancel-run');
    await call('worker', 'POST', `${run.path}/finish`, { fence: run.fence, outcome: { status: 'completed' } });
    await page.click('#cancel-run');
    await page.click('#confirm-ok');
    await page.waitForFunction(() => /^Refused:/.test(document.querySelector('#status').textContent));
    const refused = await call('operator', 'POST', `${run.path}/cancel`, {}).catch((e) => e);
    assert.equal(refused.status, 409);
    assert.equal(refused.problem.type, 'urn:runkeep:problem:conflict');
    assert.ok(refused.problem.detail, 'the problem has a detail');
    const status = await page.textContent('#status');
    assert.ok(status.includes(refused.problem.detail), `the status line shows the detail: ${status}`);
    await page.waitForFunction(() => document.querySelector('#run-status')?.textContent.trim() === 'completed');
    assert.equal((await call('reader', 'GET', `${run.path}/lifecycle`)).status, 'completed');
    await context.close();
  });

  test('a run shows its priority and concurrency key; an operator changes the priority after confirming', async () => {
    const run = await claimedRun('prioritised', { priority: 4, concurrency: { key: 'customer:42/eu', limit: 2 } });
    const { context, page, errors } = await signedIn('operator');
    // The listing's row names the priority and the key.
    const row = page.locator('tr[data-run="prioritised"]');
    await row.waitFor();
    assert.match(await row.locator('td[data-label=Run]').textContent(), /priority 4.*key customer:42\/eu/);
    await page.goto(`${origin}/${run.hash}`);
    await page.waitForSelector('#set-priority');
    assert.equal((await page.textContent('#run-priority')).trim(), '4');
    assert.equal((await page.textContent('#run-key')).trim(), 'customer:42/eu (at most 2 held at once)');
    assert.equal(await page.inputValue('#priority-value'), '4');
    // Dismissed: nothing changes.
    await page.fill('#priority-value', '9');
    await page.click('#set-priority');
    await page.waitForSelector('#confirm[open]');
    assert.match(await page.textContent('#confirm-text'), /from 4 to 9/);
    await page.keyboard.press('Escape');
    await page.waitForSelector('#confirm:not([open])', { state: 'attached' });
    assert.equal((await call('reader', 'GET', `${run.path}/lifecycle`)).priority, 4, 'dismissing changed nothing');
    // Out of range: refused before anything is sent.
    await page.fill('#priority-value', '2000000');
    await page.click('#set-priority');
    await page.waitForFunction(() => /from -1000000 to 1000000/.test(document.querySelector('#status').textContent));
    assert.equal(await page.$('#confirm[open]'), null);
    // Confirmed.
    await page.fill('#priority-value', '9');
    await page.click('#set-priority');
    await page.click('#confirm-ok');
    await page.waitForFunction(() => /^Priority set to 9/.test(document.querySelector('#status').textContent));
    await page.waitForFunction(() => document.querySelector('#run-priority')?.textContent.trim() === '9');
    assert.equal((await call('reader', 'GET', `${run.path}/lifecycle`)).priority, 9);
    assert.deepEqual(errors, []);
    await context.close();
    // A worker is offered no priority change.
    const w = await signedIn('worker');
    await w.page.goto(`${origin}/${run.hash}`);
    await w.page.waitForSelector('#no-actions');
    assert.equal(await w.page.$('#set-priority'), null);
    assert.match(await w.page.textContent('#no-actions'), /setting priorities/);
    await w.context.close();
  });

  test('a reader or worker token sees the attempts but is offered no Cancel', async () => {
    for (const role of ['reader', 'worker']) {
      const { context, page } = await signedIn(role);
      await page.goto(`${origin}/#/run/support-bot/prod/triage-7781`);
      await page.waitForSelector('#no-actions');
      await page.waitForSelector('#attempts');
      assert.equal(await page.$('#cancel-run'), null, `${role}: no Cancel`);
      assert.match(await page.textContent('#no-actions'), /cancelling/);
      await page.goto(`${origin}/#/run/release-agent/nightly/flaky-e2e-6`);
      await page.waitForSelector('#dead-banner');
      assert.equal(await page.locator('#failures tbody tr').count(), 3);
      await context.close();
    }
  });
});
