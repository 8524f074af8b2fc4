/** A small graph with a human approval (no LLM), as in the Python example. */

import { Annotation, END, START, StateGraph, interrupt } from "@langchain/langgraph";

export const State = Annotation.Root({
  log: Annotation<string[]>({ reducer: (a, b) => a.concat(b), default: () => [] }),
});

export function approvalGraph() {
  return new StateGraph(State)
    .addNode("draft", () => ({ log: ["drafted"] }))
    .addNode("approve", (s: typeof State.State) => {
      const answer = interrupt({ question: "Ship the draft?", draft: s.log });
      return { log: [`approval: ${String(answer)}`] };
    })
    .addNode("ship", (s: typeof State.State) => ({ log: [s.log.includes("approval: yes") ? "shipped" : "not shipped"] }))
    .addEdge(START, "draft")
    .addEdge("draft", "approve")
    .addEdge("approve", "ship")
    .addEdge("ship", END);
}

/** Two reviewers in parallel, each interrupting in the same step: one park holds both interrupts. */
export function twoReviewersGraph() {
  return new StateGraph(State)
    .addNode("legal", () => ({ log: [`legal: ${String(interrupt({ reviewer: "legal" }))}`] }))
    .addNode("security", () => ({ log: [`security: ${String(interrupt({ reviewer: "security" }))}`] }))
    .addNode("merge", (s: typeof State.State) => ({ log: [`merged ${s.log.length}`] }))
    .addEdge(START, "legal")
    .addEdge(START, "security")
    .addEdge("legal", "merge")
    .addEdge("security", "merge")
    .addEdge("merge", END);
}

/** One node asking two questions in turn: interrupted twice on one checkpoint. */
export function asksTwiceGraph() {
  return new StateGraph(State)
    .addNode("ask", () => {
      const first = interrupt({ q: "first?" });
      const second = interrupt({ q: "second?" });
      return { log: [`first:${String(first)}`, `second:${String(second)}`] };
    })
    .addEdge(START, "ask")
    .addEdge("ask", END);
}
