/**
 * The thread routes (checkpoint savers) through the client against a live
 * `runkeep serve`: a checkpoint with the values it changed read back by
 * version, the latest by id order, listings in one thread and across
 * threads with `before`/`limit`/`filter`, the writes' conflict rule, a
 * superseded fence refused, deletion.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { FencedOut, type RunkeepClient } from "../src/index.js";
import { Serve } from "./helpers/serve.js";

let serve: Serve;
let worker: RunkeepClient;

before(async () => {
  serve = await Serve.start();
  worker = serve.client("worker");
});

after(async () => {
  await serve?.close();
});

const b64 = (s: string) => Buffer.from(s).toString("base64");

test("thread checkpoints, values by version, listings, writes and deletion", async () => {
  const run = serve.run("thread-t1");
  const other = serve.run("thread-t2");
  await worker.putThreadCheckpoint(run, {
    thread: "t1",
    checkpointId: "c1",
    checkpoint: { channel_versions: { a: 1, b: 1 } },
    metadata: { source: "input", step: -1 },
    blobs: [
      { channel: "a", version: "1", type: "json", data: b64('"A1"') },
      { channel: "b", version: "1", type: "json", data: b64('"B1"') },
    ],
  });
  await worker.putThreadCheckpoint(run, {
    thread: "t1",
    checkpointId: "c2",
    parentId: "c1",
    checkpoint: { channel_versions: { a: 2, b: 1 } },
    metadata: { source: "loop", step: 0 },
    blobs: [{ channel: "a", version: "2", type: "json", data: b64('"A2"') }],
  });
  await worker.putThreadCheckpoint(other, {
    thread: "t2",
    ns: "child",
    checkpointId: "c0",
    checkpoint: { channel_versions: {} },
    metadata: { source: "loop" },
  });

  const latest = await worker.getThreadCheckpoint(run);
  assert.equal(latest?.checkpointId, "c2");
  assert.equal(latest?.parentId, "c1");
  assert.deepEqual(
    latest?.values.map((v) => [v.channel, v.version]).sort(),
    [
      ["a", "2"],
      ["b", "1"],
    ],
    "b is carried from c1",
  );
  assert.equal(await worker.getThreadCheckpoint(run, { checkpointId: "nope" }), null);

  const listed = await worker.listThreadCheckpoints(run, { filter: { source: "loop" } });
  assert.deepEqual(listed.map((c) => c.checkpointId), ["c2"]);
  assert.deepEqual((await worker.listThreadCheckpoints(run, { before: "c2" })).map((c) => c.checkpointId), ["c1"]);

  const across = await worker.listThreadsCheckpoints({ project: serve.options.project, session: serve.options.session });
  assert.deepEqual(across.map((c) => [c.thread, c.checkpointId]), [
    ["t1", "c2"],
    ["t1", "c1"],
    ["t2", "c0"],
  ]);
  assert.equal((await worker.listThreadsCheckpoints({ project: serve.options.project, limit: 1 })).length, 1);
  assert.deepEqual((await worker.listThreadsCheckpoints({ ns: "child" })).map((c) => c.thread), ["t2"]);

  // A repeated ordinary write is ignored; a special slot is replaced.
  const w = { thread: "t1", checkpointId: "c2", taskId: "task" };
  await worker.putThreadWrites(run, { ...w, writes: [{ idx: 0, channel: "x", type: "json", data: b64("1") }] });
  await worker.putThreadWrites(run, {
    ...w,
    writes: [
      { idx: 0, channel: "x", type: "json", data: b64("2") },
      { idx: -1, channel: "__error__", type: "json", data: b64('"e1"') },
    ],
  });
  await worker.putThreadWrites(run, { ...w, writes: [{ idx: -1, channel: "__error__", type: "json", data: b64('"e2"') }] });
  const writes = (await worker.getThreadCheckpoint(run, { checkpointId: "c2" }))?.writes ?? [];
  assert.deepEqual(
    writes.map((x) => [x.idx, x.channel, Buffer.from(x.data ?? "", "base64").toString()]),
    [
      [-1, "__error__", '"e2"'],
      [0, "x", "1"],
    ],
  );

  const deleted = await worker.deleteThread(run);
  assert.equal(deleted.checkpointCount, 3, "two checkpoints and one writes record");
  assert.equal(await worker.getThreadCheckpoint(run), null);
});

test("a thread write under a superseded fence is FencedOut, and nothing of it lands", async () => {
  const run = serve.run("thread-fenced");
  const first = await worker.claim(run, { holder: "a", ttlMs: 30_000 });
  assert.equal(first.outcome, "acquired");
  const stale = first.outcome === "acquired" ? first.lease.fence : 0;
  await worker.release(run, { fence: stale });
  const second = await worker.claim(run, { holder: "b", ttlMs: 30_000 });
  const current = second.outcome === "acquired" ? second.lease.fence : 0;
  assert.ok(current > stale);
  const body = { thread: "tf", checkpointId: "c1", checkpoint: { channel_versions: {} } };
  await assert.rejects(worker.putThreadCheckpoint(run, body, { fence: stale }), (e: unknown) => {
    assert.ok(e instanceof FencedOut);
    assert.deepEqual([e.presented, e.current], [stale, current]);
    return true;
  });
  assert.equal(await worker.getThreadCheckpoint(run), null);
  await worker.putThreadCheckpoint(run, body, { fence: current });
  assert.equal((await worker.getThreadCheckpoint(run))?.fence, current);
});
