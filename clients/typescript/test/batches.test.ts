/**
 * Batches against a live `runkeep serve`: `claimNextBatch` takes several
 * runs in one request, each under its own lease and fence; `commitSteps`
 * commits several runs' steps in one request, one outcome per step (a
 * released run's step is refused alone with `FencedOut`); a bad batch and
 * a reader token are refused, changing nothing.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { FencedOut, Forbidden, InvalidInput, RunkeepClient, runWorker, type StepBody } from "../src/index.js";
import { firstCheckpoint, Serve } from "./helpers/serve.js";

let serve: Serve;
let worker: RunkeepClient;
let operator: RunkeepClient;
let reader: RunkeepClient;

before(async () => {
  serve = await Serve.start();
  worker = serve.client("worker");
  operator = serve.client("operator");
  reader = serve.client("reader");
});

after(async () => {
  await serve?.close();
});

const note = (n: string): StepBody => ({ events: [{ type: "note", payload: { n } }] });

test("claimNextBatch takes runs in claim order, each leased alone; commitSteps refuses only the stale step", async () => {
  for (const [i, id] of ["b-1", "b-2", "b-3", "b-4"].entries()) {
    await operator.enqueue(serve.run(id), { checkpoint: firstCheckpoint(i + 1) });
  }
  const taken = await worker.claimNextBatch(3, { holder: "ts-batch", ttlMs: 30_000 });
  assert.deepEqual(
    taken.map((c) => c.run.runId),
    ["b-1", "b-2", "b-3"],
  );
  assert.equal(new Set(taken.map((c) => `${c.run.runId}@${c.lease.fence}`)).size, 3);
  for (const c of taken) {
    const lease = await operator.lease(serve.run(c.run.runId));
    assert.equal(lease?.fence, c.lease.fence, `${c.run.runId} is held at the fence the batch answered`);
  }
  const [one, two, three] = taken as [(typeof taken)[0], (typeof taken)[0], (typeof taken)[0]];
  assert.equal((await worker.release(serve.run(two.run.runId), { fence: two.lease.fence })).done, true);

  const outcomes = await worker.commitSteps(
    [one, two, three].map((c) => ({ run: serve.run(c.run.runId), fence: c.lease.fence, step: note(c.run.runId) })),
  );
  assert.equal(outcomes.length, 3);
  assert.deepEqual(
    outcomes[0]?.receipt?.events.map((e) => e.seq),
    [1],
  );
  assert.ok(outcomes[1]?.error instanceof FencedOut, `b-2's step: ${String(outcomes[1]?.error)}`);
  assert.deepEqual(
    outcomes[2]?.receipt?.events.map((e) => e.seq),
    [1],
  );
  assert.equal((await operator.readEvents(serve.run("b-2"))).events.length, 0, "the refused step left nothing");

  // The rest of the queue: the released run, then the fourth.
  const rest = await worker.claimNextBatch(5, { holder: "ts-batch", ttlMs: 30_000 });
  assert.deepEqual(
    rest.map((c) => c.run.runId),
    ["b-2", "b-4"],
  );
  assert.deepEqual(await worker.claimNextBatch(5, { holder: "ts-batch", ttlMs: 30_000 }), []);
});

test("a bad batch is refused whole and changes nothing; a reader may not claim or commit", async () => {
  await operator.enqueue(serve.run("bad-1"), { checkpoint: firstCheckpoint(1) });
  await assert.rejects(worker.claimNextBatch(0, { holder: "ts-bad", ttlMs: 30_000 }), InvalidInput);
  await assert.rejects(worker.claimNextBatch(257, { holder: "ts-bad", ttlMs: 30_000 }), InvalidInput);
  await assert.rejects(reader.claimNextBatch(1, { holder: "ts-bad", ttlMs: 30_000 }), Forbidden);
  assert.equal(await operator.lease(serve.run("bad-1")), null, "nothing was claimed");

  const [c] = await worker.claimNextBatch(1, { holder: "ts-bad", ttlMs: 30_000 });
  assert.ok(c);
  const step = { run: serve.run("bad-1"), fence: c.lease.fence, step: note("x") };
  await assert.rejects(worker.commitSteps([step, step]), InvalidInput, "a run twice");
  await assert.rejects(worker.commitSteps([]), InvalidInput, "an empty batch");
  await assert.rejects(reader.commitSteps([step]), Forbidden);
  assert.equal((await operator.readEvents(serve.run("bad-1"))).events.length, 0, "nothing was written");
});

test("runWorker with claimBatch fills its free slots with one claimNextBatch request; every run is worked once", async () => {
  const session = "worker-batch";
  const at = (runId: string) => ({ ...serve.run(runId), sessionId: session });
  const ids = Array.from({ length: 8 }, (_, i) => `wb-${i + 1}`);
  for (const [i, id] of ids.entries()) await operator.enqueue(at(id), { checkpoint: firstCheckpoint(i + 1) });
  const paths: string[] = [];
  const counting = new RunkeepClient({
    baseUrl: serve.url,
    token: serve.token("worker"),
    tenant: serve.options.tenant,
    fetch: (input, init) => {
      paths.push(new URL(input instanceof Request ? input.url : String(input)).pathname);
      return fetch(input, init);
    },
  });
  // The first four handlers wait for each other: they pass only if four runs were worked side by side.
  let arrived = 0;
  let release!: () => void;
  const allFour = new Promise<void>((r) => (release = r));
  const worked = new Map<string, number>();
  const report = await runWorker({
    client: counting,
    ttlMs: 30_000,
    mode: "until-idle",
    concurrency: 4,
    claimBatch: 4,
    handover: false,
    filter: { project: serve.options.project, session },
    handler: async (ctx) => {
      worked.set(ctx.run.runId, (worked.get(ctx.run.runId) ?? 0) + 1);
      if (worked.size <= 4) {
        arrived += 1;
        if (arrived === 4) release();
        await allFour;
      }
      return undefined;
    },
  });
  assert.equal(report.claimed, 8);
  assert.equal(report.finished, 8);
  assert.deepEqual([...worked.values()], Array(8).fill(1), "each run worked once");
  const batches = paths.filter((p) => p.endsWith("/claim-next-batch")).length;
  assert.ok(batches >= 1, `claim-next-batch requests: ${batches}`);
  assert.equal(paths.filter((p) => p.endsWith("/claim-next")).length, 0, "no single claims");
  assert.ok(batches < 8, `fewer claim requests than runs: ${batches}`);
  for (const id of ids) assert.equal((await operator.lifecycle(at(id))).status, "completed");
  await assert.rejects(runWorker({ client: counting, ttlMs: 30_000, claimBatch: 0, handler: () => undefined }), TypeError);
});
