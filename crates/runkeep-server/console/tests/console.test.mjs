// Browser tests of the runkeep console: a real headless Chromium (Debian's
// /usr/bin/chromium, driven by playwright-core: no browser download)
// against `runkeep serve --demo`, reached through a TCP proxy this test
// controls, so "the connection dropped" is a real dropped connection.
//
// Run by scripts/browser-test.sh (from scripts/test.sh):
//   RUNKEEP_BIN=target/debug/runkeep node --test console.test.mjs
// It takes the README's screenshots into docs/console/.

import { mkdirSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { caller, launchBrowser, runPath, SHOTS, signIn, startDemo, stopDemo } from './harness.mjs';

let server; // the runkeep process
let api; // the server's own address (the test's API calls go there directly)
let tokens; // role -> secret
let proxy; // what the browser connects to
let browser;
let origin; // the proxy's address: the console's origin in the browser

/**
 * A TCP proxy to the server. `drop()` cuts every open connection (the
 * browser's event stream among them); while `refusing`, new connections
 * are closed at once, so the browser cannot resume until it is lifted.
 */
function startProxy(target) {
  const { hostname, port } = new URL(target);
  const sockets = new Set();
  const state = { refusing: false, accepted: 0 };
  const srv = net.createServer((client) => {
    if (state.refusing) {
      client.destroy();
      return;
    }
    state.accepted += 1;
    const upstream = net.connect(Number(port), hostname);
    sockets.add(client);
    sockets.add(upstream);
    const close = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('error', close).on('close', close);
    upstream.on('error', close).on('close', close);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  return new Promise((resolve) => {
    srv.listen(0, '127.0.0.1', () => {
      resolve({
        url: `http://127.0.0.1:${srv.address().port}`,
        state,
        drop() {
          const n = sockets.size;
          for (const s of sockets) s.destroy();
          sockets.clear();
          return n;
        },
        close: () => new Promise((r) => srv.close(r)),
      });
    });
  });
}

/** A direct API call (not through the browser). */
let call;

/** A fresh browser context signed in with `role`'s token (by keyboard). */
function signedIn(role, viewport) {
  return signIn(browser, origin, tokens[role], viewport);
}

async function rowCount(page) {
  await page.waitForSelector('#page-info[data-rows]');
  return Number(await page.getAttribute('#page-info', 'data-rows'));
}

/** Changes a filter select and waits for the table it asks for. */
async function choose(page, id, value) {
  const before = await page.evaluate(() => location.hash);
  await page.selectOption(`#${id}`, value);
  await page.waitForFunction((b) => location.hash !== b, before);
  await page.waitForSelector('#page-info[data-rows]');
}

before(async () => {
  const s = await startDemo();
  server = s.child;
  api = s.address;
  tokens = s.tokens;
  call = caller(api, tokens);
  assert.equal(s.runs, 35, 'the demo seeds 35 runs');
  proxy = await startProxy(api);
  origin = proxy.url;
  browser = await launchBrowser();
  mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  await browser?.close();
  await proxy?.close();
  stopDemo(server);
});

describe('the runkeep console', () => {
  test('serves its page without a token and refuses a bad token at sign-in', async () => {
    const context = await browser.newContext();
    const page = await context.newPage();
    const res = await page.goto(`${origin}/`);
    assert.equal(res.status(), 200);
    assert.match(res.headers()['content-security-policy'], /default-src 'none'/);
    await page.fill('#token', 'rk_not_a_token');
    await page.click('form.signin button[type=submit]');
    await page.waitForSelector('#signin-error:not([hidden])');
    assert.match(await page.textContent('#signin-error'), /not known/);
    assert.equal(await page.$('#runs'), null, 'no table without a valid token');
    // The token is never put in the URL.
    assert.ok(!page.url().includes('rk_'));
    await context.close();
  });

  test('signs in and lists the runs with status, park, lease, attempts and times', async () => {
    const { context, page, outside, errors } = await signedIn('operator');
    assert.match(await page.textContent('#who-text'), /operator/);
    assert.equal(await rowCount(page), 35);
    const stuck = page.locator('tr[data-run="triage-7760"]');
    assert.match(await stuck.textContent(), /worker-b · fence 1/);
    assert.match(await stuck.textContent(), /stuck/);
    const dead = page.locator('tr[data-run="enrich-crm-3"]');
    assert.match(await dead.textContent(), /dead-lettered/);
    assert.equal((await dead.locator('td.num').textContent()).trim(), '3', 'three failed attempts');
    const parked = page.locator('tr[data-run="refund-4411"]');
    assert.match(await parked.textContent(), /outstanding\s*tool_review/);
    await page.screenshot({ path: path.join(SHOTS, 'runs.png'), fullPage: false });
    assert.deepEqual(outside, [], 'no request leaves the server');
    assert.deepEqual(errors, []);
    await context.close();
  });

  test('filters by parked, claimed, unclaimed, finished and dead-lettered, orders, and pages with the cursor', async () => {
    const { context, page } = await signedIn('operator');
    await choose(page, 'show', 'parked');
    assert.equal(await rowCount(page), 10, '8 outstanding and 2 expired parks');
    for (const t of await page.locator('#runs tbody tr td[data-label=Park]').allTextContents()) {
      assert.match(t, /outstanding|expired/);
    }
    await choose(page, 'show', 'claimed');
    assert.equal(await rowCount(page), 5, 'the 5 runs held live');
    await choose(page, 'show', 'unclaimed');
    assert.equal(await rowCount(page), 30);
    await choose(page, 'show', 'finished');
    assert.equal(await rowCount(page), 13, '6 completed, 2 failed, 2 cancelled, 3 dead-lettered');
    await choose(page, 'show', 'dead-lettered');
    assert.equal(await rowCount(page), 3);
    assert.deepEqual(
      (await page.locator('#runs tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.run))).sort(),
      ['enrich-crm-3', 'flaky-e2e-6', 'flaky-e2e-7'],
    );
    // Order by creation: the oldest run first.
    await choose(page, 'show', 'all');
    await choose(page, 'order', 'createdAt');
    const created = await page.locator('#runs tbody tr td[data-label=Created] time').evaluateAll((ts) =>
      ts.map((t) => Date.parse(t.getAttribute('datetime'))),
    );
    assert.deepEqual(created, [...created].sort((a, b) => a - b));
    // Pages of 25 with the API's cursor: next, then previous comes back to the same page.
    await choose(page, 'order', 'runId');
    await choose(page, 'limit', '25');
    assert.equal(await rowCount(page), 25);
    const first = await page.locator('#runs tbody tr').first().getAttribute('data-run');
    await page.click('button:text("Next →")');
    await page.waitForFunction(() => document.querySelector('#page-info')?.textContent.startsWith('Page 2'));
    assert.equal(await rowCount(page), 10);
    assert.ok(await page.isDisabled('button:text("Next →")'), 'no page after the last');
    await page.click('button:text("← Previous")');
    await page.waitForFunction(() => document.querySelector('#page-info')?.textContent.startsWith('Page 1'));
    assert.equal(await page.locator('#runs tbody tr').first().getAttribute('data-run'), first);
    await context.close();
  });

  test("opens a run and watches a worker's events arrive live, resumed without gaps after a dropped connection", async () => {
    // A worker claims a queued run and writes to it under its fence.
    const run = runPath('support-bot', 'prod', 'triage-7790');
    const claim = await call('worker', 'POST', `${run}/claim`, { holder: 'browser-test-worker', ttlMs: 120000 });
    assert.equal(claim.outcome, 'acquired');
    const fence = claim.lease.fence;
    const append = (type, n) =>
      call('worker', 'POST', `${run}/events`, { events: [{ type, payload: { n } }], fence });

    const { context, page } = await signedIn('operator');
    await page.click('a.run-link:text("triage-7790")');
    await page.waitForSelector('h1:text("triage-7790")');
    assert.match(await page.textContent('#lease'), /browser-test-worker · fence/);
    await page.waitForSelector('#tail-state[data-state=live]');
    await page.waitForSelector('#events li[data-seq="1"]');

    await append('tool_started', 1);
    await page.waitForSelector('#events li[data-seq="2"]', { timeout: 5000 });
    assert.match(await page.textContent('#events li[data-seq="2"]'), /tool_started/);

    // Cut the connection and keep the browser out while the worker writes.
    proxy.state.refusing = true;
    assert.ok(proxy.drop() > 0, 'the event stream was open through the proxy');
    await page.waitForSelector('#tail-state[data-state=reconnecting]', { timeout: 5000 });
    await append('tool_completed', 2);
    await append('assistant_message', 3);
    await append('tool_started', 4);
    assert.equal(await page.locator('#events li').count(), 2, 'nothing arrives while disconnected');
    proxy.state.refusing = false;
    await page.waitForSelector('#events li[data-seq="5"]', { timeout: 10000 });
    await page.waitForSelector('#tail-state[data-state=live]');
    const seqs = await page.locator('#events li').evaluateAll((lis) => lis.map((li) => Number(li.dataset.seq)));
    assert.deepEqual(seqs, [1, 2, 3, 4, 5], 'every event once, in order');
    assert.ok(Number(await page.getAttribute('#tail-state', 'data-reconnects')) >= 1);
    // And it stays live after the resume.
    await append('tool_completed', 5);
    await page.waitForSelector('#events li[data-seq="6"]', { timeout: 5000 });
    assert.equal(await page.locator('#events li').count(), 6);
    await call('worker', 'POST', `${run}/release`, { fence });
    await context.close();
  });

  test('answers a park exactly once: a second answer from another browser is refused and shows the first', async () => {
    const a = await signedIn('operator');
    const b = await signedIn('operator');
    for (const { page } of [a, b]) {
      await page.goto(`${origin}/#/run/support-bot/prod/refund-4411`);
      await page.waitForSelector('#approve');
      assert.match(await page.textContent('#park-question'), /Run this command for refund-4411\?/);
    }
    await a.page.screenshot({ path: path.join(SHOTS, 'parked-run.png'), fullPage: true });
    await a.page.click('#approve');
    await a.page.waitForSelector('#park-answer');
    assert.match(await a.page.textContent('#status'), /recorded/);
    // B still shows the park as outstanding; its answer must not overwrite A's.
    await b.page.click('#reject');
    await b.page.waitForSelector('#park-refused');
    const shown = await b.page.textContent('#park-result');
    assert.match(shown, /"action": "approve"/);
    assert.doesNotMatch(shown, /"action": "reject"/);
    const cp = await call('reader', 'GET', runPath('support-bot', 'prod', 'refund-4411', '/checkpoints/by-id/cp_2'));
    assert.equal(cp.checkpoint.pending.decision.action, 'approve');
    await b.page.locator('#park').screenshot({ path: path.join(SHOTS, 'second-answer-refused.png') });
    // After the refusal B's page shows the park answered, with no answer buttons.
    await b.page.waitForSelector('#park.park-resolved');
    assert.equal((await b.page.textContent('#park-state')).trim(), 'resolved');
    assert.equal(await b.page.$('#approve'), null);

    // A JSON answer: bad JSON is refused in the page and sends nothing.
    const p = a.page;
    await p.goto(`${origin}/#/run/release-agent/nightly/db-migrate-88`);
    await p.waitForSelector('#answer-json');
    await p.fill('#answer-json', '{"choice": eu-west-1}');
    await p.click('#answer-send');
    await p.waitForSelector('#answer-json-error:not([hidden])');
    const still = await call('reader', 'GET', runPath('release-agent', 'nightly', 'db-migrate-88', '/checkpoints/by-id/cp_2'));
    assert.equal(still.checkpoint.pending.resolvedAt, undefined, 'nothing was sent');
    await p.fill('#answer-json', '{"choice": "eu-west-1", "by": "browser-test"}');
    await p.click('#answer-send');
    await p.waitForSelector('#park-answer');
    const answered = await call('reader', 'GET', runPath('release-agent', 'nightly', 'db-migrate-88', '/checkpoints/by-id/cp_2'));
    assert.deepEqual(answered.checkpoint.pending.decision, { choice: 'eu-west-1', by: 'browser-test' });
    await a.context.close();
    await b.context.close();
  });

  test('operator actions ask first: cancel changes nothing; release, reopen and prune happen on confirm', async () => {
    const { context, page } = await signedIn('operator');
    const stuck = runPath('support-bot', 'prod', 'triage-7760');
    await page.goto(`${origin}/#/run/support-bot/prod/triage-7760`);
    await page.click('#release');
    await page.waitForSelector('#confirm[open]');
    // The dialog has the focus on Cancel; Escape closes it too.
    await page.keyboard.press('Escape');
    await page.waitForSelector('#confirm:not([open])', { state: 'attached' });
    assert.equal((await call('reader', 'GET', `${stuck}/lease`)).lease.holder, 'worker-b', 'cancel changed nothing');
    await page.click('#release');
    await page.click('#confirm-ok');
    await page.waitForFunction(() => /Released/.test(document.querySelector('#status').textContent));
    const lease = (await call('reader', 'GET', `${stuck}/lease`)).lease;
    assert.ok(!lease || !lease.holder, `released: ${JSON.stringify(lease)}`);
    await page.waitForSelector('#lease.none');

    const done = runPath('support-bot', 'prod', 'triage-7701');
    await page.goto(`${origin}/#/run/support-bot/prod/triage-7701`);
    await page.click('#reopen');
    await page.click('#confirm-ok');
    await page.waitForFunction(() => /Reopened/.test(document.querySelector('#status').textContent));
    assert.equal((await call('reader', 'GET', `${done}/lifecycle`)).status, 'active');

    await page.fill('#keep-last', '1');
    await page.click('#prune');
    await page.click('#confirm-ok');
    await page.waitForFunction(() => /Pruned 1 checkpoint/.test(document.querySelector('#status').textContent));
    assert.equal((await call('reader', 'GET', `${done}/checkpoints`)).length, 1);
    await context.close();
  });

  test('a reader token is offered no actions at all (nor is a worker token)', async () => {
    for (const role of ['reader', 'worker']) {
      const { context, page } = await signedIn(role);
      assert.match(await page.textContent('#who-text'), new RegExp(role));
      for (const run of ['support-bot/prod/refund-4420', 'support-bot/prod/triage-7782', 'release-agent/nightly/test-matrix-18']) {
        await page.goto(`${origin}/#/run/${run}`);
        await page.waitForSelector('#no-actions');
        await page.waitForSelector('#tail-state[data-state=live]');
        assert.equal(await page.locator('main button').count(), 0, `${role} sees no button on ${run}`);
        assert.equal(await page.locator('main textarea, main input').count(), 0);
      }
      await context.close();
    }
  });

  test('every control has a label, and a park can be answered with the keyboard alone', async () => {
    const { context, page } = await signedIn('operator');
    const unlabelled = async () =>
      page.evaluate(() =>
        [...document.querySelectorAll('input, select, textarea, button')]
          .filter((el) => !(el.labels?.length || el.getAttribute('aria-label') || el.textContent.trim()))
          .map((el) => el.outerHTML.slice(0, 80)),
      );
    assert.deepEqual(await unlabelled(), [], 'the table view');
    await page.goto(`${origin}/#/run/support-bot/prod/escalate-9902`);
    await page.waitForSelector('#approve');
    assert.deepEqual(await unlabelled(), [], 'a parked run');
    // Tab from the heading to Approve, press Enter.
    let reached = false;
    for (let i = 0; i < 40 && !reached; i++) {
      await page.keyboard.press('Tab');
      reached = await page.evaluate(() => document.activeElement?.id === 'approve');
    }
    assert.ok(reached, 'Approve is reachable with Tab');
    const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    assert.notEqual(outline, 'none', 'the focus is visible');
    await page.keyboard.press('Enter');
    await page.waitForSelector('#park-answer');
    const cp = await call('reader', 'GET', runPath('support-bot', 'prod', 'escalate-9902', '/checkpoints/by-id/cp_2'));
    assert.equal(cp.checkpoint.pending.decision.action, 'approve');
    await context.close();
  });

  test('is readable on a narrow screen: table rows become labelled cards', async () => {
    const { context, page } = await signedIn('reader', { width: 390, height: 844 });
    const display = await page.locator('#runs tbody tr').first().evaluate((tr) => getComputedStyle(tr).display);
    assert.equal(display, 'block');
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `no sideways scroll (${overflow}px too wide)`);
    await page.screenshot({ path: path.join(SHOTS, 'runs-narrow.png') });
    await context.close();
  });
});
