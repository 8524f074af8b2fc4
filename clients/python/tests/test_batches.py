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


def test_the_worker_claims_in_batches_handles_each_run_once_and_releases_what_it_did_not_start(serve):
    import threading

    from runkeep import Worker

    worker_client, op = serve.client("worker"), serve.client("operator")
    refs = queue(serve, "worker_batch", *[f"wb_{i}" for i in range(1, 6)])
    calls: list[int] = []
    real = worker_client.claim_next_batch

    def counting(max: int, **kw):  # type: ignore[no-untyped-def]
        got = real(max, **kw)
        calls.append(len(got))
        return got

    worker_client.claim_next_batch = counting  # type: ignore[method-assign]
    w = Worker(worker_client, project=serve.project, session="worker_batch", claim_batch=3, wait_ms=0)
    handled: list[str] = []
    assert w.run(lambda h: handled.append(h.run.run), max_runs=5) == 5
    assert sorted(handled) == [r.run for r in refs], handled
    # The first claim takes three; once they are handled, hand-overs
    # (one run each, with the finishing commit) take the rest.
    assert calls[0] == 3, calls
    assert all(op.lifecycle(r).status == "completed" for r in refs)

    # Stopped after its first run, the worker gives back the batch's others.
    more = queue(serve, "worker_batch_stop", "ws_1", "ws_2", "ws_3")
    stop = threading.Event()
    w2 = Worker(worker_client, project=serve.project, session="worker_batch_stop", claim_batch=3, wait_ms=0)
    assert w2.run(lambda h: stop.set(), stop=stop) == 1
    held = [r for r in more if (op.lease(r) or {}).get("holder")]
    assert held == [], f"runs still held after the stop: {held}"
    assert [op.lifecycle(r).status for r in more].count("completed") == 1


def test_a_batch_size_outside_one_to_256_is_refused(serve):
    from runkeep import Worker

    for size in (0, 257):
        with pytest.raises(ValueError, match="claim_batch"):
            Worker(serve.client("worker"), claim_batch=size)
