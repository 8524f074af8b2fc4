"""Small graphs with interrupts for the tests (no LLM)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from langgraph.checkpoint.runkeep import RunkeepSaver


class State(TypedDict):
    log: Annotated[list, operator.add]


def two_interrupts() -> StateGraph:
    """Two nodes of one step, each asking a question: one step, two interrupts."""

    def a(state: State) -> dict:
        return {"log": [f"a:{interrupt({'q': 'a?'})}"]}

    def b(state: State) -> dict:
        return {"log": [f"b:{interrupt({'q': 'b?'})}"]}

    g = StateGraph(State)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    g.add_edge("a", END)
    g.add_edge("b", END)
    return g


def asks_twice() -> StateGraph:
    """One node asking two questions in turn: interrupted twice on one checkpoint."""

    def ask(state: State) -> dict:
        first = interrupt({"q": "first?"})
        second = interrupt({"q": "second?"})
        return {"log": [f"first:{first}", f"second:{second}"]}

    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def fails_after_answer() -> StateGraph:
    """One node that reads its answer and then fails: the task writes no
    ``__resume__`` of its own, only the error."""

    def ask(state: State) -> dict:
        answer = interrupt({"q": "go?"})
        raise RuntimeError(f"failed after the answer {answer!r}")

    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def approval(die_in_ship: bool = False) -> StateGraph:
    """draft → approve (an interrupt) → ship; ``die_in_ship``: the process
    "dies" in ``ship`` (``KeyboardInterrupt``, nothing reported)."""

    def draft(state: State) -> dict:
        return {"log": ["drafted"]}

    def approve(state: State) -> dict:
        return {"log": [f"approval: {interrupt({'q': 'ship?'})}"]}

    def ship(state: State) -> dict:
        if die_in_ship:
            raise KeyboardInterrupt("the process died")
        return {"log": ["shipped"]}

    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("approve", approve)
    g.add_node("ship", ship)
    g.add_edge(START, "draft")
    g.add_edge("draft", "approve")
    g.add_edge("approve", "ship")
    g.add_edge("ship", END)
    return g


def start(saver: RunkeepSaver, thread: str, builder: StateGraph, inputs: Any = None) -> dict:
    """What a first worker does: claims the thread, runs the graph to its
    interrupt under ownership, and releases the run (it waits on its park)."""
    held = saver.claim_thread(thread, holder="starter")
    assert held is not None
    graph = builder.compile(checkpointer=saver.owned(thread, held))
    config = {"configurable": {"thread_id": thread}}
    out = graph.invoke(inputs if inputs is not None else {"log": []}, config, durability="sync")
    assert graph.get_state(config).interrupts, "the graph stopped at its interrupt"
    held.release()
    return out
