// One measurement of a peer job queue for `runkeep-bench --peers`:
// enqueue N jobs (not timed), then W workers take and complete them. The
// clock starts when the database first shows a job done (so the library's
// start-up is not counted, as runkeep's own drain counts none) and stops
// when it shows every job done; the jobs counted are those left at the
// start. Prints one JSON line: {"jobs":n,"secs":S}.
//
//   node peer.mjs --lib graphile-worker|pg-boss --mode default|batched \
//     --workers W --jobs N --schema SCHEMA   (PostgreSQL URL in BENCH_PG_URL)
//
// `runkeep-bench` copies this file next to the node_modules it installs
// under target/ (from crates/runkeep-bench/peers/package.json and its lockfile) and runs it
// there; each library gets a schema of its own, dropped by runkeep-bench.

import pg from "pg";

function args() {
  const out = {};
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i += 2) {
    out[a[i].replace(/^--/, "")] = a[i + 1];
  }
  for (const k of ["lib", "mode", "workers", "jobs", "schema"]) {
    if (!out[k]) throw new Error(`missing --${k}`);
  }
  out.workers = Number(out.workers);
  out.jobs = Number(out.jobs);
  return out;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls `sql` (the number of jobs not yet done) every 5 ms on a connection
 * of its own: from the first answer below `total` to the answer 0, returns
 * the jobs done in between and the seconds it took.
 */
async function measure(client, sql, params, total) {
  const count = async () => Number((await client.query(sql, params)).rows[0].n);
  let left = await count();
  while (left >= total) {
    await sleep(5);
    left = await count();
  }
  const started = process.hrtime.bigint();
  const jobs = left;
  while (left > 0) {
    await sleep(5);
    left = await count();
  }
  return { jobs, secs: Number(process.hrtime.bigint() - started) / 1e9 };
}

async function graphile(o, url, probe) {
  const { run, makeWorkerUtils } = await import("graphile-worker");
  const quiet = new (await import("graphile-worker")).Logger(() => () => {});
  const utils = await makeWorkerUtils({
    connectionString: url,
    schema: o.schema,
    logger: quiet,
  });
  await utils.migrate();
  await utils.addJobs(
    Array.from({ length: o.jobs }, (_, i) => ({ identifier: "bench", payload: { i } })),
  );
  await utils.release();
  // default: every option at its default but the concurrency.
  // batched: the documented batching (localQueue + batched completion).
  const worker = { connectionString: url, schema: o.schema, concurrentJobs: o.workers };
  if (o.mode === "batched") {
    worker.localQueue = { size: Math.max(o.workers * 4, 64) };
    worker.completeJobBatchDelay = 0;
  }
  const runner = await run({
    preset: { worker },
    logger: quiet,
    noHandleSignals: true,
    taskList: { bench: async () => {} },
  });
  const m = await measure(
    probe,
    `SELECT count(*) AS n FROM "${o.schema}"._private_jobs`,
    [],
    o.jobs,
  );
  await runner.stop();
  return m;
}

async function pgboss(o, url, probe) {
  const { default: PgBoss } = await import("pg-boss");
  const boss = new PgBoss({ connectionString: url, schema: o.schema });
  boss.on("error", (e) => console.error(String(e)));
  await boss.start();
  const queue = "bench";
  await boss.createQueue(queue);
  const batch = 1000;
  for (let i = 0; i < o.jobs; i += batch) {
    const n = Math.min(batch, o.jobs - i);
    await boss.insert(Array.from({ length: n }, (_, k) => ({ name: queue, data: { i: i + k } })));
  }
  // default: one work() loop per worker, every option at its default
  // (batchSize 1, pollingIntervalSeconds 2). batched: batchSize 100 and
  // the shortest polling interval pg-boss accepts (0.5 s).
  const options = o.mode === "batched" ? { batchSize: 100, pollingIntervalSeconds: 0.5 } : {};
  const done = measure(
    probe,
    `SELECT count(*) AS n FROM "${o.schema}".job WHERE name = $1 AND state <> 'completed'`,
    [queue],
    o.jobs,
  );
  for (let w = 0; w < o.workers; w++) {
    await boss.work(queue, options, async () => {});
  }
  const m = await done;
  await boss.stop({ graceful: false, wait: true, timeout: 2000 });
  return m;
}

async function main() {
  const o = args();
  const url = process.env.BENCH_PG_URL;
  if (!url) throw new Error("BENCH_PG_URL is not set");
  const probe = new pg.Client({ connectionString: url });
  await probe.connect();
  let m;
  if (o.lib === "graphile-worker") m = await graphile(o, url, probe);
  else if (o.lib === "pg-boss") m = await pgboss(o, url, probe);
  else throw new Error(`unknown --lib ${o.lib}`);
  await probe.end();
  process.stdout.write(JSON.stringify(m) + "\n");
  process.exit(0);
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
