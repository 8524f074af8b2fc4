// The TypeScript client as a user gets it: installed from its tarball into a
// fresh project (clients/typescript/scripts/pack-check.sh copies this file
// there), importing `@runkeep/client` by name, against a live
// `runkeep serve`: enqueue two runs, work them with `runWorker` (the README's
// worker: resume point, one atomic step, finish) until idle, and read the
// outcomes back. Exits non-zero on any difference.
import assert from "node:assert/strict";
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";

import { RunkeepClient, runWorker, FencedOut } from "@runkeep/client";

const here = dirname(fileURLToPath(import.meta.url));
// Resolved from this project's node_modules: the installed tarball, not a link to the sources.
const installed = fileURLToPath(import.meta.resolve("@runkeep/client"));
assert.ok(installed.startsWith(`${here}/node_modules/`), `@runkeep/client resolved outside the project: ${installed}`);

const { serve } = await import(process.env.RUNKEEP_PACK_SERVE);
const server = await serve();
try {
  const client = new RunkeepClient({ baseUrl: server.url, token: server.tokens.worker, tenant: server.tenant });
  const runs = ["a", "b"].map((id) => ({ projectId: "pack", sessionId: "smoke", runId: `run_${id}` }));
  for (const run of runs) {
    await client.enqueue(run, { checkpoint: { id: "cp_input", createdAt: Date.now(), state: { n: run.runId.length } } });
  }
  const report = await runWorker({
    client,
    ttlMs: 10_000,
    mode: "until-idle",
    filter: { project: "pack", session: "smoke" },
    handler: async (ctx) => {
      const resume = await ctx.resumePoint();
      const answer = Number(resume?.state?.n) * 2;
      await ctx.step({
        events: [{ type: "answer", payload: { answer } }],
        checkpoint: { id: "cp_answer", createdAt: Date.now(), state: { answer } },
      });
      return { finish: { status: "completed", result: { answer } } };
    },
  });
  assert.equal(report.claimed, 2, JSON.stringify(report));
  assert.equal(report.finished, 2, JSON.stringify(report));
  assert.equal(report.failed, 0, JSON.stringify(report));
  for (const run of runs) {
    const s = await client.summary(run);
    assert.equal(s.lifecycle.status, "completed", JSON.stringify(s.lifecycle));
    assert.deepEqual(s.latestCheckpoint?.state, { answer: 10 });
  }
  assert.equal(typeof FencedOut, "function");
  console.log(`@runkeep/client from ${installed}: runWorker claimed and finished ${report.finished} runs against ${server.url}`);
} finally {
  await server.close();
}
