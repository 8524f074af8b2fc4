"""Issue 30 through the client (sync and async) against a live ``runkeep
serve``: an enqueue's priority, concurrency key and idempotency key;
``set_priority`` (an operator's, refused to a worker); the listing's
priority order and ``min_priority``; a claim at the key's limit answers
``atLimit``; the key's holdings; bad input is ``InvalidInput`` naming the
field."""

from __future__ import annotations

import time

import pytest

import runkeep
from runkeep import Conflict, Forbidden, InvalidInput


def first_checkpoint(n: int = 1) -> dict:
    return {"id": "cp_input", "createdAt": int(time.time() * 1000), "state": {"input": n}}


def test_priorities_order_the_listing_and_only_an_operator_changes_one(serve, connect):
    worker, op = connect("worker"), connect("operator")
    project = f"prj_prio_{connect.kind}"
    ref = lambda name: runkeep.RunRef(project, serve.session, name)  # noqa: E731
    worker.enqueue(ref("run_low"), first_checkpoint(), priority=-3)
    worker.enqueue(ref("run_mid"), first_checkpoint())
    worker.enqueue(ref("run_high"), first_checkpoint(), priority=8)

    def ids(**q):
        page = op.list_runs(project=project, session=serve.session, order="priority", **q)
        return [r["run"]["runId"] for r in page["entries"]]

    assert ids() == ["run_high", "run_mid", "run_low"]
    assert ids(min_priority=0) == ["run_high", "run_mid"]
    with pytest.raises(Forbidden) as e:
        worker.set_priority(ref("run_low"), 100)
    assert e.value.problem.get("requiredRole") == "operator"
    life = op.set_priority(ref("run_low"), 100)
    assert life.priority == 100
    assert ids()[0] == "run_low"
    with pytest.raises(InvalidInput) as e:
        op.set_priority(ref("run_mid"), 2_000_000)
    assert e.value.field == "priority"
    assert op.lifecycle(ref("run_mid")).priority == 0
    op.cancel(ref("run_mid"))
    with pytest.raises(Conflict):
        op.set_priority(ref("run_mid"), 1)


def test_a_key_at_its_limit_answers_at_limit_and_its_holdings_are_read(serve, connect):
    worker, reader = connect("worker"), connect("reader")
    project = f"prj_keys_{connect.kind}"
    ref = lambda name: runkeep.RunRef(project, serve.session, name)  # noqa: E731
    for name in ("run_ka", "run_kb"):
        worker.enqueue(ref(name), first_checkpoint(), concurrency_key="customer:7/eu")
    assert worker.lifecycle(ref("run_ka")).concurrency == {"key": "customer:7/eu", "limit": 1}
    assert worker.claim(ref("run_ka"), holder="w1", ttl_ms=60_000).acquired
    b = worker.claim(ref("run_kb"), holder="w2", ttl_ms=60_000)
    assert (b.outcome, b.key, b.limit, b.held) == ("atLimit", "customer:7/eu", 1, 1)
    holdings = reader.key_holdings("customer:7/eu", project=project, session=serve.session)
    assert [(h["runId"], h["fence"]) for h in holdings] == [("run_ka", 1)]
    with pytest.raises(InvalidInput) as e:
        reader.key_holdings("a b", project=project, session=serve.session)
    assert e.value.field == "key"
    with pytest.raises(InvalidInput) as e:
        worker.enqueue(ref("run_kbad"), first_checkpoint(), concurrency_key="k", concurrency_limit=0)
    assert e.value.field == "concurrency.limit"
    with pytest.raises(InvalidInput) as e:
        worker.enqueue(ref("run_kbad"), first_checkpoint(), concurrency_key="a key")
    assert e.value.field == "concurrency.key"


def test_an_idempotency_key_answers_the_first_run_inside_its_window(serve, connect):
    worker = connect("worker")
    project = f"prj_dedupe_{connect.kind}"
    ref = lambda name: runkeep.RunRef(project, serve.session, name)  # noqa: E731
    first = worker.enqueue_once(ref("run_d1"), first_checkpoint(1), dedupe_key="order-42", dedupe_window_ms=600_000)
    assert first.created and first.run.run == "run_d1"
    assert first.checkpoint is not None and first.checkpoint["id"] == "cp_input"
    second = worker.enqueue_once(ref("run_d2"), first_checkpoint(2), dedupe_key="order-42", dedupe_window_ms=600_000)
    assert not second.created and second.run == ref("run_d1")
    page = worker.list_runs(project=project, session=serve.session)
    assert [r["run"]["runId"] for r in page["entries"]] == ["run_d1"]
    with pytest.raises(InvalidInput) as e:
        worker.enqueue_once(ref("run_d3"), first_checkpoint(3), dedupe_key="x", dedupe_window_ms=31 * 24 * 3600 * 1000)
    assert e.value.field == "dedupe.windowMs"


def test_an_operator_prunes_finished_runs_past_their_retention(serve, connect):
    worker, op = connect("worker"), connect("operator")
    project = f"prj_prune_{connect.kind}"
    ref = lambda name: runkeep.RunRef(project, serve.session, name)  # noqa: E731
    for name in ("run_done", "run_open"):
        worker.enqueue(ref(name), first_checkpoint())
    lease = worker.claim(ref("run_done"), holder="w1", ttl_ms=60_000)
    assert lease.lease is not None
    worker.finish(ref("run_done"), lease.lease.fence)
    with pytest.raises(Forbidden):
        worker.prune_finished(1, project=project, session=serve.session)
    # Judged an hour later: the finished run is due, the active one is not.
    later = int(time.time() * 1000) + 3_600_000
    report = op.prune_finished(60_000, project=project, session=serve.session, now=later)
    assert [r["runId"] for r in report["deleted"]] == ["run_done"]
    assert report["more"] is False
    page = op.list_runs(project=project, session=serve.session)
    assert [r["run"]["runId"] for r in page["entries"]] == ["run_open"]
    with pytest.raises(InvalidInput):
        op.prune_finished(0, project=project, session=serve.session)
