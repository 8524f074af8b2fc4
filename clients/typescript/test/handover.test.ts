/**
 * The hand-over (`commitStepAndClaimNext`, `POST …/steps/hand-over`)
 * against a live `runkeep serve`: the step commits and the next run comes
 * back with its fence in one request; an empty queue answers no run with
 * the step committed; a stale fence rejects with `FencedOut` and claims
 * nothing; a misspelt field and a reader token are refused, changing
 * nothing.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { FencedOut, Forbidden, MalformedBody, type RunkeepClient, type StepBody } from "../src/index.js";
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

const done = (note: string): StepBody => ({
  events: [{ type: "note", payload: { note } }],
  finish: { status: "completed" },
});

/** Takes the next run; expects `runId`. */
async function takeNext(holder: string, runId: string): Promise<number> {
  const { claimed } = await worker.claimNext({ holder, ttlMs: 30_000 });
  assert.ok(claimed, `${runId} was claimable`);
  assert.equal(claimed.run.runId, runId);
  return claimed.lease.fence;
}

test("a hand-over commits the step and takes the next run in one request; an empty queue answers null", async () => {
  await operator.enqueue(serve.run("ho-a"), { checkpoint: firstCheckpoint(1) });
  await operator.enqueue(serve.run("ho-b"), { checkpoint: firstCheckpoint(2) });
  const fence = await takeNext("ts-1", "ho-a");

  const over = await worker.commitStepAndClaimNext(serve.run("ho-a"), fence, done("a"), { holder: "ts-1", ttlMs: 30_000 });
  assert.deepEqual(
    over.receipt.events.map((e) => [e.seq, e.type]),
    [[1, "note"]],
  );
  assert.equal(over.receipt.lifecycle?.status, "completed");
  assert.equal(over.nextError, null);
  assert.ok(over.next, "ho-b was handed over");
  assert.equal(over.next.run.runId, "ho-b");
  assert.equal(over.next.lease.holder, "ts-1");
  assert.equal((await operator.lifecycle(serve.run("ho-a"))).status, "completed");

  // The handed-over fence writes ho-b; the last hand-over finds nothing.
  const bFence = over.next.lease.fence;
  const last = await worker.commitStepAndClaimNext(serve.run("ho-b"), bFence, done("b"), { holder: "ts-1", ttlMs: 30_000 });
  assert.equal(last.next, null);
  assert.equal(last.nextError, null);
  assert.equal(last.receipt.lifecycle?.finishedFence, bFence);
  assert.equal((await operator.summary(serve.run("ho-b"))).lastSeq, 1);
});

test("a stale fence rejects with FencedOut and claims nothing; a typo and a reader are refused", async () => {
  const a = serve.run("ho-stale-a");
  await operator.enqueue(a, { checkpoint: firstCheckpoint(1) });
  await operator.enqueue(serve.run("ho-stale-b"), { checkpoint: firstCheckpoint(2) });
  const first = await takeNext("ts-2", "ho-stale-a");
  assert.equal((await worker.release(a, { fence: first })).done, true);
  const second = await takeNext("ts-2", "ho-stale-a");

  await assert.rejects(
    worker.commitStepAndClaimNext(a, first, done("stale"), { holder: "ts-2", ttlMs: 30_000 }),
    (e: unknown) => e instanceof FencedOut && e.presented === first && e.current === second,
  );
  // A misspelt member of `next` (and `waitMs`, which is claim-next's only).
  for (const next of [{ holdr: "ts-2", ttlMs: 30_000 }, { holder: "ts-2", ttlMs: 30_000, waitMs: 1000 }]) {
    await assert.rejects(
      // @ts-expect-error: the typo is the point
      worker.commitStepAndClaimNext(a, second, done("typo"), next),
      (e: unknown) => e instanceof MalformedBody && String(e.problem.field).startsWith("next."),
    );
  }
  await assert.rejects(
    reader.commitStepAndClaimNext(a, second, done("reader"), { holder: "r", ttlMs: 30_000 }),
    (e: unknown) => e instanceof Forbidden,
  );

  // Nothing of any of them landed, and ho-stale-b was not claimed.
  const summary = await operator.summary(a);
  assert.equal(summary.lastSeq, 0);
  assert.equal(summary.lifecycle.status, "active");
  assert.equal(summary.lease?.fence, second);
  assert.equal(await operator.lease(serve.run("ho-stale-b")), null);

  // The holder's own hand-over then takes it.
  const over = await worker.commitStepAndClaimNext(a, second, done("a"), { holder: "ts-2", ttlMs: 30_000 });
  assert.equal(over.next?.run.runId, "ho-stale-b");
  await worker.finish(serve.run("ho-stale-b"), over.next!.lease.fence, { status: "completed" });
});
