/**
 * The event tail resumes after a dropped connection without a gap or a
 * repeat.
 *
 * The interleaving is forced with the iterator's own backpressure: the test
 * stops pulling after event 5, SIGKILLs the server (the connection drops
 * mid-stream), restarts it on the same port and directory store, appends
 * events 6–8 while the tail is disconnected, and only then pulls again. The
 * tail must reconnect with `Last-Event-ID: 5` and deliver 6, 7, 8, then
 * 9, 10 live.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";

import { RunkeepClient, type TailReconnect } from "../src/index.js";
import { firstCheckpoint, Serve, within } from "./helpers/serve.js";

let serve: Serve | undefined;

after(async () => {
  await serve?.close();
});

test("the SSE tail resumes across a server restart with no gap and no repeat", async () => {
  serve = await Serve.start({ store: "fs", project: "default", session: "default" });
  const run = serve.run("run_tail1");
  const token = serve.token("worker");
  const reader = serve.token("reader");
  const w = new RunkeepClient({ baseUrl: serve.url, token, tenant: "acme" });
  await w.enqueue(run, { checkpoint: firstCheckpoint("tail") });
  const claim = await w.claim(run, { holder: "tail-writer", ttlMs: 60_000 });
  assert.equal(claim.outcome, "acquired");
  if (claim.outcome !== "acquired") return;
  let fence = claim.lease.fence;
  const append = (from: number, to: number) =>
    w.appendEvents(
      run,
      Array.from({ length: to - from + 1 }, (_, i) => ({ type: "tick", payload: { n: from + i } })),
      { fence },
    );
  await append(1, 5);

  const reconnects: TailReconnect[] = [];
  const controller = new AbortController();
  const tailer = new RunkeepClient({ baseUrl: serve.url, token: reader, tenant: "acme" });
  const tail = tailer.tail(run, {
    signal: controller.signal,
    retryDelayMs: 50,
    onReconnect: (r) => reconnects.push(r),
  })[Symbol.asyncIterator]();
  const seen: number[] = [];
  const pull = async () => {
    const r = await within(15_000, tail.next(), `tail event after ${seen.at(-1) ?? 0}`);
    assert.equal(r.done, false);
    if (r.done) throw new Error("unreachable");
    seen.push(r.value.seq);
    assert.equal(r.value.payload["n"], r.value.seq, "each event is the one appended at that seq");
    return r.value;
  };
  for (let i = 0; i < 5; i++) await pull();
  assert.deepEqual(seen, [1, 2, 3, 4, 5]);
  assert.equal(reconnects.length, 0);

  // Drop the connection: kill the server, start it again on the same port and store.
  await serve.kill();
  serve = await serve.restart();
  assert.equal(new URL(serve.url).port, new URL(tailer.baseUrl).port, "restarted on the same port");
  // Events appended while the tail is disconnected (the same holder renews).
  const renewed = await w.claim(run, { holder: "tail-writer", ttlMs: 60_000 });
  assert.equal(renewed.outcome, "acquired");
  if (renewed.outcome === "acquired") fence = renewed.lease.fence;
  await append(6, 8);

  for (let i = 0; i < 3; i++) await pull();
  assert.deepEqual(seen, [1, 2, 3, 4, 5, 6, 7, 8]);
  assert.ok(reconnects.length >= 1, "the tail reconnected");
  assert.equal(reconnects[0]?.lastSeq, 5, "it resumed after the last event it delivered");

  // And live events keep coming on the new connection.
  const live = pull();
  await append(9, 10);
  await live;
  await pull();
  assert.deepEqual(seen, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);

  // Aborting the signal ends the iteration with the signal's reason.
  const pending = tail.next();
  controller.abort(new Error("test done"));
  await assert.rejects(pending, /test done/);
});

test("a tail of a run in another tenant is refused, not retried", async () => {
  const s = serve ?? (serve = await Serve.start());
  const c = new RunkeepClient({ baseUrl: s.url, token: s.token("reader"), tenant: "acme" });
  const reconnects: TailReconnect[] = [];
  const it = c.tail({ ...s.run("x"), tenantId: "other" }, { onReconnect: (r) => reconnects.push(r) });
  await assert.rejects(
    (async () => {
      for await (const _ of it) void _;
    })(),
    { name: "NotFound", status: 404 },
  );
  assert.equal(reconnects.length, 0);
});
