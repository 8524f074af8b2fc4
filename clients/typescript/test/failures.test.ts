/**
 * Failures a worker meets (docs/design/worker-protocol.md, "Failed
 * attempts", "A release sticks", "Cancel"), against a live server: a
 * handler that throws is a failed attempt, retried after the run's own
 * backoff and dead-lettered at its limit with its errors kept; an attempt
 * timeout; an operator's cancel and an operator's release under a running
 * worker stop its handler within one renewal interval, and nothing it
 * writes afterwards lands.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  attemptError,
  attemptErrorOf,
  AttemptTimedOut,
  Cancelled,
  Conflict,
  LeaseLost,
  MAX_ERROR_MESSAGE_CHARS,
  problemError,
  RunkeepClient,
  runWorker,
  sleep,
  TYPE_PREFIX,
  type RunContext,
  type WorkerEvent,
  type WorkerOptions,
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

/** Each test's run in a session of its own, so a worker's filter sees only it. */
function at(id: string) {
  return { ...serve.run(id), sessionId: id };
}

/** The filter of a worker that takes only `id`'s session. */
function only(id: string) {
  return { project: serve.options.project, session: id };
}

/** A small retry policy: 50 ms, ×2, at most 200 ms. */
const QUICK = { baseMs: 50, factor: 2, capMs: 200 };

/** A worker client whose requests are logged (method, path, when). */
function loggedClient(): { client: RunkeepClient; log: { method: string; path: string; at: number }[] } {
  const log: { method: string; path: string; at: number }[] = [];
  const client = new RunkeepClient({
    baseUrl: serve.url,
    token: serve.token("worker"),
    tenant: serve.options.tenant,
    fetch: (input, init) => {
      log.push({ method: init?.method ?? "GET", path: new URL(String(input)).pathname, at: performance.now() });
      return fetch(input, init);
    },
  });
  return { client, log };
}

/**
 * Drains until `done` says so (checked on every worker event), then stops
 * the worker; answers its report.
 */
async function drainUntil(
  options: Omit<WorkerOptions, "client" | "ttlMs"> & Partial<Pick<WorkerOptions, "client" | "ttlMs">>,
  done: (e: WorkerEvent) => boolean,
  ms = 20_000,
): Promise<WorkerReport> {
  const stop = new AbortController();
  return within(
    ms,
    runWorker({
      client: worker,
      ttlMs: 30_000,
      waitMs: 200,
      signal: stop.signal,
      ...options,
      onEvent: (e) => {
        options.onEvent?.(e);
        if (done(e)) stop.abort(new Error("test done"));
      },
    }),
    "the worker",
  );
}

async function eventCount(runId: string): Promise<number> {
  return (await operator.readAllEvents(at(runId))).events.length;
}

test("a handler that throws every time is dead-lettered after exactly its limit, its errors kept, nothing committed", async () => {
  const run = at("fail-always");
  await operator.enqueue(run, { checkpoint: firstCheckpoint("x"), maxAttempts: 3, retry: QUICK });
  let calls = 0;
  const report = await drainUntil(
    {
      filter: only("fail-always"),
      handler: () => {
        calls += 1;
        throw new TypeError(`boom ${calls}`);
      },
    },
    (e) => e.type === "failed" && e.deadLettered,
  );
  assert.equal(calls, 3, "exactly three attempts");
  assert.deepEqual(
    [report.claimed, report.failed, report.deadLettered, report.timedOut, report.finished, report.snoozed, report.lost],
    [3, 3, 1, 0, 0, 0, 0],
  );
  const l = await operator.lifecycle(run);
  assert.equal(l.status, "failed");
  assert.equal(l.reason, "attempts exhausted");
  assert.equal(l.deadLettered, true);
  assert.equal(l.attempts, 3);
  assert.deepEqual(l.retry, QUICK);
  const failures = l.failures ?? [];
  assert.deepEqual(
    failures.map((f) => [f.attempt, f.kind, f.message]),
    [
      [1, "TypeError", "boom 1"],
      [2, "TypeError", "boom 2"],
      [3, "TypeError", "boom 3"],
    ],
  );
  assert.ok(failures[0]!.retryAt != null && failures[1]!.retryAt != null, "the first two were deferred");
  assert.equal(failures[2]!.retryAt ?? null, null, "the last one dead-lettered the run");
  for (const [i, f] of failures.slice(0, 2).entries()) {
    // The run's own policy: attempt n waits between half and all of min(50 × 2^(n-1), 200) ms.
    const full = Math.min(50 * 2 ** i, 200);
    const wait = f.retryAt! - f.at;
    assert.ok(wait >= full / 2 && wait <= full, `attempt ${f.attempt} deferred ${wait} ms`);
    assert.ok(failures[i + 1]!.at >= f.retryAt!, "the next attempt came after the backoff");
  }
  assert.equal(await eventCount("fail-always"), 0, "no step committed");
});

test("a handler that throws once then succeeds completes with one failure on record", async () => {
  const run = at("fail-once");
  await operator.enqueue(run, { checkpoint: firstCheckpoint("x"), maxAttempts: 3, retry: QUICK });
  let calls = 0;
  const report = await drainUntil(
    {
      filter: only("fail-once"),
      handler: async (ctx) => {
        calls += 1;
        if (calls === 1) throw new RangeError("flaky");
        await ctx.step({ events: [{ type: "done", payload: { calls } }] });
        return { finish: { status: "completed", result: { calls } } };
      },
    },
    (e) => e.type === "finished",
  );
  assert.deepEqual([report.claimed, report.failed, report.deadLettered, report.finished], [2, 1, 0, 1]);
  const l = await operator.lifecycle(run);
  assert.equal(l.status, "completed");
  assert.equal(l.attempts, 1);
  assert.deepEqual(
    (l.failures ?? []).map((f) => [f.attempt, f.kind, f.message]),
    [[1, "RangeError", "flaky"]],
  );
  assert.equal(await eventCount("fail-once"), 1);
});

test("a handler past the attempt timeout is aborted and its attempt failed as timeout; its later writes are refused", async () => {
  const run = at("fail-timeout");
  await operator.enqueue(run, { checkpoint: firstCheckpoint("x"), maxAttempts: 5, retry: { baseMs: 60_000, factor: 1, capMs: 60_000 } });
  let reason: unknown;
  let lateWrite: unknown;
  let lateFenced: unknown;
  let handlerDone!: () => void;
  const handlerEnded = new Promise<void>((r) => (handlerDone = r));
  const started = performance.now();
  let abortedAfter = 0;
  const report = await within(
    10_000,
    runWorker({
      client: worker,
      ttlMs: 30_000,
      mode: "until-idle",
      filter: only("fail-timeout"),
      attemptTimeoutMs: 300,
      handler: async (ctx: RunContext) => {
        try {
          // Would run for a minute; it stops when its signal aborts.
          await sleep(60_000, ctx.signal).catch(() => undefined);
          abortedAfter = performance.now() - started;
          reason = ctx.signal.reason;
          // A handler that goes on writing anyway is refused before anything is sent.
          await ctx.step({ events: [{ type: "late" }] }).catch((e: unknown) => {
            lateWrite = e;
          });
          // Also a write that does not pass the aborted signal on: refused by the worker, not sent.
          await ctx
            .fenced((fence) => ctx.client.appendEvents(ctx.ref, [{ type: "late-fenced" }], { fence }))
            .catch((e: unknown) => {
              lateFenced = e;
            });
        } finally {
          handlerDone();
        }
      },
    }),
    "the worker",
  );
  await within(5000, handlerEnded, "the handler");
  assert.ok(reason instanceof AttemptTimedOut, `aborted with ${String(reason)}`);
  assert.equal(reason.timeoutMs, 300);
  assert.ok(abortedAfter >= 300 && abortedAfter < 2000, `aborted after ${abortedAfter} ms`);
  assert.ok(lateWrite instanceof AttemptTimedOut, `the late write: ${String(lateWrite)}`);
  assert.ok(lateFenced instanceof AttemptTimedOut, `the late fenced write: ${String(lateFenced)}`);
  assert.deepEqual([report.failed, report.timedOut, report.deadLettered, report.finished, report.lost], [1, 1, 0, 0, 0]);
  const l = await operator.lifecycle(run);
  assert.equal(l.status, "active");
  assert.equal(l.attempts, 1);
  const [f] = l.failures ?? [];
  assert.equal(f?.kind, "timeout");
  assert.match(f?.message ?? "", /attempt timeout of 300 ms/);
  assert.equal(await eventCount("fail-timeout"), 0, "the late write did not land");
});

test("the run's own attempt timeout (enqueue, carried by its lease) holds when it is shorter than the worker's", async () => {
  const run = at("fail-own-timeout");
  await operator.enqueue(run, {
    checkpoint: firstCheckpoint("x"),
    attemptTimeoutMs: 250,
    retry: { baseMs: 60_000, factor: 1, capMs: 60_000 },
  });
  let reason: unknown;
  let leaseLimit: unknown;
  const report = await within(
    10_000,
    runWorker({
      client: worker,
      ttlMs: 30_000,
      mode: "until-idle",
      filter: only("fail-own-timeout"),
      attemptTimeoutMs: 20_000,
      handler: async (ctx) => {
        leaseLimit = ctx.lease.attemptTimeoutMs;
        await sleep(60_000, ctx.signal).catch(() => undefined);
        reason = ctx.signal.reason;
      },
    }),
    "the worker",
  );
  assert.equal(leaseLimit, 250, "the lease carries the run's attempt timeout");
  assert.ok(reason instanceof AttemptTimedOut, `aborted with ${String(reason)}`);
  assert.equal(reason.timeoutMs, 250);
  assert.deepEqual([report.failed, report.timedOut], [1, 1]);
  const [f] = (await operator.lifecycle(run)).failures ?? [];
  assert.equal(f?.kind, "timeout");
});

/** Starts a worker (short TTL) on `runId` whose handler would run for a minute. */
function longHandler(runId: string, ttlMs: number, writes: boolean) {
  const { client, log } = loggedClient();
  const events: WorkerEvent[] = [];
  let abortedAt = 0;
  let reason: unknown;
  let lateWrite: unknown;
  let accepted = 0;
  let inHandler!: (fence: number) => void;
  const started = new Promise<number>((r) => (inHandler = r));
  // Stops at the loss: a run given back after a gap is claimable at once, by this worker too.
  const stop = new AbortController();
  const report = runWorker({
    client,
    ttlMs,
    mode: "until-idle",
    filter: only(runId),
    signal: stop.signal,
    onEvent: (e) => {
      events.push(e);
      if (e.type === "lost" || e.type === "cancelled") stop.abort(new Error("test done"));
    },
    handler: async (ctx) => {
      ctx.signal.addEventListener("abort", () => {
        abortedAt = performance.now();
        reason = ctx.signal.reason;
      });
      inHandler(ctx.fence);
      for (let n = 0; n < 600 && !ctx.signal.aborted; n++) {
        if (writes) {
          await ctx
            .step({ events: [{ type: "tick", payload: { n } }] })
            .then(() => (accepted += 1))
            .catch(() => undefined);
        }
        await sleep(100, ctx.signal).catch(() => undefined);
      }
      // A handler that goes on writing after the abort is refused before anything is sent.
      await ctx.step({ events: [{ type: "late" }] }).catch((e: unknown) => {
        lateWrite = e;
      });
      throw ctx.signal.reason;
    },
  });
  return {
    report,
    started,
    log,
    events,
    get abortedAt() {
      return abortedAt;
    },
    get reason() {
      return reason;
    },
    get lateWrite() {
      return lateWrite;
    },
    get accepted() {
      return accepted;
    },
  };
}

for (const writes of [false, true]) {
  test(`an operator's cancel aborts the handler with Cancelled within one renewal interval (${writes ? "a handler writing every 100 ms: its refused write tells" : "a handler not writing: the renewal tells"}); nothing more is written or reported`, async () => {
    const id = writes ? "cancel-writing" : "cancel-waiting";
    const run = at(id);
    await operator.enqueue(run, { checkpoint: firstCheckpoint("x"), maxAttempts: 5 });
    const ttlMs = 1500;
    const interval = ttlMs / 3;
    const h = longHandler(id, ttlMs, writes);
    await within(10_000, h.started, "the handler");
    await sleep(700); // past the first renewal
    const cancelSent = performance.now();
    const cancelled = await operator.cancel(run, { reason: "customer left" });
    const cancelDone = performance.now();
    const eventsAtCancel = await eventCount(id);
    assert.equal(cancelled.status, "cancelled");
    const report = await within(15_000, h.report, "the worker");
    const took = h.abortedAt - cancelSent;
    console.log(`# ${id}: the handler's signal aborted ${took.toFixed(0)} ms after the cancel was sent (renewal interval ${interval} ms)`);
    assert.ok(h.abortedAt > 0, "the signal aborted");
    // One renewal interval, plus the time of the renewal's request and its lifecycle read.
    assert.ok(took <= interval + 300, `aborted ${took.toFixed(0)} ms after the cancel; one renewal interval is ${interval} ms`);
    assert.ok(h.reason instanceof Cancelled, `aborted with ${String(h.reason)}`);
    assert.equal(h.reason.reason, "customer left");
    assert.equal(h.reason.run, id);
    assert.ok(h.lateWrite instanceof Cancelled, `the late write: ${String(h.lateWrite)}`);
    if (writes) {
      assert.ok(h.accepted > 0, "steps landed before the cancel");
      // The first refused write stopped the handler: no step was sent after it.
      const steps = h.log.filter((r) => r.at > cancelDone && r.path.endsWith("/steps"));
      assert.ok(steps.length <= 1, `${steps.length} steps sent after the cancel`);
    }
    assert.equal(await eventCount(id), eventsAtCancel, "a write landed after the cancel");
    assert.deepEqual(
      [report.cancelled, report.lost, report.failed, report.finished, report.released, report.snoozed],
      [1, 0, 0, 0, 0, 0],
    );
    assert.ok(h.events.some((e) => e.type === "cancelled"));
    // Nothing ended the run after the cancel: no release, finish, snooze or failed attempt was sent.
    const ends = h.log.filter((r) => r.at > cancelSent && /\/runs\/[^/]+\/(release|finish|snooze|attempts\/failed)$/.test(r.path));
    assert.deepEqual(ends, []);
    const l = await operator.lifecycle(run);
    assert.deepEqual([l.status, l.reason, l.attempts, (l.failures ?? []).length], ["cancelled", "customer left", 0, 0]);
    // Never handed out again.
    const again = await worker.claim(run, { holder: "another", ttlMs: 1000 });
    assert.equal(again.outcome, "finished");
  });
}

test("a release sticks: an operator's release under a running worker makes its next renewal a gap; the handler is aborted, the holding given back, no write lands", async () => {
  const id = "release-under";
  const run = at(id);
  await operator.enqueue(run, { checkpoint: firstCheckpoint("x"), maxAttempts: 5 });
  const ttlMs = 1500;
  const interval = ttlMs / 3;
  const h = longHandler(id, ttlMs, false);
  await within(10_000, h.started, "the handler");
  await sleep(700); // past the first renewal
  const held = (await operator.lease(run))!;
  const releasedAt = performance.now();
  assert.equal((await operator.release(run)).done, true, "the operator's release took effect");
  const eventsAtRelease = await eventCount(id);
  const report = await within(15_000, h.report, "the worker");
  const took = h.abortedAt - releasedAt;
  console.log(`# ${id}: the handler's signal aborted ${took.toFixed(0)} ms after the release (renewal interval ${interval} ms)`);
  assert.ok(h.abortedAt > 0, "the signal aborted");
  assert.ok(took <= interval + 300, `aborted ${took.toFixed(0)} ms after the release; one renewal interval is ${interval} ms`);
  assert.ok(h.reason instanceof LeaseLost, `aborted with ${String(h.reason)}`);
  assert.equal(h.reason.kind, "gap");
  assert.ok(h.reason.fence >= held.fence, "the fence held when the release landed");
  const gap = h.reason.current!;
  assert.equal(gap, h.reason.fence + 2, "the renewal answered the claim over the release's tombstone");
  assert.ok(h.lateWrite instanceof LeaseLost, `the late write: ${String(h.lateWrite)}`);
  assert.equal(await eventCount(id), eventsAtRelease, "a write landed after the release");
  assert.deepEqual([report.lost, report.cancelled, report.failed, report.finished, report.released], [1, 0, 0, 0, 0]);
  // The holding the renewal took was given back: the run is claimable at once, by anyone.
  const lease = await operator.lease(run);
  assert.equal(lease?.holder, "", "released");
  assert.equal(lease?.fence, gap + 1, "the holding the renewal took was released");
  const taken = await worker.claim(run, { holder: "next", ttlMs: 1000 });
  assert.equal(taken.outcome, "acquired");
});

test("the cancelled problem maps to Cancelled (run, operation, reason): a write, a failed attempt and a renewal of a cancelled run", async () => {
  const e = problemError({ type: `${TYPE_PREFIX}cancelled`, title: "Run cancelled", status: 409, run: "r", operation: "finish", reason: "why" });
  assert.ok(e instanceof Cancelled);
  assert.deepEqual([e.slug, e.status, e.run, e.operation, e.reason, e.retryable], ["cancelled", 409, "r", "finish", "why", false]);

  const run = at("cancel-refused");
  await operator.enqueue(run, { checkpoint: firstCheckpoint("x") });
  const claimed = await worker.claim(run, { holder: "w-c", ttlMs: 30_000 });
  assert.equal(claimed.outcome, "acquired");
  const fence = claimed.outcome === "acquired" ? claimed.lease.fence : 0;
  const answer = await operator.cancel(run, { reason: "not needed" });
  assert.deepEqual([answer.status, answer.reason], ["cancelled", "not needed"]);
  await assert.rejects(worker.commitStep(run, fence, { events: [{ type: "x" }] }), (err: unknown) => {
    assert.ok(err instanceof Cancelled, String(err));
    assert.deepEqual([err.run, err.operation, err.reason, err.status], ["cancel-refused", "commit_step", "not needed", 409]);
    return true;
  });
  // A failed attempt or a finish reported on the cancelled run is refused as cancelled too.
  await assert.rejects(worker.failAttempt(run, fence, { kind: "Error", message: "x" }), Cancelled);
  await assert.rejects(worker.finish(run, fence, { status: "completed" }), Cancelled);
  const renewal = await worker.claim(run, { holder: "w-c", ttlMs: 30_000 });
  assert.deepEqual(renewal.outcome === "finished" ? renewal.status : renewal.outcome, "cancelled");
  // A finished run cannot be cancelled again; a run never claimed can be.
  await assert.rejects(operator.cancel(run), Conflict);
  const idle = at("cancel-idle");
  await operator.enqueue(idle, { checkpoint: firstCheckpoint("x") });
  const l = await operator.cancel(idle);
  assert.deepEqual([l.status, l.reason], ["cancelled", "cancelled by an operator"]);
});

test("an error's kind and message are cut to the store's limits with a marker (code points, as the store counts)", async () => {
  assert.deepEqual(attemptError("", "m"), { kind: "error", message: "m" });
  assert.deepEqual(attemptErrorOf(new TypeError("t")), { kind: "TypeError", message: "t" });
  assert.deepEqual(attemptErrorOf("a string"), { kind: "error", message: "a string" });
  assert.deepEqual(attemptErrorOf({ message: "no name" }), { kind: "error", message: "no name" });
  const long = "é😀x".repeat(2000); // 6000 code points, 8000 UTF-16 units
  const cut = attemptError("k".repeat(200), long);
  assert.equal(Array.from(cut.kind).length, 128);
  assert.match(cut.kind, / … \[72 more characters cut\]$/);
  assert.equal(Array.from(cut.message).length, MAX_ERROR_MESSAGE_CHARS);
  assert.match(cut.message, / … \[1904 more characters cut\]$/);
  assert.equal(attemptError("k", "é".repeat(4096)).message, "é".repeat(4096), "at the limit: kept whole");

  // The server takes what the client cut (it refuses anything longer).
  const run = at("cut-message");
  await operator.enqueue(run, { checkpoint: firstCheckpoint("x"), retry: QUICK });
  const claimed = await worker.claim(run, { holder: "w-cut", ttlMs: 30_000 });
  const fence = claimed.outcome === "acquired" ? claimed.lease.fence : 0;
  const l = await worker.failAttempt(run, fence, { kind: "Error", message: long });
  const [f] = l.failures ?? [];
  assert.equal(f?.message, cut.message);
  assert.equal(l.status, "active");
});
