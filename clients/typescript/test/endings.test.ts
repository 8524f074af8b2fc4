/**
 * How the worker helper ends a holding: release and snooze on request, a
 * failing handler's attempt reported failed (or the run failed with
 * `onError: "fail"`), and a stopped
 * worker giving its run back at once.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { runWorker, type RunkeepClient } from "../src/index.js";
import { firstCheckpoint, Serve, within } from "./helpers/serve.js";

let serve: Serve;
let worker: RunkeepClient;
let operator: RunkeepClient;

before(async () => {
  serve = await Serve.start();
  worker = serve.client("worker");
  operator = serve.client("operator");
});

after(async () => {
  await serve?.close();
});

/**
 * Each test's run in a session of its own, which its worker's filter names:
 * a run another test left runnable (the thrown run's retry is due within a
 * second) must not reach this test's handler on a slow machine.
 */
function at(runId: string) {
  return { ...serve.run(runId), sessionId: `s-${runId}` };
}

async function one(runId: string, options: Partial<Parameters<typeof runWorker>[0]> & Pick<Parameters<typeof runWorker>[0], "handler">) {
  await operator.enqueue(at(runId), { checkpoint: firstCheckpoint(runId) });
  return within(
    10_000,
    runWorker({ client: worker, ttlMs: 30_000, mode: "until-idle", filter: { project: at(runId).projectId, session: at(runId).sessionId }, ...options }),
    `the worker on ${runId}`,
  );
}

test("{ retryAfterMs } snoozes the run on the store's clock; a failing handler's attempt is failed, deferred by the store's backoff", async () => {
  const r1 = await one("end-snooze", { handler: () => ({ retryAfterMs: 60_000 }) });
  assert.equal(r1.snoozed, 1);
  const l1 = await operator.lifecycle(at("end-snooze"));
  assert.equal(l1.status, "active");
  const now = (await operator.clockNow()).now;
  assert.ok(l1.availableAt != null && l1.availableAt > now + 50_000, "deferred about a minute");
  const again = await worker.claim(at("end-snooze"), { holder: "x", ttlMs: 1000 });
  assert.equal(again.outcome, "notBefore");

  const r2 = await one("end-throw", {
    handler: () => {
      throw new Error("model said no");
    },
  });
  assert.deepEqual([r2.failed, r2.snoozed, r2.finished, r2.deadLettered], [1, 0, 0, 0]);
  const l2 = await operator.lifecycle(at("end-throw"));
  assert.equal(l2.status, "active");
  assert.equal(l2.attempts, 1);
  const [f] = l2.failures ?? [];
  assert.ok(f, "one failure on record");
  assert.deepEqual([f.attempt, f.kind, f.message], [1, "Error", "model said no"]);
  // The default policy (1 s, equal jitter): between 0.5 and 1 s after the failure, no backoff of the worker's own.
  assert.equal(l2.availableAt, f.retryAt);
  const wait = f.retryAt! - f.at;
  assert.ok(wait >= 500 && wait <= 1000, `deferred ${wait} ms`);
});

test('onError: "fail" finishes a failing run as failed with the error as reason', async () => {
  const r = await one("end-fail", {
    onError: "fail",
    handler: () => {
      throw new Error("bad input");
    },
  });
  assert.deepEqual([r.failed, r.finished], [1, 1]);
  const l = await operator.lifecycle(at("end-fail"));
  assert.equal(l.status, "failed");
  assert.match(l.reason ?? "", /bad input/);
});

test("{ release: true } gives the run back at once (the same drain takes it again)", async () => {
  const fences: number[] = [];
  const r = await one("end-release", {
    handler: (ctx) => {
      fences.push(ctx.fence);
      return fences.length === 1 ? { release: true } : undefined;
    },
  });
  assert.deepEqual([r.claimed, r.released, r.finished], [2, 1, 1]);
  const [first, second] = fences as [number, number];
  assert.equal(second, first + 2, "a release advances the fence by one; the next claim takes the one after");
  assert.equal((await operator.lifecycle(at("end-release"))).status, "completed");
});

test("stopping the worker aborts the handler's signal and releases its run", async () => {
  const stop = new AbortController();
  let started!: () => void;
  const inHandler = new Promise<void>((r) => (started = r));
  const run = one("end-stop", {
    signal: stop.signal,
    handler: async (ctx) => {
      started();
      await new Promise<void>((_, reject) => ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason), { once: true }));
    },
  });
  await within(10_000, inHandler, "the handler");
  stop.abort(new Error("shutting down"));
  const r = await run;
  assert.deepEqual([r.released, r.finished, r.lost], [1, 0, 0]);
  const lease = await operator.lease(at("end-stop"));
  assert.equal(lease?.holder, "", "released: no holder");
  const taken = await worker.claim(at("end-stop"), { holder: "next", ttlMs: 1000 });
  assert.equal(taken.outcome, "acquired");
});
