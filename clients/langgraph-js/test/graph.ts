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
