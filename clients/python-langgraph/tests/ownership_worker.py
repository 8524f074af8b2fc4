"""One worker process of the write-ownership test (test_write_ownership.py).

Runs a two-node graph (a → b) on one thread with ``durability="sync"``.
The ``first`` worker starts the thread and blocks inside node ``b`` until
the test creates ``<barrier>/go``; the ``second`` resumes the thread from
its latest checkpoint (``invoke(None)``). With ``--own fixed`` the worker
claims the thread and binds the saver to that fence (never renewed: the
server judges every write); ``--own renewing`` keeps the lease with a
renewing HeldRun; ``--own none`` writes unfenced, like every other saver.
Prints one JSON line with what happened.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sys
import time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from langgraph.checkpoint.runkeep import FixedFence, RunkeepSaver, StaleWriteOwnerError
from runkeep import RunkeepClient


class State(TypedDict):
    log: Annotated[list, operator.add]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--tenant", required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--thread", required=True)
    ap.add_argument("--role", choices=["first", "second"], required=True)
    ap.add_argument("--own", choices=["fixed", "renewing", "none"], required=True)
    ap.add_argument("--ttl-ms", type=int, default=1500)
    ap.add_argument("--barrier", required=True)
    a = ap.parse_args()

    def node_a(state: State) -> dict:
        return {"log": [f"a:{a.role}"]}

    def node_b(state: State) -> dict:
        if a.role == "first":
            open(os.path.join(a.barrier, "first-in-b"), "w").close()
            while not os.path.exists(os.path.join(a.barrier, "go")):
                time.sleep(0.02)
        return {"log": [f"b:{a.role}"]}

    g = StateGraph(State)
    g.add_node("a", node_a)
    g.add_node("b", node_b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)

    client = RunkeepClient(a.url, a.token, tenant=a.tenant)
    saver = RunkeepSaver(client, project="ownership", session=a.session)
    held = None
    fence = None
    if a.own == "fixed":
        answer = client.claim(saver.run_ref(a.thread), holder=f"{a.role}-{os.getpid()}", ttl_ms=a.ttl_ms)
        assert answer.acquired and answer.lease, answer
        fence = answer.lease.fence
        saver = saver.owned(a.thread, FixedFence(fence))
    elif a.own == "renewing":
        held = saver.claim_thread(a.thread, holder=f"{a.role}-{os.getpid()}", ttl_ms=a.ttl_ms)
        assert held is not None
        fence = held.fence
        saver = saver.owned(a.thread, held)
    graph = g.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": a.thread}}
    out = {"role": a.role, "own": a.own, "fence": fence}
    try:
        result = graph.invoke({"log": []} if a.role == "first" else None, config, durability="sync")
        out["result"] = result
        if held is not None:
            held.finish()
        out["ok"] = True
    except StaleWriteOwnerError as e:
        out.update(ok=False, refused=type(e).__name__, presented=e.presented, current=e.current, cause=type(e.__cause__).__name__, stale_marker=e.is_stale_write_owner_error)
    print(json.dumps(out), flush=True)
    return 0 if out.get("ok") else 3


if __name__ == "__main__":
    sys.exit(main())
