/**
 * Reads are pages (issue 26 item 2): `readEvents` answers one page of the
 * server's default size and says where the next starts, `readAllEvents`
 * pages through all of them, and `listCheckpoints` pages through the
 * checkpoints with their states (or their summaries, without).
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { MAX_EVENTS_PAGE, type RunkeepClient } from "../src/index.js";
import { Serve } from "./helpers/serve.js";

let serve: Serve;
let operator: RunkeepClient;

before(async () => {
  serve = await Serve.start();
  operator = serve.client("operator");
});

after(async () => {
  await serve?.close();
});

async function append(run: ReturnType<Serve["run"]>, n: number): Promise<void> {
  for (let done = 0; done < n; ) {
    const batch = Array.from({ length: Math.min(2000, n - done) }, (_, i) => ({ type: "note", payload: { i: done + i } }));
    await operator.appendEvents(run, batch);
    done += batch.length;
  }
}

test("readEvents answers a page of 1000 with more and nextSinceSeq; readAllEvents reads every page", async () => {
  const run = serve.run("reads-events");
  const total = MAX_EVENTS_PAGE + 250;
  await append(run, total);
  const page = await operator.readEvents(run);
  assert.equal(page.events.length, 1000);
  assert.equal(page.more, true);
  assert.equal(page.nextSinceSeq, 1000);
  assert.equal(page.lastSeq, total);

  const all = await operator.readAllEvents(run);
  assert.equal(all.events.length, total);
  assert.ok(all.events.every((e, i) => e.seq === i + 1));
  assert.equal(all.lastSeq, total);

  const rest = await operator.readAllEvents(run, { sinceSeq: total - 5, integrity: "strict" });
  assert.deepEqual(
    rest.events.map((e) => e.seq),
    [1, 2, 3, 4, 5].map((i) => total - 5 + i),
  );
});

test("listCheckpoints: every checkpoint with its state by default, summaries without", async () => {
  const run = serve.run("reads-checkpoints");
  for (let i = 0; i < 3; i++) {
    await operator.writeCheckpoint(run, { id: `cp_${i}`, createdAt: 1000 + i, state: { n: i } });
  }
  const full = await operator.listCheckpoints(run);
  assert.deepEqual(
    full.map((c) => [c.id, c.state]),
    [0, 1, 2].map((i) => [`cp_${i}`, { n: i }]),
  );
  const summaries = await operator.listCheckpoints(run, { fields: "summary" });
  assert.deepEqual(
    summaries.map((c) => [c.id, "state" in c]),
    [0, 1, 2].map((i) => [`cp_${i}`, false]),
  );
});
