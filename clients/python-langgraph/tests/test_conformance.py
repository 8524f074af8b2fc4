"""LangGraph's own checkpointer suite (langgraph-checkpoint-conformance
0.0.2) against RunkeepSaver over a live ``runkeep serve``.

Gates on every base capability (``passed_all_base()``) and on each
capability the saver implements, by name: never on the level string
(which reads FULL for a saver that implements nothing optional)."""

from __future__ import annotations

import uuid

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from langgraph.checkpoint.runkeep import RunkeepSaver

BASE = {"put", "put_writes", "get_tuple", "list", "delete_thread"}
#: The optional capabilities this saver implements (every one 0.0.2 knows).
IMPLEMENTED_OPTIONAL = {"copy_thread", "delete_for_runs", "prune"}


async def test_langgraph_conformance(serve) -> None:
    client = serve.client("worker")

    @checkpointer_test(name="RunkeepSaver")
    async def runkeep_saver():
        # A fresh session per capability suite: an empty store each time.
        yield RunkeepSaver(client, project="conformance", session=f"s{uuid.uuid4().hex[:12]}")

    report = await validate(runkeep_saver, progress=ProgressCallbacks.verbose())
    report.print_report()
    d = report.to_dict()
    print("conformance report:", d)
    assert report.passed_all_base(), d
    results = d["results"]
    passed = 0
    for name in sorted(BASE | IMPLEMENTED_OPTIONAL):
        r = results[name]
        assert r["detected"] and r["passed"] and r["tests_failed"] == 0, f"{name}: {r}"
        passed += r["tests_passed"]
        print(f"conformance: {name}: {r['tests_passed']} passed, {r['tests_failed']} failed")
    # Optional capabilities not implemented are skipped, never failed.
    for name, r in results.items():
        if name not in BASE | IMPLEMENTED_OPTIONAL:
            assert not r["detected"] and r["tests_failed"] == 0, f"{name}: {r}"
    print(f"conformance: {passed} passed, 0 failed")
