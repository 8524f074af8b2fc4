/**
 * The worker's drain hands over: a drained run's finishing commit (a
 * `ctx.step` with `finish`, or the worker's own finish when the handler
 * returns) also claims the drain's next run (`commitStepAndClaimNext`),
 * which the same slot works next. Against a live `runkeep serve`, with the
 * client's calls counted and, where a test needs it, the wire rewritten in
 * a `fetch` hook.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  RunkeepClient,
  runWorker,
  sleep,
  Unavailable,
  type ClaimNextBody,
  type NextClaimBody,
  type OutcomeBody,
  type RunContext,
  type WorkerEvent,
  type WorkerOptions,
  type WorkResult,
} from "../src/index.js";
import { firstCheckpoint, Serve, within } from "./helpers/serve.js";

let serve: Serve;
let operator: RunkeepClient;

before(async () => {
  serve = await Serve.start();
  operator = serve.client("operator");
});

after(async () => {
  await serve?.close();
});

/** Each test drains its own project, so no test takes another's runs. */
function runIn(project: string, runId: string) {
  return { ...serve.run(runId), projectId: project };
}

async function enqueue(project: string, n: number): Promise<string[]> {
  const ids = Array.from({ length: n }, (_, i) => `${project}-${String(i).padStart(2, "0")}`);
  for (const id of ids) await operator.enqueue(runIn(project, id), { checkpoint: firstCheckpoint(id) });
  return ids;
}

/** A worker client whose claim and commit calls are counted (and their bodies kept). */
function countedClient(fetchImpl?: typeof fetch) {
  const client = new RunkeepClient({
    baseUrl: serve.url,
    token: serve.token("worker"),
    tenant: serve.options.tenant,
    ...(fetchImpl ? { fetch: fetchImpl } : {}),
  });
  const calls = { claimNext: [] as ClaimNextBody[], handOver: [] as NextClaimBody[], commitStep: 0, finish: 0 };
  const { claimNext, commitStepAndClaimNext, commitStep, finish } = client;
  client.claimNext = (body, options) => {
    calls.claimNext.push(body);
    return claimNext.call(client, body, options);
  };
  client.commitStepAndClaimNext = (run, fence, step, next, options) => {
    calls.handOver.push(next);
    return commitStepAndClaimNext.call(client, run, fence, step, next, options);
  };
  client.commitStep = (...args) => {
    calls.commitStep += 1;
    return commitStep.apply(client, args);
  };
  client.finish = (...args) => {
    calls.finish += 1;
    return finish.apply(client, args);
  };
  return { client, calls };
}

/**
 * Ends every run with one `done` step: even runs finish in that step
 * (`ctx.step` with `finish`), odd runs by returning `{ finish }` (the
 * worker's own finish), so both finishing paths hand over.
 */
async function doneStep(ctx: RunContext, worked: Map<string, number>): Promise<WorkResult> {
  const id = ctx.run.runId;
  worked.set(id, (worked.get(id) ?? 0) + 1);
  const result = { run: id };
  if (Number(id.slice(-2)) % 2 === 0) {
    await ctx.step({ events: [{ type: "done" }], finish: { status: "completed", result } });
    return undefined;
  }
  await ctx.step({ events: [{ type: "done" }] });
  return { finish: { status: "completed", result } };
}

/** From the store: every run completed with its own result, exactly one `done` event; and worked once. */
async function auditFinishedOnce(project: string, ids: string[], worked: Map<string, number>): Promise<void> {
  for (const id of ids) {
    const run = runIn(project, id);
    const life = await operator.lifecycle(run);
    assert.equal(life.status, "completed", `${id} completed`);
    assert.deepEqual(life.result, { run: id }, `${id}: its own result`);
    const events = (await operator.readEvents(run, { integrity: "strict" })).events;
    assert.deepEqual(
      events.map((e) => e.type),
      ["done"],
      `${id}: exactly one finishing step landed`,
    );
    assert.equal(worked.get(id), 1, `${id}: the handler ran once`);
  }
  assert.equal(worked.size, ids.length, "no other run was worked");
}

function drainOptions(project: string, client: RunkeepClient): Omit<WorkerOptions, "handler"> {
  return {
    client,
    holder: `drain-${project}`,
    ttlMs: 30_000,
    maxAttempts: 7,
    mode: "until-idle",
    filter: { project },
  };
}

test("a busy drain hands over: claimNext only to start and to find the queue empty; with handover: false, once per run", async () => {
  const N = 12;
  // A runnable run outside the drain's filter: a hand-over must not take it either.
  const decoy = runIn("ho-decoy", "decoy");
  await operator.enqueue(decoy, { checkpoint: firstCheckpoint("decoy") });

  const on = await enqueue("ho-busy", N);
  const counted = countedClient();
  const worked = new Map<string, number>();
  const report = await within(
    20_000,
    runWorker({ ...drainOptions("ho-busy", counted.client), handler: (ctx) => doneStep(ctx, worked) }),
    "the drain with hand-overs",
  );
  await auditFinishedOnce("ho-busy", on, worked);
  assert.deepEqual(report, {
    claimed: N,
    finished: N,
    released: 0,
    snoozed: 0,
    failed: 0,
    timedOut: 0,
    deadLettered: 0,
    cancelled: 0,
    lost: 0,
    handedOver: N - 1,
    claimErrors: 0,
  });
  assert.equal(counted.calls.claimNext.length, 2, "claimNext took the first run and then found the queue empty");
  assert.equal(counted.calls.handOver.length, N, "every finishing commit was a hand-over (the last one took nothing)");
  assert.deepEqual([counted.calls.commitStep, counted.calls.finish], [N / 2, 0], "only the odd runs' non-finishing steps went alone");
  // The hand-over claims exactly as the drain's claimNext does (less the long-poll).
  const { waitMs, ...claim } = counted.calls.claimNext[0]!;
  assert.equal(waitMs, 0);
  assert.deepEqual(claim, { holder: "drain-ho-busy", ttlMs: 30_000, maxAttempts: 7, project: "ho-busy" });
  for (const next of counted.calls.handOver) assert.deepEqual(next, claim);

  const off = await enqueue("ho-off", N);
  const plain = countedClient();
  const workedOff = new Map<string, number>();
  const reportOff = await within(
    20_000,
    runWorker({ ...drainOptions("ho-off", plain.client), handover: false, handler: (ctx) => doneStep(ctx, workedOff) }),
    "the drain without hand-overs",
  );
  await auditFinishedOnce("ho-off", off, workedOff);
  assert.deepEqual([reportOff.claimed, reportOff.finished, reportOff.handedOver], [N, N, 0]);
  assert.equal(plain.calls.claimNext.length, N + 1, "without hand-overs: one claimNext per run, and one finding none");
  assert.equal(plain.calls.handOver.length, 0);
  assert.deepEqual([plain.calls.commitStep, plain.calls.finish], [N, N / 2], "steps and finishes went alone");

  assert.equal(await operator.lease(decoy), null, "the run outside the filter was never claimed");
  console.log(
    `hand-over drain of ${N}: claimNext ${counted.calls.claimNext.length}, hand-overs ${counted.calls.handOver.length}, handedOver ${report.handedOver}; ` +
      `without: claimNext ${plain.calls.claimNext.length}, hand-overs 0`,
  );
});

test("concurrency 2 with hand-overs: never more than 2 runs worked at once", async () => {
  const project = "ho-bound";
  const ids = await enqueue(project, 16);
  const worked = new Map<string, number>();
  let working = 0;
  let highWater = 0;
  const report = await within(
    30_000,
    runWorker({
      ...drainOptions(project, serve.client("worker")),
      concurrency: 2,
      handler: async (ctx) => {
        working += 1;
        highWater = Math.max(highWater, working);
        try {
          await sleep(5);
          const result = await doneStep(ctx, worked);
          // Still working after the finishing commit: a run handed over must wait for this slot.
          await sleep(30);
          return result;
        } finally {
          working -= 1;
        }
      },
    }),
    "the drain",
  );
  await auditFinishedOnce(project, ids, worked);
  assert.equal(report.finished, ids.length);
  assert.ok(report.handedOver >= ids.length / 2, `most runs were handed over (${report.handedOver})`);
  assert.equal(highWater, 2, "two slots worked in parallel, never more");
});

/** A `fetch` that makes every other hand-over a step whose claim failed after it committed (`nextError`). */
function failingNextClaims(injected: { count: number }): typeof fetch {
  let handOvers = 0;
  return async (input, init) => {
    const url = new URL(String(input));
    if (!url.pathname.endsWith("/steps/hand-over") || handOvers++ % 2 === 1) return fetch(input, init);
    // Commit the step alone, as a store that claims after committing would, then fail the claim.
    const { fence, step } = JSON.parse(String(init?.body)) as { fence: number; step: unknown };
    url.pathname = url.pathname.replace(/\/hand-over$/, "");
    const res = await fetch(url, { ...init, body: JSON.stringify({ fence, step }) });
    if (!res.ok) return res;
    injected.count += 1;
    const nextError = {
      type: "urn:runkeep:problem:unavailable",
      title: "Unavailable",
      status: 503,
      detail: "injected: the claim failed after the step committed",
    };
    const headers = new Headers(res.headers);
    headers.delete("content-length");
    return new Response(JSON.stringify({ receipt: await res.json(), next: null, nextError }), { status: 200, headers });
  };
}

test("a hand-over whose claim fails after the step (nextError): the step stands, the error is counted, the slot claims itself", async () => {
  const project = "ho-nexterr";
  const N = 10;
  const ids = await enqueue(project, N);
  const injected = { count: 0 };
  const counted = countedClient(failingNextClaims(injected));
  const worked = new Map<string, number>();
  const errors: unknown[] = [];
  const report = await within(
    20_000,
    runWorker({
      ...drainOptions(project, counted.client),
      onEvent: (e: WorkerEvent) => {
        if (e.type === "error") errors.push(e.error);
      },
      handler: (ctx) => doneStep(ctx, worked),
    }),
    "the drain",
  );
  await auditFinishedOnce(project, ids, worked);
  // Hand-overs 1, 3, 5, 7, 9 failed their claim; 2, 4, 6, 8 took the next run; 10 found none.
  assert.equal(injected.count, N / 2);
  assert.deepEqual(report, {
    claimed: N,
    finished: N,
    released: 0,
    snoozed: 0,
    failed: 0,
    timedOut: 0,
    deadLettered: 0,
    cancelled: 0,
    lost: 0,
    handedOver: N / 2 - 1,
    claimErrors: N / 2,
  });
  assert.equal(counted.calls.claimNext.length, 1 + N / 2 + 1, "the first claim, one after each failed hand-over claim, one finding none");
  assert.equal(errors.length, N / 2);
  for (const e of errors) assert.ok(e instanceof Unavailable && /injected/.test(e.message), String(e));
});

/**
 * A client whose hand-over answers arrive whole, then `whenAnswered` runs
 * (before the worker sees them).
 */
function onHandOverAnswer(whenAnswered: () => void): RunkeepClient {
  return new RunkeepClient({
    baseUrl: serve.url,
    token: serve.token("worker"),
    tenant: serve.options.tenant,
    fetch: async (input, init) => {
      const res = await fetch(input, init);
      if (!String(input).includes("/steps/hand-over")) return res;
      const body = await res.arrayBuffer();
      whenAnswered();
      return new Response(body, { status: res.status, headers: res.headers });
    },
  });
}

for (const finishing of ["in its last step", "by returning"] as const) {
  test(`the worker stopping as a run is handed over (finished ${finishing}) releases that run unworked`, async () => {
    const project = `ho-stop-${finishing === "in its last step" ? "step" : "return"}`;
    const ids = await enqueue(project, 3);
    const stop = new AbortController();
    const worked: string[] = [];
    const handedOver: string[] = [];
    const report = await within(
      10_000,
      runWorker({
        ...drainOptions(project, onHandOverAnswer(() => stop.abort(new Error("shutting down")))),
        mode: "continuous",
        waitMs: 1000,
        signal: stop.signal,
        onEvent: (e) => {
          if (e.type === "claimed" && e.handedOver) handedOver.push(e.run.runId);
        },
        handler: async (ctx) => {
          worked.push(ctx.run.runId);
          const finish: OutcomeBody = { status: "completed", result: { run: ctx.run.runId } };
          if (finishing === "by returning") return { finish };
          await ctx.step({ events: [{ type: "done" }], finish });
          return undefined;
        },
      }),
      "the worker",
    );
    assert.equal(worked.length, 1, "one run worked");
    assert.equal(handedOver.length, 1, "one run handed over");
    const [first, next] = [worked[0]!, handedOver[0]!];
    assert.notEqual(first, next);
    assert.deepEqual(
      [report.claimed, report.handedOver, report.finished, report.released, report.lost],
      [2, 1, 1, 1, 0],
      "the handed-over run counted as claimed, then released",
    );
    assert.equal((await operator.lifecycle(runIn(project, first))).status, "completed");
    const lease = await operator.lease(runIn(project, next));
    assert.equal(lease?.holder, "", "released: no holder");
    const other = serve.client("worker");
    const taken = await other.claim(runIn(project, next), { holder: "someone-else", ttlMs: 30_000 });
    assert.equal(taken.outcome, "acquired", "someone else takes the released run at once");
    assert.deepEqual((await operator.readEvents(runIn(project, next))).events, [], "the released run was not worked");
    // Out of the way: finish what is left.
    if (taken.outcome === "acquired") await other.finish(runIn(project, next), taken.lease.fence, { status: "cancelled" });
    for (const id of ids.filter((i) => i !== first && i !== next)) {
      assert.equal(await operator.lease(runIn(project, id)), null, `${id} was never claimed`);
    }
  });
}

test("a hand-over's lost answer: the step is resolved as a lost finish, the run it claimed waits out its lease, then is taken and worked once", async () => {
  const project = "ho-lost";
  const ids = await enqueue(project, 2);
  const ttlMs = 1500;
  let lostAt = 0;
  let dropped = 0;
  // The first hand-over reaches the server (the step commits, the next run is claimed); its answer is lost.
  const client = new RunkeepClient({
    baseUrl: serve.url,
    token: serve.token("worker"),
    tenant: serve.options.tenant,
    fetch: async (input, init) => {
      const res = await fetch(input, init);
      if (String(input).includes("/steps/hand-over") && dropped++ === 0) {
        await res.arrayBuffer();
        lostAt = performance.now();
        throw new TypeError("fetch failed", { cause: Object.assign(new Error("socket hang up"), { code: "ECONNRESET" }) });
      }
      return res;
    },
  });
  const stop = new AbortController();
  const worked: string[] = [];
  const errors: unknown[] = [];
  let finished = 0;
  let secondAfterMs = 0;
  const report = await within(
    15_000,
    runWorker({
      ...drainOptions(project, client),
      ttlMs,
      mode: "continuous",
      waitMs: 200,
      signal: stop.signal,
      onEvent: (e) => {
        if (e.type === "error") errors.push(e.error);
        if (e.type === "finished" && ++finished === 1) stop.abort();
      },
      handler: (ctx) => {
        worked.push(ctx.run.runId);
        if (worked.length === 2) secondAfterMs = performance.now() - lostAt;
        return { finish: { status: "completed", result: { run: ctx.run.runId } } };
      },
    }),
    "the worker",
  );
  assert.equal(worked.length, 2, `both runs worked once (${worked.join(", ")})`);
  assert.deepEqual([...worked].sort(), ids);
  assert.equal(dropped, 2, "two hand-overs: the lost one and the second run's");
  assert.equal(errors.length, 1, "the lost answer was reported");
  assert.ok(errors[0] instanceof Error && /may or may not have landed/.test(errors[0].message), String(errors[0]));
  assert.ok(secondAfterMs >= ttlMs * 0.6, `the run claimed in the lost answer was worked only once its lease lapsed (${Math.round(secondAfterMs)} ms)`);
  assert.deepEqual([report.claimed, report.handedOver, report.finished], [2, 0, 1], "the lost answer's finish and claim are not counted");
  for (const id of ids) assert.equal((await operator.lifecycle(runIn(project, id))).status, "completed", `${id} completed`);
});
