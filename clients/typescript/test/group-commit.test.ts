/**
 * The worker's group commit (`commitBatch`, `commitLingerMs`) against a live
 * `runkeep serve`, its requests counted in a `fetch` hook: the handlers'
 * finishes go out as `commitSteps` requests (fewer requests than runs,
 * every run completed once with its result); a run taken over while it
 * waits in a group is refused alone and the others commit; a renewal that
 * swaps a waiting run's fence is honoured (the group sends the current
 * fence), and one due while the group's request is in flight waits for
 * its answer; a request lost as a whole reports no run finished; `commitBatch`
 * 1 sends no group request; bad values are refused; a stopping worker
 * sends the finishes waiting in its group at once, and those that join
 * after the stop.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { LeaseLost, RunkeepClient, runWorker, type OutcomeBody, type WorkerEvent } from "../src/index.js";
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

/** What the worker's client sent, by kind of request. */
interface Sent {
  /** `POST /v1/tenants/{tenant}/steps`: group commits, with how many steps each. */
  groups: number[];
  /** `POST …/runs/{run}/steps`: single steps. */
  steps: number;
  /** `POST …/steps/hand-over`. */
  handOvers: number;
  /** `POST …/finish`. */
  finishes: number;
}

/**
 * A worker client whose requests are counted. `hook` (optional) sees a
 * group commit's request and may answer in its place.
 */
function countedClient(hook?: (send: () => Promise<Response>) => Promise<Response>): { client: RunkeepClient; sent: Sent } {
  const sent: Sent = { groups: [], steps: 0, handOvers: 0, finishes: 0 };
  const client = new RunkeepClient({
    baseUrl: serve.url,
    token: serve.token("worker"),
    tenant: serve.options.tenant,
    fetch: async (input, init) => {
      const path = new URL(input instanceof Request ? input.url : String(input)).pathname;
      if (/^\/v1\/tenants\/[^/]+\/steps$/.test(path)) {
        sent.groups.push((JSON.parse(String(init?.body)) as { steps: unknown[] }).steps.length);
        if (hook) return hook(() => fetch(input, init));
      } else if (path.endsWith("/steps/hand-over")) sent.handOvers += 1;
      else if (path.endsWith("/steps")) sent.steps += 1;
      else if (path.endsWith("/finish")) sent.finishes += 1;
      return fetch(input, init);
    },
  });
  return { client, sent };
}

/** Resolves once `n` callers have arrived (each caller waits for the rest). */
function barrier(n: number): () => Promise<void> {
  let arrived = 0;
  let open!: () => void;
  const all = new Promise<void>((r) => (open = r));
  return () => {
    arrived += 1;
    if (arrived === n) open();
    return all;
  };
}

const resultOf = (runId: string): OutcomeBody => ({ status: "completed", result: { run: runId } });

test("commitBatch groups the handlers' finishes: fewer commit requests than runs, every run completed once with its result", async () => {
  const project = "gc-many";
  const ids = await enqueue(project, 8);
  const { client, sent } = countedClient();
  // Four runs side by side, twice: each round's four finishes meet in one group.
  const rounds = [barrier(4), barrier(4)];
  let started = 0;
  const worked = new Map<string, number>();
  const finished: Array<{ run: string; outcome: OutcomeBody }> = [];
  const report = await within(
    20_000,
    runWorker({
      client,
      ttlMs: 30_000,
      mode: "until-idle",
      concurrency: 4,
      commitBatch: 4,
      commitLingerMs: 5_000,
      filter: { project },
      onEvent: (e) => {
        if (e.type === "finished") finished.push({ run: e.run.runId, outcome: e.outcome });
      },
      handler: async (ctx) => {
        worked.set(ctx.run.runId, (worked.get(ctx.run.runId) ?? 0) + 1);
        await rounds[Math.floor(started++ / 4)]!();
        return { finish: resultOf(ctx.run.runId) };
      },
    }),
    "the worker",
  );
  assert.deepEqual(report, { claimed: 8, finished: 8, released: 0, snoozed: 0, failed: 0, timedOut: 0, deadLettered: 0, cancelled: 0, lost: 0, handedOver: 0, claimErrors: 0 });
  assert.deepEqual([...worked.values()], Array(8).fill(1), "each run worked once");
  assert.deepEqual(sent.groups, [4, 4], "two group commits of four (the linger never ran out: the groups filled)");
  assert.deepEqual({ steps: sent.steps, handOvers: sent.handOvers, finishes: sent.finishes }, { steps: 0, handOvers: 0, finishes: 0 }, "no finish went alone, none handed over");
  assert.deepEqual(
    finished.sort((a, b) => a.run.localeCompare(b.run)),
    ids.map((id) => ({ run: id, outcome: resultOf(id) })),
    "one finished event per run, with the handler's outcome",
  );
  for (const id of ids) {
    const life = await operator.lifecycle(runIn(project, id));
    assert.equal(life.status, "completed", id);
    assert.deepEqual(life.result, { run: id }, `${id}'s result`);
    const lease = await operator.lease(runIn(project, id));
    assert.ok(lease === null || lease.expired, `${id} is not held: ${JSON.stringify(lease)}`);
  }
});

test("a run taken over while its finish waits in a group is refused alone; the others in the group commit", async () => {
  const project = "gc-stale";
  const ids = await enqueue(project, 3);
  const victim = ids[1]!;
  const thief = serve.client("worker");
  const { client, sent } = countedClient();
  const all = barrier(3);
  let thiefFence = 0;
  const events: WorkerEvent[] = [];
  const report = await within(
    20_000,
    runWorker({
      client,
      ttlMs: 30_000,
      mode: "until-idle",
      concurrency: 3,
      commitBatch: 3,
      commitLingerMs: 5_000,
      filter: { project },
      onEvent: (e) => events.push(e),
      handler: async (ctx) => {
        // All three are held before the victim is taken (no slot of this worker can claim it back).
        await all();
        if (ctx.run.runId === victim) {
          // Underneath the worker: its holding released, the run claimed by another holder.
          await thief.release(ctx.ref, { fence: ctx.fence });
          const taken = await thief.claim(ctx.ref, { holder: "thief", ttlMs: 30_000 });
          assert.equal(taken.outcome, "acquired");
          thiefFence = taken.outcome === "acquired" ? taken.lease.fence : 0;
        }
        return { finish: resultOf(ctx.run.runId) };
      },
    }),
    "the worker",
  );
  assert.deepEqual(sent.groups, [3], "the three finishes went as one group");
  assert.equal(sent.steps + sent.finishes, 0, "nothing went alone");
  assert.equal(report.finished, 2, JSON.stringify(events));
  assert.equal(report.lost, 1, JSON.stringify(events));
  const lost = events.filter((e): e is Extract<WorkerEvent, { type: "lost" }> => e.type === "lost");
  assert.deepEqual(
    lost.map((e) => e.run.runId),
    [victim],
  );
  assert.ok(lost[0]!.loss instanceof LeaseLost);
  assert.equal(lost[0]!.loss.kind, "fenced-out");
  assert.equal(lost[0]!.loss.current, thiefFence, "the refusal names the thief's fence");
  assert.deepEqual(
    events.filter((e) => e.type === "finished").map((e) => (e as { run: { runId: string } }).run.runId).sort(),
    [ids[0], ids[2]],
  );
  for (const id of [ids[0]!, ids[2]!]) assert.equal((await operator.lifecycle(runIn(project, id))).status, "completed", id);
  const life = await operator.lifecycle(runIn(project, victim));
  assert.notEqual(life.status, "completed", "the refused finish left the victim unfinished");
  const lease = await operator.lease(runIn(project, victim));
  assert.equal(lease?.holder, "thief");
  assert.equal(lease?.fence, thiefFence);
});

test("a renewal while a finish waits in its group: the group sends the keeper's current fence", async () => {
  const project = "gc-renew";
  const ids = await enqueue(project, 2);
  const { client, sent } = countedClient();
  const returnedAt = new Map<string, number>();
  const claimedFence = new Map<string, number>();
  const renewedWhileWaiting: string[] = [];
  const report = await within(
    20_000,
    runWorker({
      client,
      // Renewed every 400 ms; the two finishes wait 1.5 s for a third that never comes.
      ttlMs: 1200,
      mode: "until-idle",
      concurrency: 3,
      commitBatch: 3,
      commitLingerMs: 1500,
      filter: { project },
      onEvent: (e) => {
        if (e.type === "claimed") claimedFence.set(e.run.runId, e.fence);
        if (e.type === "renewed" && returnedAt.has(e.run.runId)) renewedWhileWaiting.push(e.run.runId);
      },
      handler: (ctx) => {
        returnedAt.set(ctx.run.runId, performance.now());
        return { finish: resultOf(ctx.run.runId) };
      },
    }),
    "the worker",
  );
  for (const id of ids) assert.ok(renewedWhileWaiting.includes(id), `${id} was renewed while it waited: ${renewedWhileWaiting.join(", ")}`);
  assert.deepEqual(sent.groups, [2], "one group, sent when the linger ran out");
  assert.equal(report.lost, 0);
  assert.equal(report.finished, 2);
  for (const id of ids) {
    const life = await operator.lifecycle(runIn(project, id));
    assert.equal(life.status, "completed", id);
    assert.ok((life.finishedFence ?? 0) > claimedFence.get(id)!, `${id} finished under a renewed fence (${life.finishedFence}), not its claim's (${claimedFence.get(id)})`);
  }
});

test("a renewal due while the group's request is in flight waits for its answer: the fences sent are never retired underneath", async () => {
  const project = "gc-inflight";
  const ids = await enqueue(project, 2);
  // The group's request is held 700 ms before it is sent; renewals fall due every 400 ms.
  const { client, sent } = countedClient(async (send) => {
    await new Promise((r) => setTimeout(r, 700));
    return send();
  });
  const renewed: string[] = [];
  const all = barrier(2);
  const report = await within(
    20_000,
    runWorker({
      client,
      ttlMs: 1200,
      mode: "until-idle",
      concurrency: 2,
      commitBatch: 2,
      commitLingerMs: 5_000,
      filter: { project },
      onEvent: (e) => {
        if (e.type === "renewed") renewed.push(e.run.runId);
      },
      handler: async (ctx) => {
        await all();
        return { finish: resultOf(ctx.run.runId) };
      },
    }),
    "the worker",
  );
  assert.deepEqual(sent.groups, [2]);
  assert.equal(report.lost, 0);
  assert.equal(report.finished, 2);
  assert.deepEqual(renewed, [], "the renewals waited for the group, then found the holdings ended");
  for (const id of ids) assert.equal((await operator.lifecycle(runIn(project, id))).status, "completed", id);
});

test("a group commit whose answer is lost reports none of its runs finished, as a single finish's lost answer", async () => {
  const project = "gc-lost";
  const ids = await enqueue(project, 2);
  // The request reaches the server (the steps commit), its answer is dropped.
  const { client, sent } = countedClient(async (send) => {
    await send();
    throw new TypeError("fetch failed: the connection dropped");
  });
  const errors: unknown[] = [];
  const all = barrier(2);
  const report = await within(
    20_000,
    runWorker({
      client,
      ttlMs: 30_000,
      mode: "until-idle",
      concurrency: 2,
      commitBatch: 2,
      commitLingerMs: 5_000,
      filter: { project },
      onEvent: (e) => {
        if (e.type === "error") errors.push(e.error);
        assert.notEqual(e.type, "finished", "no run is reported finished");
      },
      handler: async (ctx) => {
        await all();
        return { finish: resultOf(ctx.run.runId) };
      },
    }),
    "the worker",
  );
  assert.deepEqual(sent.groups, [2]);
  assert.equal(report.finished, 0);
  assert.equal(report.lost, 0);
  assert.equal(errors.length, 2, "one error per run of the group");
  for (const e of errors) assert.equal((e as { outcomeUnknown?: unknown }).outcomeUnknown, true, String(e));
  // What the store did is what it did: here the steps landed.
  for (const id of ids) assert.equal((await operator.lifecycle(runIn(project, id))).status, "completed", id);
});

test("commitBatch 1 (the default) sends no group request: each finish goes alone, or hands over", async () => {
  for (const [project, options] of [
    ["gc-off-default", {}],
    ["gc-off-one", { commitBatch: 1, handover: false }],
  ] as const) {
    await enqueue(project, 4);
    const { client, sent } = countedClient();
    const report = await within(
      20_000,
      runWorker({
        client,
        ttlMs: 30_000,
        mode: "until-idle",
        concurrency: 2,
        filter: { project },
        ...options,
        handler: (ctx) => ({ finish: resultOf(ctx.run.runId) }),
      }),
      "the worker",
    );
    assert.equal(report.finished, 4, project);
    assert.deepEqual(sent.groups, [], `${project}: no group request`);
    if ("handover" in options) assert.equal(sent.finishes, 4, `${project}: four finishes`);
    else assert.equal(sent.handOvers, 4, `${project}: four hand-overs`);
  }
});

test("bad commitBatch and commitLingerMs are refused, naming the option and its range", async () => {
  const base = { client: operator, ttlMs: 30_000, mode: "until-idle" as const, handler: () => undefined };
  for (const commitBatch of [0, 257, 1.5, Number.NaN, -1]) {
    await assert.rejects(runWorker({ ...base, commitBatch }), (e: unknown) => {
      assert.ok(e instanceof TypeError);
      assert.match(e.message, /^commitBatch .* must be a whole number from 1 to 256/);
      return true;
    });
  }
  for (const commitLingerMs of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
    await assert.rejects(runWorker({ ...base, commitBatch: 4, commitLingerMs }), (e: unknown) => {
      assert.ok(e instanceof TypeError);
      assert.match(e.message, /^commitLingerMs .* must be a finite number of ms, 0 or more/);
      return true;
    });
  }
  // The limits themselves are taken (an empty project: the worker finds nothing and ends).
  for (const commitBatch of [1, 256]) {
    const report = await runWorker({ ...base, client: serve.client("worker"), commitBatch, commitLingerMs: 0, filter: { project: "gc-none" } });
    assert.equal(report.claimed, 0);
  }
});

test("a stopping worker sends the finishes waiting in its group at once, none dropped", async () => {
  const project = "gc-stop";
  const ids = await enqueue(project, 3);
  const { client, sent } = countedClient();
  const stop = new AbortController();
  let returned = 0;
  let allReturned!: () => void;
  const three = new Promise<void>((r) => (allReturned = r));
  const running = runWorker({
    client,
    ttlMs: 30_000,
    mode: "continuous",
    waitMs: 1000,
    concurrency: 4,
    commitBatch: 4,
    // Far longer than the test: only the stop sends the group.
    commitLingerMs: 60_000,
    filter: { project },
    signal: stop.signal,
    handler: (ctx) => {
      if (++returned === 3) allReturned();
      return { finish: resultOf(ctx.run.runId) };
    },
  });
  await within(10_000, three, "three handlers returned");
  await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(sent.groups, [], "the finishes wait in the group");
  for (const id of ids) assert.equal((await operator.lifecycle(runIn(project, id))).status, "active", `${id} not finished yet`);
  stop.abort(new Error("shutting down"));
  const report = await within(5_000, running, "the stopped worker");
  assert.equal(report.finished, 3);
  assert.equal(report.released, 0);
  assert.deepEqual(sent.groups, [3], "one group of three, sent at the stop");
  for (const id of ids) {
    const life = await operator.lifecycle(runIn(project, id));
    assert.equal(life.status, "completed", id);
    assert.deepEqual(life.result, { run: id });
  }
});

test("a finish that joins a group after the worker stopped is sent at once", async () => {
  const project = "gc-late";
  const [id] = await enqueue(project, 1);
  const { client, sent } = countedClient();
  const stop = new AbortController();
  let working!: () => void;
  const started = new Promise<void>((r) => (working = r));
  const running = runWorker({
    client,
    ttlMs: 30_000,
    mode: "continuous",
    waitMs: 1000,
    concurrency: 2,
    commitBatch: 2,
    commitLingerMs: 60_000,
    filter: { project },
    signal: stop.signal,
    handler: async (ctx) => {
      working();
      // Returns its result only once the worker stops (its signal aborts).
      await new Promise((r) => ctx.signal.addEventListener("abort", r, { once: true }));
      return { finish: resultOf(ctx.run.runId) };
    },
  });
  await within(10_000, started, "the handler started");
  stop.abort(new Error("shutting down"));
  const report = await within(5_000, running, "the stopped worker");
  assert.equal(report.finished, 1);
  assert.deepEqual({ groups: sent.groups, steps: sent.steps }, { groups: [], steps: 1 }, "a group of one goes as a single step");
  assert.deepEqual((await operator.lifecycle(runIn(project, id!))).result, { run: id });
});
