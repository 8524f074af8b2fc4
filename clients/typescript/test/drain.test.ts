/**
 * Small drains: 60 runs, 4 TypeScript worker processes (each two runs at a
 * time) draining them in parallel through one `runkeep serve`. Every run
 * must be finished exactly once, counted from the store (lifecycle and
 * transcript), not from the workers' own claims — also when one worker
 * process is SIGKILLed while it holds runs.
 */

import assert from "node:assert/strict";
import { fork, type ChildProcess } from "node:child_process";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import type { RunkeepClient, WorkerReport } from "../src/index.js";
import { firstCheckpoint, Serve, within } from "./helpers/serve.js";

const RUNS = 60;
const WORKERS = 4;

let serve: Serve;
let operator: RunkeepClient;
const children: ChildProcess[] = [];

before(async () => {
  serve = await Serve.start();
  operator = serve.client("operator");
});

after(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  await serve?.close();
});

interface ChildAnswer {
  report: WorkerReport;
  finished: string[];
}

interface Worker {
  child: ChildProcess;
  ready: Promise<void>;
  answer: Promise<ChildAnswer>;
  claimed: string[];
  onStall?: (runId: string) => void;
}

function startWorker(holder: string, env: Record<string, string>): Worker {
  const script = fileURLToPath(new URL("./fixtures/drain-worker.js", import.meta.url));
  const child = fork(script, [], {
    env: { ...process.env, RUNKEEP_URL: serve.url, RUNKEEP_TOKEN: serve.token("worker"), RUNKEEP_HOLDER: holder, ...env },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  children.push(child);
  const w: Worker = { child, claimed: [], ready: undefined as never, answer: undefined as never };
  w.ready = new Promise((r) => child.once("message", () => r()));
  w.answer = new Promise((resolve, reject) => {
    let answer: ChildAnswer | undefined;
    child.on("message", (m) => {
      if (typeof m !== "object" || m === null) return;
      if ("report" in m) answer = m as ChildAnswer;
      if ("claimed" in m) {
        const id = String((m as { claimed: unknown }).claimed);
        w.claimed.push(id);
      }
      if ("stalled" in m) w.onStall?.(String((m as { stalled: unknown }).stalled));
    });
    child.once("exit", (code, signal) =>
      code === 0 && answer ? resolve(answer) : reject(new Error(`worker ${holder} exited ${code ?? signal}`)),
    );
  });
  return w;
}

async function enqueue(prefix: string): Promise<string[]> {
  const ids = Array.from({ length: RUNS }, (_, i) => `${prefix}-${String(i).padStart(3, "0")}`);
  for (const id of ids) await operator.enqueue(serve.run(id), { checkpoint: firstCheckpoint(id) });
  return ids;
}

/** From the store: every run completed, exactly one `done` in its transcript; answers run → finishing holder. */
async function audit(ids: string[]): Promise<{ finishedBy: Map<string, string>; attempts: Map<string, number> }> {
  const finishedBy = new Map<string, string>();
  const attempts = new Map<string, number>();
  for (const id of ids) {
    const run = serve.run(id);
    const life = await operator.lifecycle(run);
    assert.equal(life.status, "completed", `${id} completed`);
    const events = (await operator.readEvents(run, { integrity: "strict" })).events;
    const done = events.filter((e) => e.type === "done");
    assert.equal(done.length, 1, `${id}: exactly one finishing step landed`);
    const holder = String(done[0]!.payload["holder"]);
    assert.deepEqual(life.result, { holder }, `${id}: finished by the holder whose step landed`);
    assert.equal(done[0]!.generation, life.finishedFence, `${id}: the finish spent the fence of that step`);
    finishedBy.set(id, holder);
    attempts.set(id, life.attempts);
  }
  return { finishedBy, attempts };
}

test(`${WORKERS} worker processes drain ${RUNS} runs, each finished exactly once`, async () => {
  const ids = await enqueue("drain");
  const workers = Array.from({ length: WORKERS }, (_, i) => startWorker(`drainer-${i}`, { RUNKEEP_MODE: "until-idle" }));
  // Start together, so the processes really drain in parallel.
  await within(20_000, Promise.all(workers.map((w) => w.ready)), "the workers starting");
  for (const w of workers) w.child.send("go");
  const results = await within(40_000, Promise.all(workers.map((w) => w.answer)), "the drain");

  const { finishedBy } = await audit(ids);
  assert.equal((await operator.listRuns({ status: ["active"] })).entries.length, 0, "no run left active");

  // The workers' own accounts agree with the store's.
  const byWorkers = results.flatMap((r) => r.finished);
  assert.equal(byWorkers.length, RUNS, "the workers' finishes sum to the runs: none twice");
  assert.deepEqual([...new Set(byWorkers)].sort(), ids);
  for (const [i, r] of results.entries()) for (const id of r.finished) assert.equal(finishedBy.get(id), `drainer-${i}`);
  const perWorker = results.map((r) => r.report.finished);
  const handedOver = results.reduce((a, r) => a + r.report.handedOver, 0);
  console.log(
    `drain: ${RUNS} runs, ${WORKERS} processes; finished per worker ${JSON.stringify(perWorker)}; ` +
      `store: ${finishedBy.size} completed, each with exactly one done event; lost ${results.reduce((a, r) => a + r.report.lost, 0)}; ` +
      `handed over ${handedOver}`,
  );
  assert.ok(new Set(finishedBy.values()).size >= 2, "the drain ran in parallel");
  assert.ok(handedOver > 0, "the finishing steps handed over to the next runs");
});

test(`a worker process SIGKILLed while holding runs: the others take them over, each run still finished once`, async () => {
  const ids = await enqueue("crash");
  const env = { RUNKEEP_MODE: "continuous", RUNKEEP_TTL_MS: "1500" };
  const workers = Array.from({ length: WORKERS }, (_, i) =>
    startWorker(`crasher-${i}`, i === 0 ? { ...env, RUNKEEP_STALL_AT: "3" } : env),
  );
  const victim = workers[0]!;
  let heldAtKill: string[] = [];
  let stalled = "";
  const killed = new Promise<void>((resolve) => {
    // The handler of the victim's third run stalls after its first step: killed then, it holds that run unfinished.
    victim.onStall = (runId) => {
      stalled = runId;
      heldAtKill = [...victim.claimed];
      victim.child.kill("SIGKILL");
      resolve();
    };
  });
  await within(20_000, Promise.all(workers.map((w) => w.ready)), "the workers starting");
  for (const w of workers) w.child.send("go");
  await within(20_000, killed, "the victim's stalled third run");
  await assert.rejects(victim.answer, /exited SIGKILL/);

  // Wait (bounded) until the store shows every run finished, then stop the survivors.
  await within(
    40_000,
    (async () => {
      for (;;) {
        const page = await operator.listRuns({ status: ["completed"], limit: 1000 });
        if (page.entries.filter((r) => r.run.runId.startsWith("crash-")).length === RUNS) return;
        await new Promise((r) => setTimeout(r, 100));
      }
    })(),
    "every run finished",
  );
  for (const w of workers.slice(1)) w.child.send("stop");
  const results = await within(20_000, Promise.all(workers.slice(1).map((w) => w.answer)), "the survivors stopping");

  const { finishedBy, attempts } = await audit(ids);
  const victimFinished = [...finishedBy].filter(([, h]) => h === "crasher-0").map(([id]) => id);
  const takenOver = heldAtKill.filter((id) => finishedBy.get(id) !== "crasher-0");
  assert.ok(takenOver.includes(stalled), `the run the victim stalled on (${stalled}) was finished by another worker`);
  const stalledEvents = (await operator.readEvents(serve.run(stalled))).events;
  assert.deepEqual(
    stalledEvents.map((e) => [e.type, e.payload["holder"]]),
    [
      ["work", "crasher-0"],
      ["work", finishedBy.get(stalled)],
      ["done", finishedBy.get(stalled)],
    ],
    "the dead holder's first step stayed, the new holder redid the work and finished it",
  );
  for (const id of takenOver) assert.equal(attempts.get(id), 1, `${id}: one takeover from the dead holder's expired lease`);
  const survivors = results.flatMap((r) => r.finished);
  assert.equal(survivors.length + victimFinished.length, RUNS, "finishes (survivors' + the victim's before it died) sum to the runs");
  console.log(
    `crash drain: ${RUNS} runs, ${WORKERS} processes, one SIGKILLed stalled in ${stalled} (it had claimed ${JSON.stringify(heldAtKill)}); ` +
      `finished by the victim ${victimFinished.length}, by the survivors ${JSON.stringify(results.map((r) => r.report.finished))}; ` +
      `taken over after expiry ${takenOver.length} (attempts 1 each); store: ${finishedBy.size} completed, each with exactly one done event`,
  );
});
