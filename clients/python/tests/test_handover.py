"""The hand-over (``commit_step_and_claim_next``, ``POST …/steps/hand-over``)
against a live ``runkeep serve``: the step commits and the next run comes
back with its fence in one request; an empty queue answers no run with the
step committed; a stale fence raises ``FencedOut`` and claims nothing; a
misspelt field and a reader token are refused, changing nothing; the
worker helper finishes by hand-over when it would claim again anyway.

Each test claims within a session of its own, so the module's server can
hold the other tests' runs meanwhile."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

import runkeep
from runkeep import (
    AsyncRunkeepClient,
    Claimed,
    Contended,
    FencedOut,
    Forbidden,
    HandOver,
    MalformedBody,
    RunkeepClient,
    RunRef,
    Worker,
)

TTL = 30_000


def first_checkpoint(n: int = 1) -> dict:
    return {"id": f"cp_input_{n}", "createdAt": int(time.time() * 1000) + n, "state": {"input": n}}


def done(note: str) -> dict:
    return {"events": [{"type": "note", "payload": {"note": note}}], "finish": {"status": "completed"}}


def queue(serve, session: str, *runs: str) -> list[RunRef]:
    op = serve.client("operator")
    refs = [RunRef(serve.project, session, r) for r in runs]
    for i, ref in enumerate(refs):
        op.enqueue(ref, first_checkpoint(i + 1))
    return refs


def take_next(worker: RunkeepClient, serve, session: str, holder: str, run_id: str) -> int:
    c = worker.claim_next(holder=holder, ttl_ms=TTL, project=serve.project, session=session)
    assert c is not None and c.run.run == run_id, c
    return c.lease.fence


def test_a_hand_over_commits_the_step_and_takes_the_next_run(serve):
    worker, op = serve.client("worker"), serve.client("operator")
    a, b = queue(serve, "ho_sess", "ho_a", "ho_b")
    fence = take_next(worker, serve, "ho_sess", "py-1", "ho_a")

    over = worker.commit_step_and_claim_next(a, fence, done("a"), holder="py-1", ttl_ms=TTL, project=serve.project, session="ho_sess")
    assert isinstance(over, HandOver)
    assert [(e["seq"], e["type"]) for e in over.receipt["events"]] == [(1, "note")]
    assert over.receipt["lifecycle"]["status"] == "completed"
    assert over.next_error is None
    assert isinstance(over.next, Claimed) and over.next.run == b
    assert over.next.lease.holder == "py-1" and over.next.lease.fence >= 1
    assert op.lifecycle(a)["status"] == "completed"
    assert op.lease(a)["expired"]  # the step's finish ended the holding
    assert op.lease(b)["fence"] == over.next.lease.fence

    # The handed-over fence writes ho_b; the last hand-over finds nothing,
    # and its step still committed.
    b_fence = over.next.lease.fence
    last = worker.commit_step_and_claim_next(b, b_fence, done("b"), holder="py-1", ttl_ms=TTL, project=serve.project, session="ho_sess")
    assert last.next is None and last.next_error is None
    assert last.receipt["lifecycle"]["status"] == "completed"
    assert last.receipt["lifecycle"]["finishedFence"] == b_fence
    assert op.run_summary(b)["lastSeq"] == 1
    assert op.lifecycle(b)["status"] == "completed"


def test_an_empty_queue_answers_no_run_with_the_step_committed(serve):
    worker, op = serve.client("worker"), serve.client("operator")
    (only,) = queue(serve, "ho_empty", "ho_only")
    fence = take_next(worker, serve, "ho_empty", "py-2", "ho_only")
    # A step that does not finish: the run stays held by its fence.
    over = worker.commit_step_and_claim_next(only, fence, {"events": [{"type": "progress", "payload": {}}]}, holder="py-2", ttl_ms=TTL, project=serve.project, session="ho_empty")
    assert over.next is None and over.next_error is None
    assert [e["type"] for e in over.receipt["events"]] == ["progress"]
    assert "lifecycle" not in over.receipt or over.receipt["lifecycle"] is None
    assert [e["type"] for e in op.read_events(only)["events"]] == ["progress"]
    assert op.lease(only)["fence"] == fence
    worker.finish(only, fence)


def test_a_stale_fence_is_fenced_out_and_claims_nothing(serve):
    worker, op, reader = serve.client("worker"), serve.client("operator"), serve.client("reader")
    a, b = queue(serve, "ho_stale", "ho_stale_a", "ho_stale_b")
    first = take_next(worker, serve, "ho_stale", "py-3", "ho_stale_a")
    assert worker.release(a, first)
    second = take_next(worker, serve, "ho_stale", "py-3", "ho_stale_a")
    assert second > first

    with pytest.raises(FencedOut) as e:
        worker.commit_step_and_claim_next(a, first, done("stale"), holder="py-3", ttl_ms=TTL, project=serve.project, session="ho_stale")
    assert (e.value.presented, e.value.current) == (first, second)
    assert e.value.status == 409 and not e.value.retryable
    with pytest.raises(Forbidden):
        reader.commit_step_and_claim_next(a, second, done("reader"), holder="r", ttl_ms=TTL, project=serve.project, session="ho_stale")

    # Nothing of either landed, and ho_stale_b was not claimed.
    summary = op.run_summary(a)
    assert summary["lastSeq"] == 0
    assert summary["lifecycle"]["status"] == "active"
    assert summary["lease"]["fence"] == second
    assert op.lease(b) is None

    # The holder's own hand-over then takes it.
    over = worker.commit_step_and_claim_next(a, second, done("a"), holder="py-3", ttl_ms=TTL, project=serve.project, session="ho_stale")
    assert over.next is not None and over.next.run == b
    worker.finish(b, over.next.lease.fence)


def test_a_misspelt_field_is_refused_and_changes_nothing(serve):
    """The method takes only the route's fields (a misspelt keyword is a
    TypeError before any request); a raw body with a misspelt member of
    ``next``, or claim-next's ``waitMs``, is ``MalformedBody`` naming it."""
    worker, op = serve.client("worker"), serve.client("operator")
    a, b = queue(serve, "ho_typo", "ho_typo_a", "ho_typo_b")
    fence = take_next(worker, serve, "ho_typo", "py-4", "ho_typo_a")
    with pytest.raises(TypeError):
        worker.commit_step_and_claim_next(a, fence, done("typo"), holdr="py-4", ttl_ms=TTL)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        worker.commit_step_and_claim_next(a, fence, done("typo"), holder="py-4", ttl_ms=TTL, wait_ms=1000)  # type: ignore[call-arg]
    path = worker._path("commit_step_and_claim_next", a)
    for nxt in ({"holdr": "py-4", "ttlMs": TTL}, {"holder": "py-4", "ttlMs": TTL, "waitMs": 1000}):
        with pytest.raises(MalformedBody) as e:
            worker._send(runkeep.client._Request("POST", path, None, {"fence": fence, "step": done("typo"), "next": nxt}))
        assert str(e.value.field).startswith("next."), e.value.problem
    with pytest.raises(MalformedBody):
        worker._send(runkeep.client._Request("POST", path, None, {"fence": fence, "step": done("typo"), "nxt": {"holder": "py-4", "ttlMs": TTL}}))
    assert op.run_summary(a)["lastSeq"] == 0
    assert op.lease(a)["fence"] == fence
    assert op.lease(b) is None
    over = worker.commit_step_and_claim_next(a, fence, done("a"), holder="py-4", ttl_ms=TTL, project=serve.project, session="ho_typo")
    assert over.next is not None and over.next.run == b
    worker.finish(b, over.next.lease.fence)


async def test_the_async_hand_over(serve):
    a, b = queue(serve, "ho_async", "ho_async_a", "ho_async_b")
    async with AsyncRunkeepClient(serve.url, serve.tokens["worker"]) as c:
        first = await c.claim_next(holder="py-5", ttl_ms=TTL, project=serve.project, session="ho_async")
        assert first is not None and first.run == a
        over = await c.commit_step_and_claim_next(a, first.lease.fence, done("a"), holder="py-5", ttl_ms=TTL, project=serve.project, session="ho_async")
        assert over.receipt["lifecycle"]["status"] == "completed"
        assert over.next is not None and over.next.run == b and over.next_error is None
        with pytest.raises(FencedOut):
            await c.commit_step_and_claim_next(a, first.lease.fence, done("again"), holder="py-5", ttl_ms=TTL)
        last = await c.commit_step_and_claim_next(b, over.next.lease.fence, done("b"), holder="py-5", ttl_ms=TTL, project=serve.project, session="ho_async")
        assert last.next is None and last.next_error is None


def test_next_error_is_the_typed_error_of_its_problem():
    """A store that claims after committing can answer 200 with the claim's
    problem; the client answers it as the typed error, the step's receipt
    beside it. (No live store here fails that way on demand.)"""
    seen: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        import json

        seen.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={
                "receipt": {"events": [{"seq": 3, "type": "note"}]},
                "next": None,
                "nextError": {"type": "urn:runkeep:problem:contended", "title": "Contended", "status": 503, "attempts": 4},
            },
        )

    c = RunkeepClient("http://127.0.0.1:9", "t", tenant="acme", transport=httpx.MockTransport(answer))
    over = c.commit_step_and_claim_next(RunRef("p", "s", "r"), 7, {"events": [{"type": "note", "payload": {}}]}, holder="h", ttl_ms=1000, session=None, order="fifo")
    assert over.next is None
    assert isinstance(over.next_error, Contended) and over.next_error.attempts == 4 and over.next_error.retryable
    assert over.receipt["events"][0]["seq"] == 3
    # The body: the step's fence, the step, and claim-next's body without
    # waitMs (absent options left out).
    assert seen == [{"fence": 7, "step": {"events": [{"type": "note", "payload": {}}]}, "next": {"holder": "h", "ttlMs": 1000, "order": "fifo"}}]


class Counting:
    """Counts the client calls the worker makes."""

    def __init__(self, client: RunkeepClient) -> None:
        self.client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        attr = getattr(self.client, name)
        if name in ("claim_next", "commit_step_and_claim_next", "finish"):
            def counted(*a, **kw):
                self.calls.append(name)
                return attr(*a, **kw)

            return counted
        return attr


def test_the_worker_finishes_by_hand_over_when_it_would_claim_again(serve):
    op = serve.client("operator")
    refs = queue(serve, "ho_worker", "ho_w0", "ho_w1", "ho_w2", "ho_w3")
    client = Counting(serve.client("worker"))
    w = Worker(client, ttl_ms=5000, project=serve.project, session="ho_worker", wait_ms=200)  # type: ignore[arg-type]
    handled: list[str] = []

    def handler(held):
        held.step({"events": [{"type": "work", "payload": {}}]})
        handled.append(held.run.run)
        return {"ok": held.run.run}

    # Three of four: one claim, two hand-overs, a plain finish for the last
    # (max_runs reached: no claim for a run it would not handle).
    assert w.run(handler, max_runs=3) == 3
    assert handled == ["ho_w0", "ho_w1", "ho_w2"]
    assert client.calls == ["claim_next", "commit_step_and_claim_next", "commit_step_and_claim_next", "finish"]
    for ref in refs[:3]:
        life = op.lifecycle(ref)
        assert life["status"] == "completed", life
        assert op.lease(ref)["expired"]  # the finish ended the holding
    assert [e["type"] for e in op.read_events(refs[0])["events"]] == ["work"]
    assert op.lease(refs[3]) is None

    # The fourth, then an empty queue: the hand-over takes nothing, and the
    # loop long-polls claim_next as before until stopped.
    stop = threading.Event()
    client.calls.clear()

    def last(held):
        handled.append(held.run.run)
        threading.Timer(0.5, stop.set).start()
        return None

    assert w.run(last, stop=stop) == 1
    assert handled[-1] == "ho_w3"
    assert client.calls[:2] == ["claim_next", "commit_step_and_claim_next"]
    assert set(client.calls[2:]) <= {"claim_next"} and len(client.calls) >= 3
    assert op.lifecycle(refs[3])["status"] == "completed"


def test_the_worker_does_not_hand_over_once_stopped(serve):
    op = serve.client("operator")
    a, b = queue(serve, "ho_stop", "ho_stop_a", "ho_stop_b")
    client = Counting(serve.client("worker"))
    w = Worker(client, ttl_ms=5000, project=serve.project, session="ho_stop", wait_ms=200)  # type: ignore[arg-type]
    stop = threading.Event()

    def handler(held):
        stop.set()
        return "done"

    assert w.run(handler, stop=stop) == 1
    assert client.calls == ["claim_next", "finish"]
    assert op.lifecycle(a)["status"] == "completed"
    assert op.lease(b) is None


def test_a_fenced_out_hand_over_loses_the_run_and_the_worker_claims_on(serve):
    op = serve.client("operator")
    a, b = queue(serve, "ho_lost", "ho_lost_a", "ho_lost_b")
    client = Counting(serve.client("worker"))
    events: list[dict] = []
    w = Worker(client, ttl_ms=5000, project=serve.project, session="ho_lost", wait_ms=200, on_event=events.append)  # type: ignore[arg-type]
    handled: list[str] = []

    def handler(held):
        handled.append(held.run.run)
        if held.run == a:
            # Taken over behind the worker's back: its finish is fenced out.
            op.release(a)
            op.claim(a, holder="thief", ttl_ms=TTL)
        return None

    assert w.run(handler, max_runs=2) == 2
    assert handled == ["ho_lost_a", "ho_lost_b"]
    assert client.calls == ["claim_next", "commit_step_and_claim_next", "claim_next", "finish"]
    assert any(e["type"] == "lost" and e["kind"] == "fenced-out" for e in events)
    assert op.lifecycle(a)["status"] == "active" and op.lease(a)["holder"] == "thief"
    assert op.lifecycle(b)["status"] == "completed"
