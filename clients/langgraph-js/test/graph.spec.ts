/**
 * The saver under a real LangGraph.js graph: an `interrupt()` becomes a
 * runkeep park whose request the console shows; an operator's answer is
 * read back with `answeredInterrupt` and resumes the graph as
 * `Command({ resume })`. And a fork (two children of one checkpoint) keeps
 * each branch's own channel values.
 */

import { Command } from "@langchain/langgraph";
import { emptyCheckpoint } from "@langchain/langgraph-checkpoint";
import { describe, expect, it } from "vitest";

import { client, saver } from "./context.js";
import { approvalGraph } from "./graph.js";

describe("RunkeepSaver under a graph", () => {
  it("turns an interrupt into a park, and the park's answer resumes the graph", async () => {
    const s = saver();
    const thread = "approval-1";
    const config = { configurable: { thread_id: thread }, durability: "sync" as const };
    const graph = approvalGraph().compile({ checkpointer: s });

    const first = await graph.invoke({ log: [] }, config);
    expect(first.log).toEqual(["drafted"]);
    const run = s.runRef(thread);
    const park = await client("reader").findPending(run);
    expect(park?.pending?.request).toMatchObject({
      type: "langgraph-interrupt",
      thread,
      ns: "",
      interrupts: [{ value: { question: "Ship the draft?", draft: ["drafted"] } }],
    });
    expect(park?.pending?.resolvedAt).toBeUndefined();
    expect(await s.answeredInterrupt(thread)).toEqual({ answered: false });

    await client("operator").resolvePark(run, park!.id, { action: "answer", decision: "yes" });
    const answer = await s.answeredInterrupt(thread);
    expect(answer).toEqual({ answered: true, decision: "yes" });

    const done = await graph.invoke(new Command({ resume: answer.answered ? answer.decision : null }), config);
    expect(done.log).toEqual(["drafted", "approval: yes", "shipped"]);
    expect(await s.answeredInterrupt(thread), "resumed: the answer is spent").toEqual({ answered: false });
    const state = await graph.getState(config);
    expect(state.next).toEqual([]);
    const steps: unknown[] = [];
    for await (const t of s.list({ configurable: { thread_id: thread } })) steps.push(t.metadata?.step);
    expect(steps, "one chain, newest first: input, start, draft, (the interrupt writes none), approve, ship").toEqual([3, 2, 1, 0, -1]);
  });

  it("keeps each branch's values when a checkpoint has two children (versions never collide)", async () => {
    const s = saver();
    const thread = "fork-1";
    const base = { ...emptyCheckpoint(), id: "00000001" };
    const v1 = s.getNextVersion(undefined);
    base.channel_values = { x: "root" };
    base.channel_versions = { x: v1 };
    const c1 = await s.put({ configurable: { thread_id: thread } }, base, { source: "input", step: -1, parents: {} }, { x: v1 });
    const branch = async (id: string, value: string) => {
      const v = s.getNextVersion(v1);
      const cp = { ...emptyCheckpoint(), id, channel_values: { x: value }, channel_versions: { x: v } };
      return s.put(c1, cp, { source: "fork", step: 0, parents: {} }, { x: v });
    };
    const a = await branch("00000002", "branch a");
    const b = await branch("00000003", "branch b");
    expect((await s.getTuple(a))?.checkpoint.channel_values).toEqual({ x: "branch a" });
    expect((await s.getTuple(b))?.checkpoint.channel_values).toEqual({ x: "branch b" });
    expect((await s.getTuple(c1))?.checkpoint.channel_values).toEqual({ x: "root" });
  });
});
