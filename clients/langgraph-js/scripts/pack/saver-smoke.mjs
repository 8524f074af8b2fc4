// The LangGraph.js saver as a user gets it: `@runkeep/langgraph-checkpoint`
// and `@runkeep/client` installed from their tarballs into a fresh project
// beside `@langchain/langgraph` (clients/langgraph-js/scripts/pack-check.sh
// copies this file there), against a live `runkeep serve`. A three-node
// graph with an `interrupt()` runs under write ownership inside the
// client's `runWorker`, as the README shows: the first holding runs it to
// the interrupt and releases; an operator answers the park; a second worker,
// claiming only runs whose park is answered, resumes it with
// `Command({ resume })` and finishes the run when the graph ends.
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";

import { Annotation, Command, END, START, StateGraph, interrupt } from "@langchain/langgraph";
import { RunkeepClient, runWorker } from "@runkeep/client";
import { RunkeepSaver } from "@runkeep/langgraph-checkpoint";

const here = fileURLToPath(new URL(".", import.meta.url));
for (const name of ["@runkeep/client", "@runkeep/langgraph-checkpoint"]) {
  const at = fileURLToPath(import.meta.resolve(name));
  assert.ok(at.startsWith(`${here}node_modules/${name}/`), `${name} resolved to ${at}, not this project's installed copy`);
}

const State = Annotation.Root({
  log: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
});
const builder = new StateGraph(State)
  .addNode("draft", () => ({ log: ["drafted"] }))
  .addNode("approve", (s) => ({ log: [`approval: ${String(interrupt({ question: "Ship it?", draft: s.log }))}`] }))
  .addNode("ship", (s) => ({ log: [s.log.includes("approval: yes") ? "shipped" : "not shipped"] }))
  .addEdge(START, "draft")
  .addEdge("draft", "approve")
  .addEdge("approve", "ship")
  .addEdge("ship", END);

const { serve } = await import(process.env.RUNKEEP_PACK_SERVE);
const server = await serve();
try {
  const client = new RunkeepClient({ baseUrl: server.url, token: server.tokens.worker, tenant: server.tenant });
  const operator = new RunkeepClient({ baseUrl: server.url, token: server.tokens.operator, tenant: server.tenant });
  const saver = new RunkeepSaver({ client, project: "pack", session: "threads" });
  const thread = "pack-thread-1";
  const run = saver.runRef(thread);
  await client.enqueue(run, { checkpoint: { id: "cp_input", createdAt: Date.now(), state: { thread } } });

  const outcomes = [];
  // One holding of a thread: run (or resume) its graph under write ownership;
  // release when it stops at an interrupt, finish (return) when it ends.
  const handler = (stop) => async (ctx) => {
    const t = String((await ctx.client.readCheckpoint(ctx.ref, "cp_input"))?.state?.thread);
    const graph = builder.compile({ checkpointer: saver.owned(t, ctx) });
    const config = { configurable: { thread_id: t }, durability: "sync", signal: ctx.signal };
    const answer = await saver.answeredInterrupt(t);
    const out = await graph.invoke(answer.answered ? new Command({ resume: answer.resume }) : { log: [] }, config);
    const state = await graph.getState(config);
    outcomes.push({ log: out.log, next: state.next });
    if (state.next.length > 0) {
      stop?.abort();
      return { release: true };
    }
    return { finish: { status: "completed", result: { log: out.log } } };
  };

  const first = new AbortController();
  const r1 = await runWorker({ client, ttlMs: 10_000, waitMs: 0, signal: first.signal, filter: { project: "pack", session: "threads" }, handler: handler(first) });
  assert.equal(r1.released, 1, JSON.stringify(r1));
  assert.deepEqual(outcomes[0], { log: ["drafted"], next: ["approve"] });

  const park = await operator.findPending(run);
  assert.equal(park?.pending?.request?.type, "langgraph-interrupt", JSON.stringify(park));
  assert.deepEqual(park.pending.request.interrupts.map((i) => i.value), [{ question: "Ship it?", draft: ["drafted"] }]);
  await operator.resolvePark(run, park.id, { action: "answer", decision: "yes" });

  const r2 = await runWorker({ client, ttlMs: 10_000, mode: "until-idle", filter: { project: "pack", session: "threads", park: ["resolved"] }, handler: handler() });
  assert.equal(r2.finished, 1, JSON.stringify(r2));
  assert.deepEqual(outcomes[1], { log: ["drafted", "approval: yes", "shipped"], next: [] });
  const summary = await client.summary(run);
  assert.equal(summary.lifecycle.status, "completed", JSON.stringify(summary.lifecycle));
  const steps = [];
  for await (const t of saver.list({ configurable: { thread_id: thread } })) steps.push(t.metadata?.step);
  assert.deepEqual(steps, [3, 2, 1, 0, -1]);
  console.log(`@runkeep/langgraph-checkpoint + @runkeep/client from their tarballs: the graph parked, was answered, resumed by a second worker and finished (${server.url})`);
} finally {
  await server.close();
}
