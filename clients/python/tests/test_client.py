"""The client against a live ``runkeep serve``: calls, typed errors, the
async twin, the resuming tail and the worker helper."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

import runkeep
from runkeep import (
    AsyncRunkeepClient,
    Conflict,
    ConnectionFailed,
    FencedOut,
    Forbidden,
    InvalidInput,
    LeaseLost,
    MalformedBody,
    NotFound,
    Overloaded,
    RunkeepClient,
    Unauthorized,
    Unavailable,
    Worker,
    problem_error,
)
from runkeep.errors import parse_retry_after


def first_checkpoint(cp_id: str = "cp_input") -> dict:
    return {"id": cp_id, "createdAt": int(time.time() * 1000), "state": {"input": 1}}


def test_claim_write_finish_and_the_tenant_from_the_token(serve, connect):
    worker = connect("worker", tenant=None)
    assert worker.whoami()["role"] == "worker"
    assert worker.tenant == serve.tenant
    assert worker.clock() > 0
    run = serve.run(f"run_basic_{connect.kind}")
    worker.enqueue(run, first_checkpoint())
    a = worker.claim(run, holder="w1", ttl_ms=30_000)
    assert a.acquired and a.lease.fence == 1 and a.lease.holder == "w1"
    receipt = worker.commit_step(run, a.lease.fence, {"events": [{"type": "note", "payload": {"n": 1}}], "checkpoint": {"id": "cp1", "createdAt": int(time.time() * 1000) + 1, "state": {"x": 1}}})
    assert receipt
    assert worker.latest_checkpoint(run)["id"] == "cp1"
    assert worker.read_checkpoint(run, "nope") is None
    assert [e["type"] for e in worker.read_events(run)["events"]] == ["note"]
    life = worker.finish(run, a.lease.fence, result={"ok": True})
    assert life["status"] == "completed"
    assert worker.claim(run, holder="w2", ttl_ms=1000).outcome == "finished"


def test_reads_are_pages(serve, connect):
    op = connect("operator")
    # Its own project: the worker tests claim whatever is runnable in theirs.
    run = runkeep.RunRef("prj_pages", serve.session, f"run_pages_{connect.kind}")
    for i in range(3):
        op.write_checkpoint(run, {"id": f"cp_{i}", "createdAt": 1000 + i, "state": {"n": i}})
    summaries = op.list_checkpoints(run)
    assert [c["id"] for c in summaries] == ["cp_0", "cp_1", "cp_2"]
    assert all("state" not in c for c in summaries)
    page = op.list_checkpoints(run, fields="full", limit=2)
    assert [c["state"] for c in page] == [{"n": 0}, {"n": 1}]
    assert [c["id"] for c in op.list_checkpoints(run, limit=2, after="cp_1")] == ["cp_2"]
    op.append_events(run, [{"type": "note", "payload": {"i": i}} for i in range(1200)])
    first = op.read_events(run)
    assert len(first["events"]) == 1000 and first["more"] and first["nextSinceSeq"] == 1000
    rest = op.read_events(run, since_seq=first["nextSinceSeq"])
    assert len(rest["events"]) == 200 and not rest["more"]
    with pytest.raises(InvalidInput):
        op.read_events(run, limit=10_001)


def test_refusals_are_typed(serve, connect):
    op = connect("operator")
    worker = connect("worker")
    reader = connect("reader")
    run = serve.run(f"run_errors_{connect.kind}")
    worker.enqueue(run, first_checkpoint())
    held = worker.claim(run, holder="w1", ttl_ms=30_000).lease
    # Taken over: the old fence is fenced out, with both fences.
    assert op.release(run)
    new = op.claim(run, holder="op", ttl_ms=30_000).lease
    with pytest.raises(FencedOut) as e:
        worker.write_checkpoint(run, {"id": "late", "createdAt": 1, "state": {}}, fence=held.fence)
    assert (e.value.presented, e.value.current) == (held.fence, new.fence)
    assert e.value.status == 409 and e.value.slug == "fenced-out" and not e.value.retryable
    # Roles and tokens.
    with pytest.raises(Forbidden):
        reader.write_checkpoint(run, {"id": "x", "createdAt": 1, "state": {}})
    with pytest.raises(Unauthorized):
        connect(token="rk_bogus_token").lease(run)
    with pytest.raises(NotFound):
        op.run_summary(serve.run("run_never"))
    with pytest.raises(InvalidInput) as bad:
        op.claim(run, holder="x", ttl_ms=0)
    assert bad.value.field
    with pytest.raises(MalformedBody):
        op._send(runkeep.client._Request("POST", op._path("claim", run), None, {"holder": "x", "ttlMs": 1000, "zz": 1}))
    # A park answered twice: the second refusal carries the first answer.
    cp = {"id": "park1", "createdAt": 1, "state": {}, "pending": {"request": {"type": "approval"}, "parkedAt": 1}}
    op.write_checkpoint(run, cp, fence=new.fence)
    op.resolve_park(run, "park1", "yes")
    with pytest.raises(Conflict) as c:
        op.resolve_park(run, "park1", "no")
    assert c.value.first_answer == "yes" and c.value.resolved_at


def test_forbidden_tells_a_holding_not_this_tokens_from_a_role_too_low():
    f = problem_error({"type": "urn:runkeep:problem:forbidden", "title": "Forbidden", "status": 403, "run": "r", "operation": "finish", "presented": 4, "current": 4})
    assert isinstance(f, Forbidden) and f.not_your_holding
    assert (f.run, f.holding_fence, f.presented) == ("r", 4, 4)
    unfenced = problem_error({"type": "urn:runkeep:problem:forbidden", "title": "Forbidden", "status": 403, "run": "r", "current": 2})
    assert unfenced.not_your_holding and (unfenced.holding_fence, unfenced.presented) == (2, None)
    role = problem_error({"type": "urn:runkeep:problem:forbidden", "title": "Forbidden", "status": 403, "requiredRole": "worker"})
    assert not role.not_your_holding and (role.run, role.holding_fence, role.required_role) == (None, None, "worker")


def test_retryable_kinds_carry_retry_after_and_outcome_unknown():
    p = {"type": "urn:runkeep:problem:unavailable", "title": "Unavailable", "status": 503, "outcomeUnknown": True}
    e = problem_error(p, retry_after=2.5)
    assert isinstance(e, Unavailable) and e.retryable and e.retry_after == 2.5 and e.outcome_unknown
    o = problem_error({"type": "urn:runkeep:problem:overloaded", "title": "Overloaded", "status": 503})
    assert isinstance(o, Overloaded) and o.retry_after == 1.0
    unknown = problem_error({"type": "urn:other", "title": "Teapot", "status": 418})
    assert type(unknown) is runkeep.RunkeepError and unknown.status == 418
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480.0) == 0.0


def test_a_write_whose_request_may_have_left_is_outcome_unknown(connect):
    """Below HTTP: a connection lost after the request left."""

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("connection reset", request=request)

    c = connect(token="t", tenant="acme", url="http://127.0.0.1:9", transport=httpx.MockTransport(reset))
    with pytest.raises(ConnectionFailed) as w:
        c.write_checkpoint(runkeep.RunRef("p", "s", "r"), {"id": "x", "createdAt": 1, "state": {}})
    assert w.value.outcome_unknown and w.value.retryable
    with pytest.raises(ConnectionFailed) as r:
        c.lease(runkeep.RunRef("p", "s", "r"))
    assert not r.value.outcome_unknown


async def test_the_async_client(serve):
    async with AsyncRunkeepClient(serve.url, serve.tokens["worker"]) as c:
        assert c.tenant == serve.tenant
        run = serve.run("run_async")
        await c.enqueue(run, first_checkpoint())
        a = await c.claim(run, holder="aw", ttl_ms=30_000)
        assert a.acquired
        got = await asyncio.gather(*(c.append_events(run, [{"type": "n", "payload": {"i": i}}], fence=a.lease.fence) for i in range(5)))
        assert sorted(e[0]["seq"] for e in got) == [1, 2, 3, 4, 5]
        # A fence never issued is invalid input (not fenced-out).
        with pytest.raises(InvalidInput):
            await c.write_checkpoint(run, {"id": "z", "createdAt": 1, "state": {}}, fence=99)


def test_the_tail_follows_live_appends(serve):
    op = serve.client("operator")
    run = serve.run("run_tail")
    op.enqueue(run, first_checkpoint())
    lease = op.claim(run, holder="t", ttl_ms=60_000).lease
    got: list[int] = []
    done = threading.Event()

    def consume() -> None:
        for ev in op.tail(run, reconnect_delay=0.05):
            got.append(ev["seq"])
            if len(got) >= 30:
                break
        done.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    for i in range(3):
        op.append_events(run, [{"type": "n", "payload": {"i": i * 10 + j}} for j in range(10)], fence=lease.fence)
        time.sleep(0.2)
    assert done.wait(20), got
    assert got == list(range(1, 31))


def test_the_tail_resumes_after_a_dropped_stream(serve):
    """A stream cut after 3 events: the reconnect sends Last-Event-ID 3 and
    gets 4.. once each."""
    op = serve.client("operator")
    run = serve.run("run_tail_drop")
    op.enqueue(run, first_checkpoint())
    lease = op.claim(run, holder="t", ttl_ms=60_000).lease
    op.append_events(run, [{"type": "n", "payload": {"i": i}} for i in range(6)], fence=lease.fence)
    seen_ids: list[str | None] = []
    real = httpx.HTTPTransport()

    class CutAfterThree(httpx.BaseTransport):
        calls = 0

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            seen_ids.append(request.headers.get("last-event-id"))
            res = real.handle_request(request)
            CutAfterThree.calls += 1
            if CutAfterThree.calls > 1 or "events/stream" not in request.url.path:
                return res

            def cut():
                frames = 0
                for chunk in res.stream:
                    yield chunk
                    frames += chunk.count(b"\n\n")
                    if frames >= 3:
                        raise httpx.ReadError("cut")

            return httpx.Response(res.status_code, headers=res.headers, stream=httpx.ByteStream(b"".join(cut_safe(cut()))), request=request)

    def cut_safe(gen):
        out = []
        try:
            for c in gen:
                out.append(c)
        except httpx.ReadError:
            pass
        # Keep whole frames only (what a reader saw before the cut).
        data = b"".join(out)
        return [data[: data.rfind(b"\n\n") + 2]] if b"\n\n" in data else [b""]

    c = RunkeepClient(serve.url, serve.tokens["reader"], tenant=serve.tenant, transport=CutAfterThree())
    got = []
    for ev in c.tail(run, reconnect_delay=0.01):
        got.append(ev["seq"])
        if len(got) == 6:
            break
    assert got == [1, 2, 3, 4, 5, 6]
    assert seen_ids[0] is None and seen_ids[1] is not None and int(seen_ids[1]) >= 3


def test_the_worker_renews_steps_and_finishes(serve):
    op = serve.client("operator")
    for i in range(2):
        op.enqueue(serve.run(f"run_w{i}"), first_checkpoint())
    events = []
    w = Worker(serve.client("worker"), ttl_ms=1500, project=serve.project, session=serve.session, wait_ms=500, on_event=events.append)
    fences = []

    def handler(held):
        first = held.fence
        held.step({"events": [{"type": "start", "payload": {}}]})
        time.sleep(1.2)  # past a third of the TTL, twice: renewed
        held.check()
        assert held.fence > first
        fences.append((first, held.fence))
        held.step({"events": [{"type": "done", "payload": {}}]})
        return {"ok": True}

    assert w.run(handler, max_runs=2) == 2
    assert len(fences) == 2 and any(e["type"] == "renewed" for e in events)
    for i in range(2):
        assert op.lifecycle(serve.run(f"run_w{i}"))["status"] == "completed"


def test_the_worker_stops_writing_once_superseded(serve):
    op = serve.client("operator")
    run = serve.run("run_lost")
    op.enqueue(run, first_checkpoint())
    w = Worker(serve.client("worker"), ttl_ms=3000)
    held = w.claim(run)
    assert held is not None
    op.release(run)
    op.claim(run, holder="thief", ttl_ms=30_000)
    with pytest.raises(FencedOut):
        held.step({"events": [{"type": "late", "payload": {}}]})
    assert held.lost.is_set() and held.loss.kind == "fenced-out"
    with pytest.raises(LeaseLost):
        held.step({"events": [{"type": "later", "payload": {}}]})
    held.stop_renewing()
