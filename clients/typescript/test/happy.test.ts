/**
 * The whole happy path against a live `runkeep serve`: enqueue →
 * claim_next → checkpoint → events → step → finish → the listing shows the
 * run finished; then the same through the worker helper, with a renewal in
 * the middle whose new fence the later step carries.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { runWorker, type RunkeepClient, type WorkerEvent } from "../src/index.js";
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

test("raw client: enqueue, claim_next, checkpoint, events, step, finish, listing", async () => {
  const run = serve.run("happy-raw");
  const who = await worker.whoami();
  assert.deepEqual([who.tenant, who.role], ["acme", "worker"]);

  const enqueued = await worker.enqueue(run, { checkpoint: firstCheckpoint({ n: 21 }) });
  assert.equal(enqueued.id, "cp_input");

  const { claimed } = await worker.claimNext({ holder: "raw-1", ttlMs: 30_000, waitMs: 1000 });
  assert.ok(claimed, "claim_next took the enqueued run");
  assert.equal(claimed.run.runId, "happy-raw");
  const fence = claimed.lease.fence;
  assert.equal(fence, 1);

  const resume = await worker.resumePoint(run);
  assert.deepEqual(resume?.state, { input: { n: 21 } });

  const cp = await worker.writeCheckpoint(run, { id: "cp_0001", createdAt: Date.now(), state: { half: 21 } }, { fence });
  assert.equal(cp.fence, fence, "the store stamps the fence it was written under");

  const appended = await worker.appendEvents(run, [{ type: "thought", payload: { text: "doubling" } }], { fence });
  assert.deepEqual(
    appended.map((e) => [e.seq, e.type, e.generation]),
    [[1, "thought", fence]],
  );

  const receipt = await worker.commitStep(run, fence, {
    events: [{ type: "tool", payload: { name: "double" } }, { type: "answer", payload: { value: 42 } }],
    checkpoint: { id: "cp_0002", createdAt: Date.now(), state: { answer: 42 } },
  });
  assert.deepEqual(
    receipt.events.map((e) => e.seq),
    [2, 3],
  );
  assert.equal(receipt.checkpoint?.id, "cp_0002");

  const life = await worker.finish(run, fence, { status: "completed", result: { answer: 42 } });
  assert.equal(life.status, "completed");
  assert.equal(life.finishedFence, fence);

  const page = await operator.listRuns({ status: ["completed"] });
  const row = page.entries.find((r) => r.run.runId === "happy-raw");
  assert.ok(row, "the listing shows the finished run");
  assert.equal(row.status, "completed");
  assert.equal(row.checkpointCount, 3);
  assert.equal(row.latestCheckpointId, "cp_0002");
  assert.ok(row.finishedAt !== undefined);
  const active = await operator.listRuns({ status: ["active"] });
  assert.ok(!active.entries.some((r) => r.run.runId === "happy-raw"), "not listed as active any more");

  const summary = await operator.summary(run);
  assert.equal(summary.lastSeq, 3);
  assert.deepEqual(summary.lifecycle.result, { answer: 42 });

  const batch = await operator.readEvents(run, { sinceSeq: 1 });
  assert.deepEqual(
    batch.events.map((e) => e.type),
    ["tool", "answer"],
  );

  // The tail replays the transcript from the start, then would wait for more.
  const seen: number[] = [];
  for await (const ev of operator.tail(run)) {
    seen.push(ev.seq);
    if (ev.seq === 3) break;
  }
  assert.deepEqual(seen, [1, 2, 3]);

  // A finished run is not handed out again.
  const again = await worker.claimNext({ holder: "raw-2", ttlMs: 30_000 });
  assert.equal(again.claimed, null);
});

test("worker helper: claim_next, renewal at a third of the TTL, fenced steps, finish", async () => {
  const run = serve.run("happy-worker");
  await operator.enqueue(run, { checkpoint: firstCheckpoint("go") });
  const events: WorkerEvent[] = [];
  let renewedOnce!: () => void;
  const renewed = new Promise<void>((r) => (renewedOnce = r));
  const fences: number[] = [];
  const report = await within(
    20_000,
    runWorker({
      client: worker,
      holder: "helper-1",
      ttlMs: 900,
      mode: "until-idle",
      onEvent: (e) => {
        events.push(e);
        if (e.type === "renewed") renewedOnce();
      },
      handler: async (ctx) => {
        const resume = await ctx.resumePoint();
        assert.deepEqual(resume?.state, { input: "go" });
        fences.push(ctx.fence);
        await ctx.step({ events: [{ type: "before-renewal" }] });
        // Wait (on the lease's signal too) until the keeper has renewed.
        await within(5000, renewed, "a renewal");
        assert.equal(ctx.signal.aborted, false);
        fences.push(ctx.fence);
        await ctx.fenced((fence, signal) => ctx.client.writeReport(ctx.ref, `renewed to ${fence}`, { fence, signal }));
        await ctx.step({
          events: [{ type: "after-renewal" }],
          checkpoint: { id: "cp_done", createdAt: Date.now(), state: { ok: true } },
        });
        return { finish: { status: "completed", result: { by: "helper-1" } } };
      },
    }),
    "the worker",
  );
  assert.deepEqual(report, { claimed: 1, finished: 1, released: 0, snoozed: 0, failed: 0, timedOut: 0, deadLettered: 0, cancelled: 0, lost: 0, handedOver: 0, claimErrors: 0 });
  const [first, second] = fences as [number, number];
  assert.ok(second > first, `the renewal minted a higher fence (${first} -> ${second})`);
  const renewal = events.find((e) => e.type === "renewed");
  assert.ok(renewal && renewal.type === "renewed" && renewal.from === first && renewal.to === second);

  // Each step carried the fence current at its time (the event's generation).
  const batch = await operator.readEvents(run);
  assert.deepEqual(
    batch.events.map((e) => [e.type, e.generation]),
    [
      ["before-renewal", first],
      ["after-renewal", second],
    ],
  );
  assert.equal(await operator.readReport(run), `renewed to ${second}`, "ctx.fenced wrote under the renewed fence");
  const life = await operator.lifecycle(run);
  assert.equal(life.status, "completed");
  assert.ok((life.finishedFence ?? 0) >= second, "finished under the renewed holding");
  assert.deepEqual(life.result, { by: "helper-1" });
});

test("worker helper: a handler that finishes in its last step is not finished twice", async () => {
  const run = serve.run("happy-step-finish");
  await operator.enqueue(run, { checkpoint: firstCheckpoint(1) });
  const report = await runWorker({
    client: worker,
    ttlMs: 30_000,
    mode: "until-idle",
    handler: async (ctx) => {
      await ctx.step({ events: [{ type: "last" }], finish: { status: "completed", result: "in-step" } });
      await assert.rejects(ctx.step({ events: [{ type: "too-late" }] }), /already ended/);
      return undefined;
    },
  });
  assert.equal(report.finished, 1);
  const life = await operator.lifecycle(run);
  assert.equal(life.result, "in-step");
  const batch = await operator.readEvents(run);
  assert.deepEqual(
    batch.events.map((e) => e.type),
    ["last"],
  );
});
