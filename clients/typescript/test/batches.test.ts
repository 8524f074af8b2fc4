/**
 * Batches against a live `runkeep serve`: `claimNextBatch` takes several
 * runs in one request, each under its own lease and fence; `commitSteps`
 * commits several runs' steps in one request, one outcome per step (a
 * released run's step is refused alone with `FencedOut`); a bad batch and
 * a reader token are refused, changing nothing.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { FencedOut, Forbidden, InvalidInput, type RunkeepClient, type StepBody } from "../src/index.js";
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
