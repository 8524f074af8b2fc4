"""A graph with a human approval, run by two workers (no LLM).

Worker 1 claims the thread, runs the graph until ``interrupt()`` asks for
an approval, and releases the run (not finish: the graph waits): the saver
turned the interrupt into a runkeep park, which the console shows with its
request. Someone answers it there (or ``--answer`` does it through the API,
as an operator). Worker 2 is a ``RunkeepGraphWorker``: the server hands it
the run once its park is answered; it resumes the graph with
``Command(resume=answer)`` and finishes the run when the graph ends.

    python approval.py --url URL --worker-token W --operator-token O [--answer yes]
"""

from __future__ import annotations

import argparse
import operator
import uuid
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from langgraph.checkpoint.runkeep import RunkeepGraphWorker, RunkeepSaver
from runkeep import RunkeepClient


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
    assert held is not None, "another worker holds the thread"
    graph = build().compile(checkpointer=saver.owned(thread, held))
    config = {"configurable": {"thread_id": thread}}
    out = graph.invoke({"log": []}, config, durability="sync")
    if graph.get_state(config).interrupts:
        say(f"worker-1: interrupted: {[i.value for i in out.get('__interrupt__', [])]}")
        held.release()  # not finish(): the thread waits on its park
        say("worker-1: released the run; it waits on its park")
    else:
        held.finish()  # the graph ended


def worker_two(client: RunkeepClient, saver: RunkeepSaver, say=print, wait_s: float = 60) -> dict:
    """Resumes the answered thread with a RunkeepGraphWorker: it takes the
    run once its park is answered, resumes the graph with the answer and
    finishes the run when the graph ends."""
    worker = RunkeepGraphWorker(build().compile(), saver, holder="worker-2", wait_ms=5_000, result=lambda out: {"log": out["log"]})
    outcome = worker.run_once(wait_s=wait_s)
    assert outcome is not None, f"no answered park came ({worker.report})"
    say(f"worker-2: took {outcome.run.run}; {outcome.how} with {outcome.resume!r}")
    say(f"worker-2: finished: {outcome.output['log']}")
    return outcome.output


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
