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

import { InterruptAnswerError, type RunkeepSaver } from "../src/index.js";
import { client, saver } from "./context.js";
import { approvalGraph, asksTwiceGraph, twoReviewersGraph } from "./graph.js";

/** The park of the thread's latest root checkpoint, as the server keeps it. */
async function parkOf(s: RunkeepSaver, thread: string) {
  const body = await client("reader").getThreadCheckpoint(s.runRef(thread), { ns: "" });
  return body?.park ?? undefined;
}

/** The questions a pending park waits on (`interrupt({ q })` values). */
function questions(park: { pending?: { request?: unknown } | null } | null | undefined): string[] {
  const request = park?.pending?.request as { interrupts?: { value: { q: string } }[] } | undefined;
  return (request?.interrupts ?? []).map((i) => i.value.q);
}

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
    expect(answer).toMatchObject({ answered: true, resume: "yes", decision: "yes" });

    const done = await graph.invoke(new Command({ resume: answer.answered ? answer.resume : null }), config);
    expect(done.log).toEqual(["drafted", "approval: yes", "shipped"]);
    expect(await s.answeredInterrupt(thread), "resumed: the answer is spent").toEqual({ answered: false });
    const state = await graph.getState(config);
    expect(state.next).toEqual([]);
    const steps: unknown[] = [];
    for await (const t of s.list({ configurable: { thread_id: thread } })) steps.push(t.metadata?.step);
    expect(steps, "one chain, newest first: input, start, draft, (the interrupt writes none), approve, ship").toEqual([3, 2, 1, 0, -1]);
  });

  it("parks two interrupts of one step as one park with both ids; a map answer resumes both", async () => {
    const s = saver();
    const thread = "reviewers-1";
    const config = { configurable: { thread_id: thread }, durability: "sync" as const };
    const graph = twoReviewersGraph().compile({ checkpointer: s });

    const first = await graph.invoke({ log: [] }, config);
    const raised = (first as { __interrupt__?: { id: string; value: unknown }[] }).__interrupt__ ?? [];
    expect(raised.map((i) => i.value)).toEqual([{ reviewer: "legal" }, { reviewer: "security" }]);
    const run = s.runRef(thread);
    const park = await client("reader").findPending(run);
    const request = park?.pending?.request as unknown as { interrupts: { id: string; value: unknown; taskId: string }[]; taskId: string };
    expect(request.interrupts.map((i) => i.id).sort(), "one park, both interrupt ids").toEqual(raised.map((i) => i.id).sort());
    const state = await graph.getState(config);
    const taskOf = Object.fromEntries(state.tasks.flatMap((t) => (t.interrupts ?? []).map((i) => [i.id, t.id])));
    for (const i of request.interrupts) expect(i.taskId, "each interrupt names its own task").toBe(taskOf[i.id]);

    const [legal, security] = raised;
    await client("operator").resolvePark(run, park!.id, { action: "answer", decision: { [legal!.id]: "ok" } });
    await expect(s.answeredInterrupt(thread), "an answer without every id is refused, naming the ids").rejects.toThrow(new RegExp(`${legal!.id}.*${security!.id}|${security!.id}.*${legal!.id}`));
    await expect(s.answeredInterrupt(thread)).rejects.toBeInstanceOf(InterruptAnswerError);
    expect((await graph.getState(config)).next.sort(), "nothing resumed").toEqual(["legal", "security"]);
  });

  it("resumes two interrupts answered with a map of their ids", async () => {
    const s = saver();
    const thread = "reviewers-2";
    const config = { configurable: { thread_id: thread }, durability: "sync" as const };
    const graph = twoReviewersGraph().compile({ checkpointer: s });
    const first = await graph.invoke({ log: [] }, config);
    const raised = (first as { __interrupt__?: { id: string; value: { reviewer: string } }[] }).__interrupt__ ?? [];
    const run = s.runRef(thread);
    const park = await client("reader").findPending(run);
    const decision = Object.fromEntries(raised.map((i) => [i.id, `${i.value.reviewer} approves`]));
    await client("operator").resolvePark(run, park!.id, { action: "answer", decision });

    const answer = await s.answeredInterrupt(thread);
    expect(answer).toMatchObject({ answered: true, resume: decision });
    const done = await graph.invoke(new Command({ resume: answer.answered ? answer.resume : null }), config);
    expect([...done.log].sort()).toEqual(["legal: legal approves", "merged 2", "security: security approves"]);
    expect((await graph.getState(config)).next).toEqual([]);
    expect(await s.answeredInterrupt(thread)).toEqual({ answered: false });
  });

  it("closes the park when the graph is resumed in code with Command({ resume })", async () => {
    const s = saver();
    const thread = "approval-in-code";
    const config = { configurable: { thread_id: thread }, durability: "sync" as const };
    const graph = approvalGraph().compile({ checkpointer: s });
    await graph.invoke({ log: [] }, config);
    const before = await parkOf(s, thread);
    expect(before?.pending?.resolvedAt, "open while the interrupt waits").toBeUndefined();
    const interruptCheckpoint = (await s.getTuple({ configurable: { thread_id: thread } }))!.checkpoint.id;

    const done = await graph.invoke(new Command({ resume: "yes" }), config);
    expect(done.log).toEqual(["drafted", "approval: yes", "shipped"]);
    const after = await client("reader").getThreadCheckpoint(s.runRef(thread), { ns: "", checkpointId: interruptCheckpoint });
    expect(after?.park?.pending?.resolvedAt, "the resume in code closed the park").toBeTypeOf("number");
    expect(after?.park?.pending?.decision).toEqual("yes");
    expect(await client("reader").findPending(s.runRef(thread)), "no park outstanding any more").toBeNull();
  });

  it("closes the park of two interrupts resumed in code with a map", async () => {
    const s = saver();
    const thread = "reviewers-in-code";
    const config = { configurable: { thread_id: thread }, durability: "sync" as const };
    const graph = twoReviewersGraph().compile({ checkpointer: s });
    const first = await graph.invoke({ log: [] }, config);
    const raised = (first as { __interrupt__?: { id: string }[] }).__interrupt__ ?? [];
    const interruptCheckpoint = (await s.getTuple({ configurable: { thread_id: thread } }))!.checkpoint.id;
    const done = await graph.invoke(new Command({ resume: Object.fromEntries(raised.map((i) => [i.id, "fine"])) }), config);
    expect(done.log).toContain("merged 2");
    const after = await client("reader").getThreadCheckpoint(s.runRef(thread), { ns: "", checkpointId: interruptCheckpoint });
    expect(after?.park?.pending?.resolvedAt, "the resume in code closed the park").toBeTypeOf("number");
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

  it("a resume stored after the node's next question answers only the question it was made for", async () => {
    // LangGraph.js sends every putWrites at once: the null task's
    // `__resume__` of `Command({ resume })` and the resumed node's next
    // `__interrupt__` can reach the server in either order. Forced here to
    // the late one: the resume is held until the interrupt is stored.
    const s = saver();
    const thread = "asks-twice-late";
    const config = { configurable: { thread_id: thread }, durability: "sync" as const };
    const graph = asksTwiceGraph().compile({ checkpointer: s });
    await graph.invoke({ log: [] }, config);
    const run = s.runRef(thread);
    const reader = client("reader");
    const first = await reader.findPending(run);
    expect(questions(first)).toEqual(["first?"]);

    const inner = s.client.putThreadWrites.bind(s.client);
    const order: string[] = [];
    let interruptStored!: () => void;
    const stored = new Promise<void>((resolve) => (interruptStored = resolve));
    const NULL = "00000000-0000-0000-0000-000000000000";
    s.client.putThreadWrites = async (r, body, options) => {
      const channels = body.writes.map((w) => w.channel);
      const nullResume = body.taskId === NULL && channels.includes("__resume__");
      if (nullResume) await Promise.race([stored, new Promise((resolve) => setTimeout(resolve, 20_000))]);
      const done = await inner(r, body, options);
      order.push(nullResume ? "null-resume" : channels.includes("__interrupt__") ? "interrupt" : "other");
      if (channels.includes("__interrupt__")) interruptStored();
      return done;
    };
    try {
      await graph.invoke(new Command({ resume: "one" }), config);
    } finally {
      s.client.putThreadWrites = inner;
    }
    expect(order).toEqual(["interrupt", "null-resume"]);

    const second = await reader.findPending(run);
    expect(second, "the second question is still waiting").not.toBeNull();
    expect(second?.pending?.resolvedAt).toBeUndefined();
    expect(questions(second)).toEqual(["second?"]);
    expect(second?.id).toBe(first?.id);

    const done = await graph.invoke(new Command({ resume: "two" }), config);
    expect(done.log).toEqual(["first:one", "second:two"]);
    expect(await reader.findPending(run)).toBeNull();
  });
});
