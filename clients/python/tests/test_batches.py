"""Batches against a live ``runkeep serve``: ``claim_next_batch`` takes
several runs in one request, each under its own lease and fence;
``commit_steps`` commits several runs' steps in one request with one
outcome per step (a released run's step is refused alone with
``FencedOut``); a bad batch and a reader token are refused, changing
nothing. Each test runs over both transports (``connect``: sync and
async), each in a session of its own."""

from __future__ import annotations

import time

import pytest

from runkeep import FencedOut, Forbidden, InvalidInput, RunRef, StepOutcome

TTL = 30_000


def first_checkpoint(n: int = 1) -> dict:
    return {"id": f"cp_input_{n}", "createdAt": int(time.time() * 1000) + n, "state": {"input": n}}


def note(n: str) -> dict:
    return {"events": [{"type": "note", "payload": {"n": n}}]}


def queue(serve, session: str, *runs: str) -> list[RunRef]:
    op = serve.client("operator")
    refs = [RunRef(serve.project, session, r) for r in runs]
    for i, ref in enumerate(refs):
        op.enqueue(ref, first_checkpoint(i + 1))
    return refs


def test_a_batch_is_leased_run_by_run_and_a_group_commit_refuses_only_the_stale_step(serve, connect):
    worker, op = connect("worker"), serve.client("operator")
    sess = f"batch_{connect.kind}"
    refs = queue(serve, sess, "b_1", "b_2", "b_3", "b_4")
    taken = worker.claim_next_batch(3, holder="py-batch", ttl_ms=TTL, project=serve.project, session=sess)
    assert [c.run.run for c in taken] == ["b_1", "b_2", "b_3"]
    for c in taken:
        lease = op.lease(c.run)
        assert lease is not None and lease["fence"] == c.lease.fence, (c, lease)
    one, two, three = taken
    assert worker.release(two.run, fence=two.lease.fence)

    outcomes = worker.commit_steps([(c.run, c.lease.fence, note(c.run.run)) for c in (one, two, three)])
    assert [type(o) for o in outcomes] == [StepOutcome] * 3
    assert outcomes[0].receipt is not None and [e["seq"] for e in outcomes[0].receipt["events"]] == [1]
    assert isinstance(outcomes[1].error, FencedOut), outcomes[1]
    assert outcomes[2].receipt is not None and [e["seq"] for e in outcomes[2].receipt["events"]] == [1]
    assert op.read_events(refs[1])["events"] == [], "the refused step left nothing"

    rest = worker.claim_next_batch(5, holder="py-batch", ttl_ms=TTL, project=serve.project, session=sess)
    assert [c.run.run for c in rest] == ["b_2", "b_4"]
    assert worker.claim_next_batch(5, holder="py-batch", ttl_ms=TTL, project=serve.project, session=sess) == []


def test_a_bad_batch_is_refused_whole_and_a_reader_may_not_batch(serve, connect):
    worker, op, reader = connect("worker"), serve.client("operator"), connect("reader")
    sess = f"bad_batch_{connect.kind}"
    (ref,) = queue(serve, sess, "bb_1")
    for size in (0, 257):
        with pytest.raises(InvalidInput):
            worker.claim_next_batch(size, holder="py-bad", ttl_ms=TTL, project=serve.project, session=sess)
    with pytest.raises(Forbidden):
        reader.claim_next_batch(1, holder="py-bad", ttl_ms=TTL, project=serve.project, session=sess)
    assert op.lease(ref) is None, "nothing was claimed"
    (c,) = worker.claim_next_batch(1, holder="py-bad", ttl_ms=TTL, project=serve.project, session=sess)
    step = (ref, c.lease.fence, note("x"))
    with pytest.raises(InvalidInput):
        worker.commit_steps([step, step])
    with pytest.raises(InvalidInput):
        worker.commit_steps([])
    with pytest.raises(Forbidden):
        reader.commit_steps([step])
    assert op.read_events(ref)["events"] == [], "nothing was written"
