/**
 * A small drain: 60 runs enqueued, 4 TypeScript worker processes (each two
 * runs at a time) drain them in parallel through one `runkeep serve`. Every
 * run must be finished exactly once, counted from the store (lifecycle and
 * transcript), not from the workers' own claims.
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
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  await serve?.close();
});

interface ChildAnswer {
  report: WorkerReport;
  finished: string[];
}

test(`${WORKERS} worker processes drain ${RUNS} runs, each finished exactly once`, async () => {
  const ids = Array.from({ length: RUNS }, (_, i) => `drain-${String(i).padStart(3, "0")}`);
  for (const id of ids) await operator.enqueue(serve.run(id), { checkpoint: firstCheckpoint(id) });

  const script = fileURLToPath(new URL("./fixtures/drain-worker.js", import.meta.url));
  const ready: Promise<void>[] = [];
  const answers: Promise<ChildAnswer>[] = [];
  for (let i = 0; i < WORKERS; i++) {
    const child = fork(script, [], {
      env: { ...process.env, RUNKEEP_URL: serve.url, RUNKEEP_TOKEN: serve.token("worker"), RUNKEEP_HOLDER: `drainer-${i}` },
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    children.push(child);
    ready.push(new Promise((r) => child.once("message", () => r())));
    answers.push(
      new Promise((resolve, reject) => {
        let answer: ChildAnswer | undefined;
        child.on("message", (m) => {
          if (typeof m === "object" && m !== null && "report" in m) answer = m as ChildAnswer;
        });
        child.once("exit", (code) => (code === 0 && answer ? resolve(answer) : reject(new Error(`worker ${i} exited ${code}`))));
      }),
    );
  }
  // Start together, so the processes really drain in parallel.
  await within(20_000, Promise.all(ready), "the workers starting");
  for (const c of children) c.send("go");
  const results = await within(40_000, Promise.all(answers), "the drain");

  // From the store: every run completed, its transcript holding exactly one `done`.
  const finishedBy = new Map<string, string>();
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
  }
  const page = await operator.listRuns({ status: ["active"] });
  assert.equal(page.entries.length, 0, "no run left active");
  const done = await operator.listRuns({ status: ["completed"], limit: 1000 });
  assert.equal(done.entries.length, RUNS);

  // The workers' own accounts agree with the store's.
  const claimedByWorkers = results.flatMap((r) => r.finished);
  assert.equal(claimedByWorkers.length, RUNS, "the workers' finishes sum to the runs: none twice");
  assert.deepEqual([...new Set(claimedByWorkers)].sort(), ids);
  for (const [i, r] of results.entries()) {
    for (const id of r.finished) assert.equal(finishedBy.get(id), `drainer-${i}`);
  }
  const perWorker = results.map((r) => r.report.finished);
  const holders = new Set(finishedBy.values());
  console.log(
    `drain: ${RUNS} runs, ${WORKERS} processes; finished per worker ${JSON.stringify(perWorker)}; ` +
      `store: ${RUNS} completed, ${RUNS} with exactly one done event; lost ${results.reduce((a, r) => a + r.report.lost, 0)}`,
  );
  assert.ok(holders.size >= 2, `the drain ran in parallel (${holders.size} workers finished runs)`);
});
