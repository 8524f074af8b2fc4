"""The worker's group commit (``Worker(commit_batch=…, commit_linger=…)``)
against a live ``runkeep serve``: the finishes of several runs go out in
one ``commit_steps`` request (fewer requests than runs, each run completed
once with its result); a run taken over while its finish waits is refused
alone and the others commit; a renewal while a finish waits is followed
(the group presents the keeper's current fence); the linger sends a group
while the loop is busy; a stop sends what is pending; a lost answer counts
no run completed; ``commit_batch=1`` sends no group; bad values are
refused.

Each test claims within a session of its own, so the module's server can
hold the other tests' runs meanwhile."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from runkeep import ConnectionFailed, PayloadTooLarge, RunkeepClient, RunRef, Worker

TTL = 30_000


def first_checkpoint(n: int = 1) -> dict:
    return {"id": f"cp_input_{n}", "createdAt": int(time.time() * 1000) + n, "state": {"input": n}}


def queue(serve, session: str, *runs: str) -> list[RunRef]:
    op = serve.client("operator")
    refs = [RunRef(serve.project, session, r) for r in runs]
    for i, ref in enumerate(refs):
        op.enqueue(ref, first_checkpoint(i + 1))
    return refs


class Counting:
    """Counts the claims and endings the worker sends: ``calls`` in order
    (``commit_steps`` with its size, e.g. ``commit_steps:3``). ``fail``, when
    set, is what ``commit_steps`` raises: after sending (``after=True``, the
    answer lost) or instead of it."""

    COUNTED = ("claim_next", "claim_next_batch", "commit_step_and_claim_next", "finish", "commit_steps")

    def __init__(self, client: RunkeepClient) -> None:
        self.client = client
        self.calls: list[str] = []
        self.fail: Exception | None = None
        self.after = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if name not in self.COUNTED:
            return attr

        def counted(*a: Any, **kw: Any) -> Any:
            self.calls.append(f"commit_steps:{len(a[0])}" if name == "commit_steps" else name)
            if name == "commit_steps" and self.fail is not None:
                if self.after:
                    attr(*a, **kw)
                raise self.fail
            return attr(*a, **kw)

        return counted


def worker(serve, session: str, **kw: Any) -> tuple[Worker, Counting]:
    client = Counting(serve.client("worker"))
    return Worker(client, project=serve.project, session=session, wait_ms=0, **kw), client  # type: ignore[arg-type]


def result_of(op: RunkeepClient, ref: RunRef) -> Any:
    """The result a completed run finished with."""
    return op.run_summary(ref)["lifecycle"].get("result")


def test_a_group_commit_finishes_many_runs_in_fewer_requests(serve):
    op = serve.client("operator")
    refs = queue(serve, "gc_many", *[f"gc_m{i}" for i in range(8)])
    w, client = worker(serve, "gc_many", claim_batch=4, commit_batch=3, commit_linger=30)
    handled: list[str] = []

    def handler(held):
        handled.append(held.run.run)
        return {"n": held.run.run}

    assert w.run(handler, max_runs=8) == 8
    assert sorted(handled) == sorted(r.run for r in refs), handled
    # Per batch of four: a group of three once full, then the fourth alone
    # before the next claim (the queue empty: nothing held while claiming),
    # the last one on the stop. No finish on its own, no hand-over.
    assert client.calls == ["claim_next_batch", "commit_steps:3", "commit_steps:1", "claim_next_batch", "commit_steps:3", "commit_steps:1"], client.calls
    assert w.report.completed == 8 and w.report.handled == 8
    assert w.report.lost == w.report.end_failed == 0
    for ref in refs:
        life = op.lifecycle(ref)
        assert life["status"] == "completed", life
        assert result_of(op, ref) == {"n": ref.run}
        assert op.lease(ref)["expired"], "the finish ended the holding"


def test_a_run_taken_over_while_its_finish_waits_is_refused_alone(serve):
    op = serve.client("operator")
    a, b, c = queue(serve, "gc_stale", "gc_s_a", "gc_s_b", "gc_s_c")
    events: list[dict] = []
    w, client = worker(serve, "gc_stale", claim_batch=3, commit_batch=3, commit_linger=30, on_event=events.append)

    def handler(held):
        if held.run == c:
            # a's finish waits in the group: take a over behind its back.
            assert op.release(a)
            assert op.claim(a, holder="thief", ttl_ms=TTL).acquired
        return {"n": held.run.run}

    assert w.run(handler, max_runs=3) == 3
    assert client.calls == ["claim_next_batch", "commit_steps:3"], client.calls
    assert w.report.completed == 2 and w.report.lost == 1 and w.report.end_failed == 0, w.report
    assert any(e["type"] == "lost" and e["run"] == a and e["kind"] == "fenced-out" for e in events), events
    assert op.lifecycle(a)["status"] == "active" and op.lease(a)["holder"] == "thief"
    for ref in (b, c):
        assert op.lifecycle(ref)["status"] == "completed"
        assert result_of(op, ref) == {"n": ref.run}


def test_a_finish_waiting_in_the_group_goes_under_its_renewed_fence(serve):
    op = serve.client("operator")
    a, b = queue(serve, "gc_renew", "gc_r_a", "gc_r_b")
    events: list[dict] = []
    w, client = worker(serve, "gc_renew", ttl_ms=1500, claim_batch=2, commit_batch=2, commit_linger=30, on_event=events.append)
    returned_at: dict[str, int] = {}

    def handler(held):
        if held.run == b:
            time.sleep(1.3)  # a's keeper renews (every 0.5 s) while its finish waits
        returned_at[held.run.run] = held.fence
        return {"n": held.run.run}

    assert w.run(handler, max_runs=2) == 2
    assert client.calls == ["claim_next_batch", "commit_steps:2"], client.calls
    renewed = [e for e in events if e["type"] == "renewed" and e["run"] == a]
    assert renewed and renewed[-1]["to"] > returned_at["gc_r_a"], (renewed, returned_at)
    assert w.report.completed == 2 and w.report.lost == 0, w.report
    life = op.lifecycle(a)
    assert life["status"] == "completed"
    assert life["finishedFence"] == renewed[-1]["to"] > returned_at["gc_r_a"], life
    assert op.lifecycle(b)["status"] == "completed"


def test_the_linger_sends_a_group_while_the_loop_handles_another_run(serve):
    op = serve.client("operator")
    a, b = queue(serve, "gc_linger", "gc_l_a", "gc_l_b")
    w, client = worker(serve, "gc_linger", claim_batch=2, commit_batch=2, commit_linger=0.1)
    seen: list[str] = []

    def handler(held):
        if held.run == b:
            # a's finish waited 0.1 s: sent while this handler runs.
            ends = time.monotonic() + 5
            while time.monotonic() < ends and op.lifecycle(a)["status"] != "completed":
                time.sleep(0.02)
            seen.append(op.lifecycle(a)["status"])
        return None

    assert w.run(handler, max_runs=2) == 2
    assert seen == ["completed"]
    assert client.calls == ["claim_next_batch", "commit_steps:1", "commit_steps:1"], client.calls
    assert op.lifecycle(b)["status"] == "completed" and w.report.completed == 2


def test_a_stop_sends_the_pending_finishes(serve):
    op = serve.client("operator")
    refs = queue(serve, "gc_stop", "gc_st_1", "gc_st_2", "gc_st_3")
    w, client = worker(serve, "gc_stop", claim_batch=3, commit_batch=3, commit_linger=60)
    stop = threading.Event()
    first: list[RunRef] = []

    def handler(held):
        first.append(held.run)
        stop.set()
        return {"n": held.run.run}

    assert w.run(handler, stop=stop) == 1
    assert client.calls == ["claim_next_batch", "commit_steps:1"], client.calls
    (done,) = first
    assert op.lifecycle(done)["status"] == "completed" and result_of(op, done) == {"n": done.run}
    assert w.report.completed == 1
    # The batch's others were never handled: released, not finished.
    for ref in refs:
        if ref != done:
            assert op.lifecycle(ref)["status"] == "active"
            assert not (op.lease(ref) or {}).get("holder") or op.lease(ref)["expired"], op.lease(ref)


def test_a_lost_answer_counts_no_run_of_the_group_completed(serve):
    op = serve.client("operator")
    refs = queue(serve, "gc_unknown", "gc_u_1", "gc_u_2")
    w, client = worker(serve, "gc_unknown", claim_batch=2, commit_batch=2, commit_linger=30)
    client.fail = ConnectionFailed("the answer was lost", method="POST", path="/v1/tenants/acme/steps", outcome_unknown=True)
    client.after = True  # sent, then the answer lost
    held: list[Any] = []

    def handler(h):
        held.append(h)
        return {"n": h.run.run}

    with pytest.raises(ConnectionFailed) as raised:
        w.run(handler, max_runs=2)
    assert raised.value.outcome_unknown
    assert client.calls == ["claim_next_batch", "commit_steps:2"], client.calls
    # As a single finish whose answer was lost: nothing counted completed,
    # every keeper stopped, whatever the store did.
    assert w.report.completed == 0 and w.report.lost == 0
    assert len(held) == 2 and all(h.ended and h._stop.is_set() for h in held)
    assert all(op.lifecycle(r)["status"] == "completed" for r in refs)


def test_a_group_refused_whole_as_too_large_is_sent_run_by_run(serve):
    op = serve.client("operator")
    refs = queue(serve, "gc_large", "gc_g_1", "gc_g_2")
    w, client = worker(serve, "gc_large", claim_batch=2, commit_batch=2, commit_linger=30)
    client.fail = PayloadTooLarge({"type": "urn:runkeep:problem:payload-too-large", "title": "Payload too large", "status": 413, "detail": "the body is over the limit"})

    assert w.run(lambda h: {"n": h.run.run}, max_runs=2) == 2
    assert client.calls == ["claim_next_batch", "commit_steps:2", "finish", "finish"], client.calls
    assert w.report.completed == 2
    assert all(result_of(op, r) == {"n": r.run} for r in refs)


def test_commit_batch_one_sends_no_group(serve):
    op = serve.client("operator")
    refs = queue(serve, "gc_one", "gc_o_1", "gc_o_2", "gc_o_3")
    w, client = worker(serve, "gc_one", claim_batch=2)
    assert w.commit_batch == 1
    assert w.run(lambda h: {"n": h.run.run}, max_runs=3) == 3
    # As before: a finish while the queue holds a run, a hand-over once it
    # is empty, a plain finish for the last.
    assert client.calls == ["claim_next_batch", "finish", "commit_step_and_claim_next", "finish"], client.calls
    assert all(op.lifecycle(r)["status"] == "completed" for r in refs)


@pytest.mark.parametrize("bad", [0, 257, -1, 2.5, True, "3"])
def test_a_commit_batch_outside_one_to_256_is_refused(serve, bad):
    with pytest.raises(ValueError, match=r"commit_batch must be an integer from 1 to 256"):
        Worker(serve.client("worker"), commit_batch=bad)


@pytest.mark.parametrize("bad", [-0.001, float("nan"), float("inf"), "0.1", None])
def test_a_negative_or_not_finite_commit_linger_is_refused(serve, bad):
    with pytest.raises(ValueError, match=r"commit_linger must be a finite number of seconds >= 0"):
        Worker(serve.client("worker"), commit_linger=bad)


def test_a_zero_linger_and_the_largest_batch_are_taken(serve):
    w = Worker(serve.client("worker"), commit_batch=256, commit_linger=0)
    assert (w.commit_batch, w.commit_linger) == (256, 0.0)


def test_a_run_cancelled_while_its_finish_waits_is_booked_cancelled_alone(serve):
    op = serve.client("operator")
    a, b = queue(serve, "gc_cancel", "gc_c_a", "gc_c_b")
    events: list[dict] = []
    w, client = worker(serve, "gc_cancel", claim_batch=2, commit_batch=2, commit_linger=30, on_event=events.append)

    def handler(held):
        if held.run == b:
            op.cancel(a, reason="not wanted")
        return {"n": held.run.run}

    assert w.run(handler, max_runs=2) == 2
    assert client.calls == ["claim_next_batch", "commit_steps:2"], client.calls
    assert w.report.completed == 1 and w.report.lost == 1 and w.report.cancelled == 1, w.report
    assert any(e["type"] == "lost" and e["run"] == a and e["kind"] == "cancelled" for e in events), events
    life = op.lifecycle(a)
    assert life["status"] == "cancelled" and life.reason == "not wanted", life
    assert op.lifecycle(b)["status"] == "completed" and result_of(op, b) == {"n": b.run}
