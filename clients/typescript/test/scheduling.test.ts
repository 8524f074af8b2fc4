/**
 * Issue 30 through the client against a live `runkeep serve`: an enqueue's
 * priority, concurrency key and idempotency key; `setPriority` (an
 * operator's, refused to a worker); the listing's priority order and
 * `minPriority`; a claim at the key's limit answers `atLimit`; the key's
 * holdings; bad input is `InvalidInput` naming the field.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Conflict, Forbidden, InvalidInput, type RunkeepClient } from "../src/index.js";
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

test("priorities order the listing and only an operator changes one", async () => {
  await worker.enqueue(serve.run("p-low"), { checkpoint: firstCheckpoint(1), priority: -3 });
  await worker.enqueue(serve.run("p-mid"), { checkpoint: firstCheckpoint(2) });
  await worker.enqueue(serve.run("p-high"), { checkpoint: firstCheckpoint(3), priority: 8 });
  const { project, session } = serve.options;
  const ids = async (q: { minPriority?: number }) =>
    (await reader.listRuns({ project, session, order: "priority", ...q })).entries.map((r) => r.run.runId);
  assert.deepEqual(await ids({}), ["p-high", "p-mid", "p-low"]);
  assert.deepEqual(await ids({ minPriority: 0 }), ["p-high", "p-mid"]);

  await assert.rejects(worker.setPriority(serve.run("p-low"), 100), (e: unknown) => {
    assert.ok(e instanceof Forbidden, String(e));
    assert.equal(e.requiredRole, "operator");
    return true;
  });
  const l = await operator.setPriority(serve.run("p-low"), 100);
  assert.equal(l.priority, 100);
  assert.deepEqual(await ids({}), ["p-low", "p-high", "p-mid"]);

  await assert.rejects(operator.setPriority(serve.run("p-mid"), 2_000_000), (e: unknown) => {
    assert.ok(e instanceof InvalidInput, String(e));
    assert.equal(e.field, "priority");
    return true;
  });
  await operator.cancel(serve.run("p-mid"));
  await assert.rejects(operator.setPriority(serve.run("p-mid"), 1), Conflict);
});

test("a key at its limit answers atLimit and its holdings are read", async () => {
  const concurrency = { key: "customer:7/eu", limit: 1 };
  await worker.enqueue(serve.run("k-a"), { checkpoint: firstCheckpoint(1), concurrency });
  await worker.enqueue(serve.run("k-b"), { checkpoint: firstCheckpoint(2), concurrency });
  const a = await worker.claim(serve.run("k-a"), { holder: "w1", ttlMs: 60_000 });
  assert.equal(a.outcome, "acquired");
  const b = await worker.claim(serve.run("k-b"), { holder: "w2", ttlMs: 60_000 });
  assert.equal(b.outcome, "atLimit");
  if (b.outcome === "atLimit") assert.deepEqual([b.key, b.limit, b.held], ["customer:7/eu", 1, 1]);
  const { project, session } = serve.options;
  const h = await reader.keyHoldings({ projectId: project, sessionId: session }, "customer:7/eu");
  assert.equal(h.key, "customer:7/eu");
  assert.deepEqual(
    h.holdings.map((x) => [x.runId, x.fence]),
    [["k-a", 1]],
  );
  await assert.rejects(reader.keyHoldings({ projectId: project, sessionId: session }, "a b"), (e: unknown) => {
    assert.ok(e instanceof InvalidInput, String(e));
    assert.equal(e.field, "key");
    return true;
  });
  await assert.rejects(
    worker.enqueue(serve.run("k-bad"), { checkpoint: firstCheckpoint(3), concurrency: { key: "k", limit: 0 } }),
    (e: unknown) => {
      assert.ok(e instanceof InvalidInput, String(e));
      assert.equal(e.field, "concurrency.limit");
      return true;
    },
  );
});

test("an idempotency key answers the first run inside its window", async () => {
  const dedupe = { key: "order-42", windowMs: 600_000 };
  const first = await worker.enqueueOnce(serve.run("d-1"), { checkpoint: firstCheckpoint(1), dedupe });
  assert.equal(first.created, true);
  assert.equal(first.run.runId, "d-1");
  assert.equal(first.checkpoint?.id, "cp_input");
  const second = await worker.enqueueOnce(serve.run("d-2"), { checkpoint: firstCheckpoint(2), dedupe });
  assert.equal(second.created, false);
  assert.equal(second.run.runId, "d-1");
  await assert.rejects(worker.summary(serve.run("d-2")));
  await assert.rejects(
    worker.enqueueOnce(serve.run("d-3"), {
      checkpoint: firstCheckpoint(3),
      dedupe: { key: "x", windowMs: 31 * 24 * 3600 * 1000 },
    }),
    (e: unknown) => {
      assert.ok(e instanceof InvalidInput, String(e));
      assert.equal(e.field, "dedupe.windowMs");
      return true;
    },
  );
});

test("an operator prunes finished runs past their retention", async () => {
  const { project, session } = serve.options;
  await worker.enqueue(serve.run("r-done"), { checkpoint: firstCheckpoint(1) });
  await worker.enqueue(serve.run("r-open"), { checkpoint: firstCheckpoint(2) });
  const c = await worker.claim(serve.run("r-done"), { holder: "w1", ttlMs: 60_000 });
  assert.equal(c.outcome, "acquired");
  if (c.outcome !== "acquired") return;
  await worker.finish(serve.run("r-done"), c.lease.fence, { status: "completed" });
  await assert.rejects(worker.pruneFinished({ keepFinishedForMs: 1, limit: 10, project, session }), Forbidden);
  // Judged an hour later: the finished run is due, the active one is not.
  const now = Date.now() + 3_600_000;
  const report = await operator.pruneFinished({ keepFinishedForMs: 60_000, limit: 100, project, session, now });
  // The session is shared with the tests above (their finished runs are
  // due too): this run is among the deleted, the active one is not.
  const deleted = report.deleted.map((r) => r.runId);
  assert.ok(deleted.includes("r-done") && !deleted.includes("r-open"), String(deleted));
  assert.equal(report.more, false);
  const rows = (await reader.listRuns({ project, session })).entries.map((r) => r.run.runId);
  assert.ok(rows.includes("r-open") && !rows.includes("r-done"), String(rows));
  await assert.rejects(operator.pruneFinished({ keepFinishedForMs: 0, limit: 10, project, session }), InvalidInput);
});
