"""A graph with a human approval, run by two workers (no LLM).

Worker 1 claims the thread, runs the graph until ``interrupt()`` asks for
an approval, and releases the run: the saver turned the interrupt into a
runkeep park, which the console shows with its request. Someone answers it
there (or ``--answer`` does it through the API, as an operator). Worker 2
takes the run with ``claim_next`` (parks answered), reads the answer and
resumes the graph with ``Command(resume=answer)``, then finishes the run.

    python approval.py --url URL --worker-token W --operator-token O [--answer yes]
"""

from __future__ import annotations

import argparse
import operator
import time
import uuid
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from langgraph.checkpoint.runkeep import RunkeepSaver
from runkeep import RunkeepClient, Worker


class State(TypedDict):
    log: Annotated[list, operator.add]


def approved(answer) -> bool:
    """The answer approves: ``"yes"`` (an answer through the API, as
    ``--answer yes``) or the console's Approve button, whose decision is
    ``{"action": "approve", "by": …}``."""
    if isinstance(answer, dict):
        return answer.get("action") == "approve"
    return answer == "yes"


def build():
    def draft(state: State) -> dict:
        return {"log": ["drafted"]}

    def approve(state: State) -> dict:
        answer = interrupt({"question": "Ship the draft?", "draft": state["log"]})
        return {"log": [f"approval: {'yes' if approved(answer) else 'no'}"]}

    def ship(state: State) -> dict:
        return {"log": ["shipped" if "approval: yes" in state["log"] else "not shipped"]}

    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("approve", approve)
    g.add_node("ship", ship)
    g.add_edge(START, "draft")
    g.add_edge("draft", "approve")
    g.add_edge("approve", "ship")
    g.add_edge("ship", END)
    return g


def worker_one(client: RunkeepClient, saver: RunkeepSaver, thread: str, say=print) -> None:
    held = saver.claim_thread(thread, holder="worker-1", ttl_ms=30_000)
    assert held is not None
    graph = build().compile(checkpointer=saver.owned(thread, held))
    out = graph.invoke({"log": []}, {"configurable": {"thread_id": thread}}, durability="sync")
    say(f"worker-1: interrupted: {[i.value for i in out.get('__interrupt__', [])]}")
    held.release()
    say("worker-1: released the run; it waits on its park")


def worker_two(client: RunkeepClient, saver: RunkeepSaver, say=print, wait_s: float = 60) -> dict:
    w = Worker(client, holder="worker-2", ttl_ms=30_000, project=saver.project, session=saver.session, park=["resolved"], wait_ms=5_000)
    deadline = time.monotonic() + wait_s
    while True:
        held = w.claim_next()
        if held is not None:
            break
        assert time.monotonic() < deadline, "no answered park came"
    # The thread's own id, as its writer named it (the run id encodes it).
    thread = client.get_thread_checkpoint(held.run)["thread"]
    ok, answer = saver.answered_interrupt(thread)
    assert ok, "claimed a run whose park is not answered"
    say(f"worker-2: took {held.run.run} at fence {held.fence}; the answer: {answer!r}")
    graph = build().compile(checkpointer=saver.owned(thread, held))
    out = graph.invoke(Command(resume=answer), {"configurable": {"thread_id": thread}}, durability="sync")
    held.finish(result={"log": out["log"]})
    say(f"worker-2: finished: {out['log']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--worker-token", required=True)
    ap.add_argument("--operator-token", required=True)
    ap.add_argument("--project", default="examples")
    ap.add_argument("--session", default="approvals")
    ap.add_argument("--answer", default=None, help="answer the park through the API instead of the console")
    a = ap.parse_args()
    client = RunkeepClient(a.url, a.worker_token)
    saver = RunkeepSaver(client, project=a.project, session=a.session)
    thread = f"approval-{uuid.uuid4().hex[:8]}"
    worker_one(client, saver, thread)
    park = client.find_pending(saver.run_ref(thread))
    print(f"park {park['id']} on run {saver.run_ref(thread).run}: {park['pending']['request']}")
    if a.answer is not None:
        op = RunkeepClient(a.url, a.operator_token)
        op.resolve_park(saver.run_ref(thread), park["id"], a.answer)
        print(f"operator: answered {a.answer!r}")
    else:
        print("answer it in the console; worker-2 waits")
    worker_two(client, saver, wait_s=600)


if __name__ == "__main__":
    main()
