/**
 * Write ownership, opt-in: a saver bound to a runkeep lease refuses a
 * superseded owner's writes with a typed error (StaleWriteOwnerError, 409
 * `fenced-out` from the server), nothing of them lands, and the chain read
 * back holds exactly the legitimate checkpoints with the new owner's as the
 * latest: 0 forks. The meta-test plays the same writes without ownership
 * and sees the fork. Then the adoption path: a `runWorker` handler's
 * context is the renewing lease a graph runs under.
 */

import { runWorker, RunkeepError } from "@runkeep/client";
import { emptyCheckpoint, type CheckpointMetadata } from "@langchain/langgraph-checkpoint";
import { describe, expect, it } from "vitest";

import { RunkeepSaver, StaleWriteOwnerError, ThreadFinishedError, ThreadHeldError } from "../src/index.js";
import { client, freshSession, saver } from "./context.js";
import { approvalGraph } from "./graph.js";

const meta = (step: number): CheckpointMetadata => ({ source: "loop", step, parents: {} });
const cp = (id: string) => ({ ...emptyCheckpoint(), id });

/** Ids of the thread's root checkpoints, newest first, and how many children each parent has. */
async function chain(s: RunkeepSaver, thread: string): Promise<{ ids: string[]; latest: string | undefined; forks: number }> {
  const ids: string[] = [];
  const children = new Map<string, number>();
  for await (const t of s.list({ configurable: { thread_id: thread, checkpoint_ns: "" } })) {
    ids.push(t.checkpoint.id);
    const p = t.parentConfig?.configurable?.["checkpoint_id"] as string | undefined;
    if (p) children.set(p, (children.get(p) ?? 0) + 1);
  }
  const latest = (await s.getTuple({ configurable: { thread_id: thread } }))?.checkpoint.id;
  return { ids, latest, forks: [...children.values()].filter((n) => n > 1).length };
}

/**
 * Owner A writes c1 and a write on it; A's holding ends (an operator
 * releases it: what a lapsed lease looks like to the store); B claims and
 * writes c2 after c1; then the stale A writes its own child of c1, c3
 * (whose greater id would make it the latest), and a `__resume__` on c1.
 * Answers what was refused.
 */
async function choreography(a: RunkeepSaver, b: () => Promise<RunkeepSaver>, thread: string): Promise<unknown[]> {
  const c1 = await a.put({ configurable: { thread_id: thread } }, cp("0001"), meta(0), {});
  await a.putWrites(c1, [["x", 1]], "task-a");
  await client("operator").release(a.runRef(thread));
  const owner = await b();
  await owner.put(c1, cp("0002"), meta(1), {});
  const refused: unknown[] = [];
  for (const stale of [() => a.put(c1, cp("0003"), meta(1), {}), () => a.putWrites(c1, [["__resume__", "no"]], "task-a")]) {
    try {
      await stale();
    } catch (e) {
      refused.push(e);
    }
  }
  return refused;
}

function expectStale(e: unknown, thread: string): void {
  expect(e).toBeInstanceOf(StaleWriteOwnerError);
  expect(e).toBeInstanceOf(RunkeepError);
  const s = e as StaleWriteOwnerError;
  expect(s.isStaleWriteOwnerError).toBe(true);
  expect(s.slug).toBe("fenced-out");
  expect(s.threadId).toBe(thread);
  expect(s.current).toBeGreaterThan(s.presented);
}

describe("write ownership", () => {
  it("refuses a superseded owner's put, putWrites and deleteThread with StaleWriteOwnerError: 0 forks", async () => {
    const base = saver();
    const thread = "owned-thread";
    const a = await base.claimWriteOwnership(thread, { holder: "owner-a" });
    const refused = await choreography(a, () => base.claimWriteOwnership(thread, { holder: "owner-b" }), thread);

    expect(refused).toHaveLength(2);
    for (const e of refused) expectStale(e, thread);
    await a.deleteThread(thread).then(
      () => expect.unreachable("a stale delete was accepted"),
      (e: unknown) => expectStale(e, thread),
    );
    const reader = new RunkeepSaver({ client: client("reader"), project: base.project, session: base.session });
    expect(await chain(reader, thread)).toEqual({ ids: ["0002", "0001"], latest: "0002", forks: 0 });
    const c1 = await reader.getTuple({ configurable: { thread_id: thread, checkpoint_id: "0001" } });
    expect(c1?.pendingWrites, "the stale __resume__ did not land").toEqual([["task-a", "x", 1]]);
    // An owned saver writes only its own thread.
    await expect(a.put({ configurable: { thread_id: "another" } }, cp("0001"), meta(0), {})).rejects.toThrow(/owns thread/);
  });

  it("meta-test: the same writes without ownership fork the chain, the stale branch latest", async () => {
    const base = saver();
    const thread = "unowned-thread";
    expect(await choreography(base, async () => base, thread)).toEqual([]);
    expect(await chain(base, thread)).toEqual({ ids: ["0003", "0002", "0001"], latest: "0003", forks: 1 });
    const c1 = await base.getTuple({ configurable: { thread_id: thread, checkpoint_id: "0001" } });
    expect(c1?.pendingWrites, "the stale __resume__ landed").toEqual([
      ["task-a", "__resume__", "no"],
      ["task-a", "x", 1],
    ]);
  });

  it("adoption: a runWorker handler's context is the renewing lease the graph writes under", async () => {
    const session = freshSession("w");
    const worker = client("worker");
    const base = new RunkeepSaver({ client: worker, project: "langgraph-js", session });
    const thread = "worker-thread";
    await worker.enqueue(base.runRef(thread), { checkpoint: { id: "cp_input", createdAt: Date.now(), state: { thread } } });
    let fence = 0;
    const stop = new AbortController();
    const report = await runWorker({
      client: worker,
      ttlMs: 30_000,
      waitMs: 1000,
      signal: stop.signal,
      filter: { project: "langgraph-js", session },
      handler: async (ctx) => {
        fence = ctx.fence;
        try {
          const graph = approvalGraph().compile({ checkpointer: base.owned(thread, ctx) });
          await graph.invoke({ log: [] }, { configurable: { thread_id: thread }, durability: "sync", signal: ctx.signal });
        } finally {
          stop.abort(); // one run is the test: take no other (nor retry a failed one)
        }
        return { release: true }; // it waits on its park; whoever claims it next resumes it
      },
    });
    expect(report).toMatchObject({ claimed: 1, released: 1, failed: 0, lost: 0 });
    const checkpoints = await worker.listThreadCheckpoints(base.runRef(thread));
    expect(checkpoints.length).toBeGreaterThan(0);
    for (const c of checkpoints) expect(c.fence, "every checkpoint written under the worker's fence").toBe(fence);
    expect(await worker.findPending(base.runRef(thread)), "the interrupt parked the run").not.toBeNull();
  });
});

describe("claimWriteOwnership", () => {
  it("tells a thread held live by another owner from a thread whose run is finished", async () => {
    const s = saver();
    const thread = "claims-1";
    const run = s.runRef(thread);
    await client().enqueue(run, { checkpoint: { id: "cp_input", createdAt: Date.now(), state: { thread } } });
    const a = await s.claimWriteOwnership(thread, { holder: "owner-a" });
    expect(a.ownershipFence).toBeTypeOf("number");

    const held = await s.claimWriteOwnership(thread, { holder: "owner-b" }).catch((e: unknown) => e);
    expect(held).toBeInstanceOf(ThreadHeldError);
    expect(held).toMatchObject({ outcome: "held", threadId: thread, fence: a.ownershipFence });
    expect((held as ThreadHeldError).holder).toContain("owner-a");

    await client().finish(run, a.ownershipFence!, { status: "completed" });
    const finished = await s.claimWriteOwnership(thread, { holder: "owner-b" }).catch((e: unknown) => e);
    expect(finished).toBeInstanceOf(ThreadFinishedError);
    expect(finished).not.toBeInstanceOf(ThreadHeldError);
    expect(finished).toMatchObject({ outcome: "finished", runStatus: "completed" });
    expect(String((finished as Error).message)).toContain("reopen");
  });
});
