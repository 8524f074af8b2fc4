/**
 * Takeovers: a TypeScript worker that lost its run must stop, and its
 * writes must not land.
 *
 * Each test forces the interleaving: worker A's handler pauses at a point
 * the test controls; an operator releases A's lease and worker B claims
 * the run; only then is A let go. The log array records the order, and the
 * test asserts it happened as intended.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  FencedOut,
  LeaseLost,
  RunkeepClient,
  runWorker,
  type WorkerEvent,
  type WorkerReport,
} from "../src/index.js";
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

function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** Operator release of A's holding, then B's claim; answers B's fence. */
async function takeOver(runId: string, log: string[]): Promise<number> {
  const run = serve.run(runId);
  const released = await operator.release(run);
  assert.equal(released.done, true, "the operator released A's lease");
  const b = await worker.claim(run, { holder: "worker-B", ttlMs: 30_000 });
  assert.equal(b.outcome, "acquired", "B took the run over");
  if (b.outcome !== "acquired") throw new Error("unreachable");
  log.push(`B claimed at fence ${b.lease.fence}`);
  return b.lease.fence;
}

test("the superseded worker's step is refused with FencedOut (presented, current) and its signal aborts", async () => {
  const runId = "takeover-write";
  const run = serve.run(runId);
  await operator.enqueue(run, { checkpoint: firstCheckpoint("x") });
  const log: string[] = [];
  const paused = deferred<number>();
  const resume = deferred();
  let refusal: unknown;
  let abortedAfter: { aborted: boolean; reason: unknown } | undefined;
  const events: WorkerEvent[] = [];
  // A long TTL: no renewal runs during the test, so the stale write reaches the server.
  const workerA = runWorker({
    client: worker,
    holder: "worker-A",
    ttlMs: 60_000,
    mode: "until-idle",
    onEvent: (e) => events.push(e),
    handler: async (ctx) => {
      await ctx.step({ events: [{ type: "a-step-1" }] });
      log.push(`A wrote step 1 at fence ${ctx.fence}`);
      paused.resolve(ctx.fence);
      await resume.promise; // stalled, not looking at its signal
      log.push("A resumed");
      try {
        await ctx.step({ events: [{ type: "a-step-2-stale" }], checkpoint: { id: "cp_stale", createdAt: Date.now() } });
        log.push("A step 2 landed (wrong)");
      } catch (e) {
        refusal = e;
        abortedAfter = { aborted: ctx.signal.aborted, reason: ctx.signal.reason };
        log.push("A step 2 refused");
        throw e;
      }
    },
  });
  const aFence = await within(10_000, paused.promise, "A's first step");
  const bFence = await takeOver(runId, log);
  resume.resolve();
  const report: WorkerReport = await within(10_000, workerA, "worker A");

  assert.deepEqual(log, [`A wrote step 1 at fence ${aFence}`, `B claimed at fence ${bFence}`, "A resumed", "A step 2 refused"]);
  assert.ok(refusal instanceof FencedOut, `A's stale step is FencedOut, got ${String(refusal)}`);
  assert.equal(refusal.presented, aFence);
  assert.equal(refusal.current, bFence);
  assert.equal(refusal.status, 409);
  assert.equal(refusal.operation, "commit_step");
  assert.ok(abortedAfter?.aborted, "A's signal aborted when its write was refused");
  assert.ok(abortedAfter.reason instanceof LeaseLost);
  assert.equal(abortedAfter.reason.kind, "fenced-out");
  assert.equal(abortedAfter.reason.current, bFence);
  assert.equal(report.lost, 1);
  assert.equal(report.finished, 0, "A did not try to finish a run it lost");
  assert.ok(events.some((e) => e.type === "lost"));

  // Nothing of A's stale step landed; B's holding is intact and B can finish.
  const batch = await operator.readEvents(run);
  assert.deepEqual(
    batch.events.map((e) => e.type),
    ["a-step-1"],
  );
  assert.equal(await operator.readCheckpoint(run, "cp_stale"), null);
  const life = await worker.finish(run, bFence, { status: "completed", result: "by B" });
  assert.equal(life.finishedFence, bFence);
});

test("a renewal that finds another holder aborts the signal at once, and later steps are refused before they are sent", async () => {
  const runId = "takeover-renewal";
  const run = serve.run(runId);
  await operator.enqueue(run, { checkpoint: firstCheckpoint("y") });
  const log: string[] = [];
  const paused = deferred<number>();
  const resume = deferred();
  let abortReason: unknown;
  let localRefusal: unknown;
  // A's renewals (claims of the run) are held until B has taken the run.
  const renewalsMayGo = deferred();
  const sent: string[] = [];
  const clientA = new RunkeepClient({
    baseUrl: serve.url,
    token: serve.token("worker"),
    tenant: "acme",
    fetch: async (input, init) => {
      const url = String(input);
      if (url.includes(`/runs/${runId}/claim`)) {
        await renewalsMayGo.promise;
        log.push("A's renewal sent");
      }
      if (url.includes(`/runs/${runId}/`)) sent.push(`${init?.method} ${new URL(url).pathname.split("/").pop()}`);
      return fetch(input, init);
    },
  });
  const workerA = runWorker({
    client: clientA,
    holder: "worker-A2",
    // Renewal 1 s after the claim; the watchdog would stop the work at 2.7 s.
    ttlMs: 3000,
    mode: "until-idle",
    handler: async (ctx) => {
      paused.resolve(ctx.fence);
      await resume.promise;
      log.push("A waits on its signal");
      // The handler does nothing but wait for its signal (bounded by the test).
      await within(
        5000,
        new Promise<void>((r) => (ctx.signal.aborted ? r() : ctx.signal.addEventListener("abort", () => r(), { once: true }))),
        "A's signal",
      );
      abortReason = ctx.signal.reason;
      log.push("A's signal aborted");
      try {
        await ctx.step({ events: [{ type: "a-after-loss" }] });
      } catch (e) {
        localRefusal = e;
      }
      return undefined;
    },
  });
  const aFence = await within(10_000, paused.promise, "A's claim");
  const bFence = await takeOver(runId, log);
  renewalsMayGo.resolve();
  resume.resolve();
  const report = await within(10_000, workerA, "worker A");

  assert.deepEqual(log, [`B claimed at fence ${bFence}`, "A waits on its signal", "A's renewal sent", "A's signal aborted"]);
  assert.deepEqual(sent, ["POST claim"], "after the loss A sent nothing but its renewal: no step, no release, no finish");
  assert.ok(abortReason instanceof LeaseLost, `aborted with LeaseLost, got ${String(abortReason)}`);
  assert.equal(abortReason.kind, "superseded");
  assert.equal(abortReason.current, bFence);
  assert.ok(abortReason.fence >= aFence);
  assert.ok(localRefusal instanceof LeaseLost, "the step after the loss is refused locally");
  assert.equal(report.lost, 1);
  assert.equal(report.finished, 0);
  const batch = await operator.readEvents(run);
  assert.deepEqual(batch.events, [], "nothing of A's landed");
  const lease = await operator.lease(run);
  assert.equal(lease?.holder, "worker-B");
  assert.equal(lease?.fence, bFence);
});

/** A worker client whose requests to `runId` pass through `hook` first. */
function hookedClient(runId: string, hook: (what: string, init: RequestInit | undefined) => Promise<void>): RunkeepClient {
  return new RunkeepClient({
    baseUrl: serve.url,
    token: serve.token("worker"),
    tenant: "acme",
    fetch: async (input, init) => {
      const url = new URL(String(input));
      if (url.pathname.includes(`/runs/${runId}/`)) await hook(url.pathname.split("/").pop()!, init);
      return fetch(input, init);
    },
  });
}

test("a renewal waits for the write in flight, so the write never presents a retired fence", async () => {
  const runId = "renewal-vs-write";
  const run = serve.run(runId);
  await operator.enqueue(run, { checkpoint: firstCheckpoint("z") });
  const log: string[] = [];
  // The step is held at the client for 900 ms; the renewal is due 500 ms after the claim
  // (and would give up at 1350 ms).
  const client = hookedClient(runId, async (what) => {
    if (what === "steps") {
      log.push("step sent");
      await new Promise((r) => setTimeout(r, 900));
    }
    if (what === "claim") log.push("renewal sent");
  });
  let stepFence = 0;
  const report = await within(
    10_000,
    runWorker({
      client,
      holder: "gated",
      ttlMs: 1500,
      mode: "until-idle",
      onEvent: (e) => {
        if (e.type === "renewed") log.push(`renewed ${e.from} -> ${e.to}`);
      },
      handler: async (ctx) => {
        stepFence = ctx.fence;
        const receipt = await ctx.step({ events: [{ type: "slow-step" }] });
        log.push(`step answered at generation ${receipt.events[0]?.generation}`);
        // Let a renewal land before finishing.
        while (!log.some((l) => l.startsWith("renewed")) && !ctx.signal.aborted) await new Promise((r) => setTimeout(r, 20));
      },
    }),
    "the worker",
  );
  assert.deepEqual(report, { claimed: 1, finished: 1, released: 0, snoozed: 0, failed: 0, timedOut: 0, deadLettered: 0, cancelled: 0, lost: 0, handedOver: 0, claimErrors: 0 });
  assert.deepEqual(log.slice(0, 4), [
    "step sent",
    `step answered at generation ${stepFence}`,
    "renewal sent",
    `renewed ${stepFence} -> ${stepFence + 1}`,
  ]);
});

test("a renewal that does not answer stops the work at the safety margin", async () => {
  const runId = "renewal-hangs";
  const run = serve.run(runId);
  await operator.enqueue(run, { checkpoint: firstCheckpoint("h") });
  const sent: string[] = [];
  // Renewals never reach the server: they hang until the worker gives up on them.
  const client = hookedClient(runId, async (what, init) => {
    sent.push(what);
    if (what === "claim") {
      await new Promise<void>((_, reject) => init?.signal?.addEventListener("abort", () => reject(init.signal?.reason)));
    }
  });
  let reason: unknown;
  let refused: unknown;
  const report = await within(
    10_000,
    runWorker({
      client,
      holder: "hung",
      ttlMs: 900,
      mode: "until-idle",
      handler: async (ctx) => {
        await within(5000, new Promise<void>((r) => ctx.signal.addEventListener("abort", () => r(), { once: true })), "A's signal");
        reason = ctx.signal.reason;
        await ctx.step({ events: [{ type: "after-expiry" }] }).catch((e: unknown) => (refused = e));
      },
    }),
    "the worker",
  );
  assert.ok(reason instanceof LeaseLost, String(reason));
  assert.equal(reason.kind, "expiring");
  assert.ok(refused instanceof LeaseLost, "the step after the margin is refused locally");
  assert.deepEqual(sent, ["claim"], "only the hung renewal was sent: no step after the margin");
  assert.equal(report.lost, 1);
  assert.deepEqual((await operator.readEvents(run)).events, []);
});

for (const yieldFirst of [false, true]) {
test(`a handler that blocked the event loop past its lease is refused locally${yieldFirst ? " (timers run first)" : " (writing at once)"}: the store alone would still take the write`, async () => {
  const runId = `blocked-loop-${yieldFirst}`;
  const run = serve.run(runId);
  await operator.enqueue(run, { checkpoint: firstCheckpoint("b") });
  const sent: string[] = [];
  const client = hookedClient(runId, async (what) => {
    sent.push(what);
  });
  let refused: unknown;
  let fence = 0;
  // Stop claiming once the lease is lost (else this drain would take the expired run again).
  const stop = new AbortController();
  const report = await within(
    10_000,
    runWorker({
      client,
      holder: "blocker",
      ttlMs: 500,
      mode: "until-idle",
      signal: stop.signal,
      onEvent: (e) => {
        if (e.type === "lost") stop.abort();
      },
      handler: async (ctx) => {
        fence = ctx.fence;
        // Synchronous work longer than the lease: no timer (renewal, watchdog) can run meanwhile.
        const until = performance.now() + 700;
        while (performance.now() < until) {
          /* busy */
        }
        // At once: the write's own deadline check refuses it. After a yield: the overdue
        // renewal runs first and gives the lease up without sending anything.
        if (yieldFirst) await new Promise((r) => setTimeout(r, 0));
        await ctx.step({ events: [{ type: "after-block" }] }).catch((e: unknown) => (refused = e));
      },
    }),
    "the worker",
  );
  assert.ok(refused instanceof LeaseLost, String(refused));
  assert.equal(refused.kind, "expiring");
  assert.deepEqual(sent, [], "nothing was sent after the block: no step, no renewal");
  assert.equal(report.lost, 1);
  // Nobody took the run over, so the store would have accepted that write at the old fence:
  // the local deadline is what stopped it.
  const lease = await operator.lease(run);
  assert.equal(lease?.fence, fence);
  assert.equal(lease?.expired, true);
  const accepted = await worker.appendEvents(run, [{ type: "probe" }], { fence });
  assert.equal(accepted.length, 1, "the store takes a write at an expired but unsuperseded fence");
  // Out of the way of the next test's drain.
  const cleanup = await worker.claim(run, { holder: "cleanup", ttlMs: 30_000 });
  assert.equal(cleanup.outcome, "acquired");
  if (cleanup.outcome === "acquired") await worker.finish(run, cleanup.lease.fence, { status: "cancelled" });
});
}
