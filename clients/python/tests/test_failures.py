"""Failures a fleet meets on its first day (issue 28), against a live
``runkeep serve``: a handler that raises is a failed attempt, retried after
the run's own backoff and dead-lettered at its limit with its errors kept;
one that raises once then succeeds completes with one failure on record;
a handler past the attempt timeout is stopped and counted with kind
``timeout``; an operator's cancel or release under a running worker stops
its step within one renewal interval (``held.lost``), and no later write of
it lands; the ``cancelled`` problem maps to ``Cancelled``.

The protocol is ``docs/design/worker-protocol.md`` (§2 "A release sticks",
"Cancel"; §5 "Failed attempts"); the Rust runtime's twin of these tests is
``crates/runkeep-worker/tests/failures.rs``. Each test claims within a
session of its own, so the module's server holds the other tests' runs
meanwhile."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from runkeep import (
    Cancelled,
    Conflict,
    HeldRun,
    LeaseLost,
    Lifecycle,
    RetryPolicy,
    RunkeepClient,
    RunkeepError,
    RunRef,
    Worker,
    cut_text,
    problem_error,
)

#: A short lease, so one renewal interval (a third of it) is 0.5 s.
TTL = 1500
RENEW_EVERY = TTL / 1000 / 3
#: What an HTTP round trip or two may add to one renewal interval here.
SLACK = 0.3
FAST_RETRY = RetryPolicy(base_ms=50, factor=2.0, cap_ms=400)


def checkpoint() -> dict:
    return {"id": "cp_input", "createdAt": int(time.time() * 1000), "state": {"input": 1}}


def enqueue(serve, session: str, run_id: str, *, max_attempts: int = 5) -> RunRef:
    ref = RunRef(serve.project, session, run_id)
    serve.client("operator").enqueue(ref, checkpoint(), max_attempts=max_attempts, retry=FAST_RETRY)
    return ref


class Recording:
    """The worker's client, recording the calls that end or report on a
    holding (with their fence)."""

    ENDINGS = ("finish", "release", "snooze", "fail_attempt", "commit_step_and_claim_next")

    def __init__(self, client: RunkeepClient) -> None:
        self.client = client
        self.endings: list[tuple[str, int | None]] = []

    def __getattr__(self, name: str):
        attr = getattr(self.client, name)
        if name in self.ENDINGS:
            def recorded(run, fence=None, *a, **kw):
                self.endings.append((name, fence))
                return attr(run, fence, *a, **kw)

            return recorded
        return attr


def worker(serve, session: str, **kw) -> Worker:
    kw.setdefault("ttl_ms", TTL)
    kw.setdefault("wait_ms", 200)
    return Worker(Recording(serve.client("worker")), project=serve.project, session=session, **kw)  # type: ignore[arg-type]


def run_until(w: Worker, handler, done, *, limit: float = 20.0) -> int:
    """Runs ``w`` until ``done()`` (checked every 50 ms) or ``limit`` s."""
    stop = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + limit
        while not done() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    n = w.run(handler, stop=stop)
    t.join()
    return n


def test_a_handler_that_raises_every_time_is_dead_lettered_after_exactly_its_limit(serve):
    op = serve.client("operator")
    ref = enqueue(serve, "f_poison", "run_poison", max_attempts=3)
    calls: list[float] = []
    events: list[dict] = []
    w = worker(serve, "f_poison", on_event=events.append)

    def handler(held: HeldRun):
        calls.append(time.monotonic())
        raise ValueError(f"boom on call {len(calls)}")

    run_until(w, handler, lambda: op.lifecycle(ref)["status"] != "active")
    life = op.lifecycle(ref)
    assert isinstance(life, Lifecycle)
    assert life.status == "failed" and life.dead_lettered and life.reason == "attempts exhausted", life
    assert life.attempts == 3, life
    assert len(calls) == 3, "stepped exactly the limit"
    # Its three errors kept, kind the exception's class name, message its text.
    assert [(f.attempt, f.kind, f.message) for f in life.failures] == [
        (1, "ValueError", "boom on call 1"),
        (2, "ValueError", "boom on call 2"),
        (3, "ValueError", "boom on call 3"),
    ]
    assert life["failures"][0]["kind"] == "ValueError"  # the JSON, as before
    assert life.retry == FAST_RETRY
    # The store deferred each retry by the run's backoff (equal jitter: at
    # least half the delay); the last failure dead-lettered it (no retry).
    first, second, last = life.failures
    assert first.retry_at is not None and first.retry_at - first.at >= 25
    assert second.retry_at is not None and second.retry_at - second.at >= 50
    assert last.retry_at is None
    assert calls[1] - calls[0] >= 0.025 and calls[2] - calls[1] >= 0.05
    # Nothing committed, and the worker counted what it did.
    assert op.read_events(ref)["events"] == []
    assert (w.report.failed, w.report.dead_lettered, w.report.completed, w.report.lost) == (3, 1, 0, 0), w.report
    assert [e["dead_lettered"] for e in events if e["type"] == "attempt-failed"] == [False, False, True]


def test_a_handler_that_raises_once_then_succeeds_completes_with_one_failure(serve):
    op = serve.client("operator")
    ref = enqueue(serve, "f_flaky", "run_flaky", max_attempts=3)
    calls = []
    w = worker(serve, "f_flaky")

    def handler(held: HeldRun):
        calls.append(held.fence)
        if len(calls) == 1:
            raise KeyError("first try")
        held.step({"events": [{"type": "done", "payload": {}}]})
        return {"ok": True}

    run_until(w, handler, lambda: op.lifecycle(ref)["status"] != "active")
    life = op.lifecycle(ref)
    assert life.status == "completed" and life["result"] == {"ok": True}, life
    assert life.attempts == 1
    assert [(f.kind, f.message, f.fence) for f in life.failures] == [("KeyError", "'first try'", calls[0])]
    assert len(calls) == 2
    assert (w.report.failed, w.report.completed, w.report.dead_lettered) == (1, 1, 0)


def test_a_handler_past_the_attempt_timeout_is_stopped_and_failed_as_timeout(serve):
    op = serve.client("operator")
    ref = enqueue(serve, "f_slow", "run_slow", max_attempts=5)
    seen: dict = {}
    handler_done = threading.Event()
    w = worker(serve, "f_slow", attempt_timeout=0.4)

    def handler(held: HeldRun):
        seen["held"] = held
        time.sleep(1.2)  # ignores the signal, as a blocking call would
        try:
            held.step({"events": [{"type": "late", "payload": {}}]})
            seen["late"] = "landed"
        except LeaseLost as e:
            seen["late"] = e.kind
        handler_done.set()
        return "too late"

    started = time.monotonic()
    assert w.run(handler, max_runs=1) == 1
    took = time.monotonic() - started
    print(f"attempt timeout 0.4 s: the worker moved on after {took:.3f} s")
    assert took < 1.0, f"the worker waited {took:.2f} s on a handler past its 0.4 s timeout"
    held = seen["held"]
    assert held.lost.is_set() and held.loss.kind == "timeout"
    life = op.lifecycle(ref)
    assert life.status == "active" and life.attempts == 1, life
    assert [f.kind for f in life.failures] == ["timeout"]
    assert "attempt timeout" in life.failures[0].message
    assert (w.report.failed, w.report.timed_out, w.report.completed) == (1, 1, 0), w.report
    # The abandoned handler's late write is refused locally; nothing landed.
    assert handler_done.wait(5)
    assert seen["late"] == "timeout"
    assert op.read_events(ref)["events"] == []
    assert life["status"] == op.lifecycle(ref)["status"] == "active"  # its "too late" finished nothing


def test_the_runs_own_attempt_timeout_stops_a_handler_with_none_on_the_worker(serve):
    op = serve.client("operator")
    ref = RunRef(serve.project, "f_own", "run_own")
    op.enqueue(ref, checkpoint(), max_attempts=5, retry=FAST_RETRY, attempt_timeout_ms=400)
    w = worker(serve, "f_own")
    assert w.attempt_timeout is None

    def handler(held: HeldRun):
        assert held.lease.attempt_timeout_ms == 400
        held.lost.wait(30)
        return "late"

    started = time.monotonic()
    assert w.run(handler, max_runs=1) == 1
    assert time.monotonic() - started < 5, "the run's own 0.4 s limit was not applied"
    life = op.lifecycle(ref)
    assert [f.kind for f in life.failures] == ["timeout"], life
    assert (w.report.failed, w.report.timed_out) == (1, 1), w.report


def test_a_run_past_its_deadline_is_finished_by_its_next_claim(serve):
    op = serve.client("operator")
    ref = RunRef(serve.project, "f_deadline", "run_deadline")
    now = op.clock()
    op.enqueue(ref, checkpoint(), deadline=now - 1)
    answer = serve.client("worker").claim(ref, holder="w-deadline", ttl_ms=TTL)
    assert not answer.acquired, answer
    life = op.lifecycle(ref)
    assert (life.status, life.reason) == ("failed", "deadline"), life


def long_handler(started: threading.Event, seen: dict, *, writes: bool):
    """A handler that would run for a minute: waits on ``held.lost``
    (writing an event every 50 ms when ``writes``), records when the
    signal came, then tries one more write (it must not land)."""

    def handler(held: HeldRun):
        seen["held"] = held
        started.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not held.lost.is_set():
            if writes:
                try:
                    held.step({"events": [{"type": "tick", "payload": {}}]})
                    seen["accepted"] = seen.get("accepted", 0) + 1
                except RunkeepError as e:
                    # The refusal that told the worker: the signal is set by then.
                    seen.setdefault("refused", (type(e).__name__, held.lost.is_set()))
            held.lost.wait(0.05)
        seen["stopped_at"] = time.monotonic()
        try:
            held.step({"events": [{"type": "after", "payload": {}}]})
            seen["after"] = "landed"
        except RunkeepError as e:
            seen["after"] = type(e).__name__
        return "finished anyway"

    return handler


def just_renewed(serve, session: str) -> tuple[Worker, threading.Event]:
    """A worker whose event is set at each renewal: acting right after one
    measures the worst case, a whole renewal interval until the next."""
    renewed = threading.Event()

    def on_event(e: dict) -> None:
        if e["type"] == "renewed":
            renewed.set()

    return worker(serve, session, on_event=on_event), renewed


def run_in_thread(w: Worker, handler) -> threading.Thread:
    t = threading.Thread(target=lambda: w.run(handler, max_runs=1), daemon=True)
    t.start()
    return t


def test_an_operator_cancel_sets_lost_within_one_renewal_interval(serve):
    """A handler that only waits (no write to be refused): the renewal
    learns the cancel and sets ``lost`` with the operator's reason. The
    cancel comes right after a renewal, so the next one is a whole
    interval away: the worst case."""
    op = serve.client("operator")
    ref = enqueue(serve, "f_cancel", "run_cancel")
    started, seen = threading.Event(), {}
    w, renewed = just_renewed(serve, "f_cancel")
    t = run_in_thread(w, long_handler(started, seen, writes=False))
    assert started.wait(10) and renewed.wait(10)
    cancelled_at = time.monotonic()
    op.cancel(ref, reason="customer left")
    t.join(10)
    assert not t.is_alive()
    held = seen["held"]
    took = seen["stopped_at"] - cancelled_at
    print(f"cancel: lost after {took:.3f} s (one renewal interval: {RENEW_EVERY:.3f} s)")
    assert took <= RENEW_EVERY + SLACK, f"lost {took:.2f} s after the cancel; one renewal interval is {RENEW_EVERY:.2f} s"
    assert held.loss.kind == "cancelled" and held.loss.reason == "customer left" and held.cancelled
    assert seen["after"] == "LeaseLost"
    life = op.lifecycle(ref)
    # Cancelled, and the worker reported nothing more (no failure, no finish).
    assert life.status == "cancelled" and life.reason == "customer left" and life.failures == [], life
    assert op.read_events(ref)["events"] == []
    assert (w.report.cancelled, w.report.lost, w.report.completed, w.report.failed, w.report.end_failed) == (1, 1, 0, 0, 0), w.report
    assert w.client.endings == [], "the worker ended or reported on a cancelled run"


def test_no_write_of_a_cancelled_run_lands(serve):
    """A handler writing every 50 ms: the cancel is atomic in the store, so
    no write lands after it; the first refused write is ``Cancelled`` and
    has set ``lost`` by the time the handler sees it."""
    op = serve.client("operator")
    ref = enqueue(serve, "f_cancel_w", "run_cancel_w")
    started, seen = threading.Event(), {}
    w = worker(serve, "f_cancel_w")
    t = run_in_thread(w, long_handler(started, seen, writes=True))
    assert started.wait(10)
    time.sleep(0.3)
    cancelled_at = time.monotonic()
    op.cancel(ref, reason="stop it")
    at_cancel = len(op.read_events(ref)["events"])
    t.join(10)
    assert not t.is_alive()
    held = seen["held"]
    assert seen["stopped_at"] - cancelled_at <= RENEW_EVERY + SLACK
    assert held.loss.kind == "cancelled" and held.loss.reason == "stop it"
    assert seen.get("accepted", 0) > 0
    if "refused" in seen:  # a write was refused before a renewal told it
        assert seen["refused"] == ("Cancelled", True), seen["refused"]
    print(f"cancel under writes: told by {'a refused write' if 'refused' in seen else 'the renewal'}")
    assert len(op.read_events(ref)["events"]) == at_cancel, "a write landed after the cancel"
    assert seen["after"] == "LeaseLost"
    life = op.lifecycle(ref)
    assert life.status == "cancelled" and life.failures == []
    assert (w.report.cancelled, w.report.completed, w.report.failed) == (1, 0, 0)
    assert w.client.endings == [], "the worker ended or reported on a cancelled run"


def test_a_write_refused_as_cancelled_marks_the_holding_lost(serve):
    """The write path alone (no renewal due for 10 s): the refusal is
    ``Cancelled`` with the run, the operation and the reason, and ``lost``
    is set with kind ``cancelled``."""
    op = serve.client("operator")
    ref = enqueue(serve, "f_cancel_write", "run_cancel_write")
    w = worker(serve, "f_cancel_write", ttl_ms=30_000)
    held = w.claim(ref)
    assert held is not None
    op.cancel(ref, reason="no more")
    with pytest.raises(Cancelled) as e:
        held.step({"events": [{"type": "x", "payload": {}}]})
    assert (e.value.run, e.value.operation, e.value.reason, e.value.status) == ("run_cancel_write", "commit_step", "no more", 409)
    assert e.value.lost_holding and not e.value.retryable
    assert held.lost.is_set() and held.loss.kind == "cancelled" and held.loss.reason == "no more"
    with pytest.raises(LeaseLost):
        held.step({"events": [{"type": "y", "payload": {}}]})
    assert held.release() is False
    assert w.client.endings == [], "a release was sent for a cancelled run"
    assert op.lifecycle(ref).status == "cancelled"


def test_a_finish_or_failure_report_on_a_cancelled_run_is_told_apart_as_cancelled(serve):
    """A holder's finish or failure report on a cancelled run is answered
    ``Cancelled`` by the store itself; the held run raises it and is lost."""
    op = serve.client("operator")
    for i, end in enumerate([lambda h: h.finish(), lambda h: h.fail_attempt("ValueError", "x")]):
        ref = enqueue(serve, "f_cancel_end", f"run_cancel_end_{i}")
        w = worker(serve, "f_cancel_end", ttl_ms=30_000)
        held = w.claim(ref)
        assert held is not None
        op.cancel(ref, reason=f"end {i}")
        with pytest.raises(Cancelled) as e:
            end(held)
        assert e.value.reason == f"end {i}", e.value
        assert held.cancelled and held.loss.kind == "cancelled"
        assert op.lifecycle(ref).failures == []


def test_an_operator_release_under_a_running_worker_is_a_gap(serve):
    """A release sticks: the next renewal is answered a new claim over the
    release's tombstone (fence held + 2); the worker takes the gap as a lost
    lease within one renewal interval, gives that holding back, and no write
    of its step lands. The release comes right after a renewal (the worst
    case)."""
    op = serve.client("operator")
    ref = enqueue(serve, "f_release", "run_release")
    started, seen = threading.Event(), {}
    w, renewed = just_renewed(serve, "f_release")
    t = run_in_thread(w, long_handler(started, seen, writes=False))
    assert started.wait(10) and renewed.wait(10)
    held = seen["held"]
    fence = held.fence
    released_at = time.monotonic()
    assert op.release(ref)
    t.join(10)
    assert not t.is_alive()
    took = seen["stopped_at"] - released_at
    print(f"release: gap seen after {took:.3f} s (one renewal interval: {RENEW_EVERY:.3f} s)")
    assert took <= RENEW_EVERY + SLACK, f"lost {took:.2f} s after the release"
    assert held.loss.kind == "gap", held.loss
    assert held.loss.fence in (fence, fence + 1)  # a renewal may have landed just before the release
    assert held.loss.current == held.loss.fence + 2, "the claim over the tombstone"
    assert seen["after"] == "LeaseLost"
    assert op.read_events(ref)["events"] == []
    # The holding the renewal took by mistake was given back: claimable at once.
    lease = op.lease(ref)
    assert lease is not None and lease["holder"] == "" and lease["fence"] == held.loss.current + 1, lease
    other = serve.client("worker").claim(ref, holder="someone-else", ttl_ms=TTL)
    assert other.acquired
    # The worker reported nothing for it.
    life = op.lifecycle(ref)
    assert life.status == "active" and life.failures == [] and life.attempts == 0, life
    assert (w.report.lost, w.report.cancelled, w.report.completed, w.report.failed) == (1, 0, 0, 0), w.report
    # Its only ending: giving back the holding the renewal took by mistake.
    assert w.client.endings == [("release", held.loss.current)], w.client.endings
    serve.client("worker").release(ref, other.lease.fence)


def test_the_cancelled_problem_maps_to_cancelled():
    p = {
        "type": "urn:runkeep:problem:cancelled",
        "title": "Run cancelled",
        "status": 409,
        "detail": "cancelled: commit_step on run r was refused because an operator cancelled the run (bye); stop its step",
        "run": "r",
        "operation": "commit_step",
        "reason": "bye",
    }
    e = problem_error(p)
    assert isinstance(e, Cancelled) and e.slug == "cancelled" and e.status == 409
    assert (e.run, e.operation, e.reason) == ("r", "commit_step", "bye")
    assert e.lost_holding and not e.retryable
    # Every "no longer holds the run" refusal says so; others do not.
    fenced = problem_error({"type": "urn:runkeep:problem:fenced-out", "title": "Fenced out", "status": 409, "presented": 1, "current": 2})
    assert fenced.lost_holding
    assert not problem_error({"type": "urn:runkeep:problem:conflict", "title": "Conflict", "status": 409}).lost_holding
    # Over the wire too: the client raises it from the answer.
    c = RunkeepClient("http://127.0.0.1:9", "t", tenant="acme", transport=httpx.MockTransport(lambda r: httpx.Response(409, json=p, headers={"content-type": "application/problem+json"})))
    with pytest.raises(Cancelled) as raised:
        c.commit_step(RunRef("p", "s", "r"), 3, {"events": []})
    assert raised.value.reason == "bye" and raised.value.method == "POST"


def test_fail_attempt_and_cancel_send_the_routes_bodies():
    seen: list[tuple[str, str, dict]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        import json

        seen.append((request.method, request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"status": "active", "attempts": 1})

    c = RunkeepClient("http://127.0.0.1:9", "t", tenant="acme", transport=httpx.MockTransport(answer))
    ref = RunRef("p", "s", "r")
    life = c.fail_attempt(ref, 7, "ValueError", "bad", max_attempts=4)
    assert isinstance(life, Lifecycle) and life.failures == [] and life.retry is None and life["failures"] == []
    c.fail_attempt(ref, 7, "  ", "y" * 5000)
    c.cancel(ref)
    c.cancel(ref, reason="why")
    c.enqueue(ref, {"id": "c", "createdAt": 1, "state": {}}, retry=RetryPolicy(base_ms=50, factor=1.5, cap_ms=500))
    c.enqueue(ref, {"id": "c", "createdAt": 1, "state": {}}, retry={"baseMs": 10, "factor": 1, "capMs": 10})
    base = "/v1/tenants/acme/projects/p/sessions/s/runs/r"
    assert seen[0] == ("POST", base + "/attempts/failed", {"fence": 7, "error": {"kind": "ValueError", "message": "bad"}, "maxAttempts": 4})
    method, path, body = seen[1]
    assert body["error"]["kind"] == "error" and len(body["error"]["message"]) == 4096 and "maxAttempts" not in body
    assert body["error"]["message"].endswith(" … [904 more characters cut]")
    assert seen[2] == ("POST", base + "/cancel", {})
    assert seen[3] == ("POST", base + "/cancel", {"reason": "why"})
    assert seen[4][2]["retry"] == {"baseMs": 50, "factor": 1.5, "capMs": 500}
    assert seen[5][2]["retry"] == {"baseMs": 10, "factor": 1, "capMs": 10}


def test_a_long_message_is_cut_with_a_marker_and_kept(serve):
    assert cut_text("short", 4096) == "short"
    cut = cut_text("é" * 5000, 4096)
    assert len(cut) == 4096 and cut.endswith(" … [904 more characters cut]") and cut.startswith("é" * 4000)
    op, wk = serve.client("operator"), serve.client("worker")
    ref = enqueue(serve, "f_long", "run_long")
    a = wk.claim(ref, holder="long", ttl_ms=TTL)
    life = wk.fail_attempt(ref, a.lease.fence, "RuntimeError", "x" * 10_000)
    (f,) = life.failures
    assert f.kind == "RuntimeError" and len(f.message) == 4096 and f.message.endswith("[5904 more characters cut]")
    assert op.lifecycle(ref).failures == life.failures


def test_cancel_over_http_finishes_the_run_and_a_second_is_a_conflict(serve):
    op, wk = serve.client("operator"), serve.client("worker")
    ref = enqueue(serve, "f_cancel_http", "run_cancel_http")
    life = op.cancel(ref, reason="not needed")
    assert isinstance(life, Lifecycle) and life.status == "cancelled" and life.reason == "not needed"
    assert wk.claim(ref, holder="h", ttl_ms=TTL).outcome == "finished"
    assert wk.claim_next(holder="h", ttl_ms=TTL, project=serve.project, session="f_cancel_http") is None
    with pytest.raises(Conflict):
        op.cancel(ref)


async def test_the_async_client_fails_attempts_and_cancels(serve):
    from runkeep import AsyncRunkeepClient

    ref = RunRef(serve.project, "f_async", "run_async_fail")
    async with AsyncRunkeepClient(serve.url, serve.tokens["operator"]) as c:
        await c.enqueue(ref, checkpoint(), retry=RetryPolicy(base_ms=100))
        a = await c.claim(ref, holder="async", ttl_ms=TTL)
        life = await c.fail_attempt(ref, a.lease.fence, "OSError", "disk")
        assert isinstance(life, Lifecycle) and [(f.kind, f.message) for f in life.failures] == [("OSError", "disk")]
        assert life.retry == RetryPolicy(base_ms=100, factor=2.0, cap_ms=600_000)
        assert (await c.cancel(ref, reason="async")).status == "cancelled"
        assert (await c.lifecycle(ref)).reason == "async"
