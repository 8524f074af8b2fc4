"""The async client (``AsyncRunkeepClient``) beside the sync one: the same
methods with the same parameters, ``to_async``, the tenant learnt on first
use, and the thread routes and typed refusals, each run over both clients
(the ``connect`` fixture)."""

from __future__ import annotations

import asyncio
import inspect

import httpx
import pytest

from runkeep import AsyncRunkeepClient, Cancelled, FencedOut, RunkeepClient, RunRef, Unauthorized
from runkeep.client import OPERATIONS

# The sync client's public members that are not API calls, and their async counterparts.
NOT_CALLS = {"close": "aclose", "tail": "tail", "to_async": None}


def public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


def test_every_method_of_the_sync_client_is_a_coroutine_of_the_async_one_with_its_signature():
    sync = RunkeepClient("http://127.0.0.1:9", "t", tenant="acme")
    aio = AsyncRunkeepClient("http://127.0.0.1:9", "t", tenant="acme")
    calls = public(RunkeepClient) - set(NOT_CALLS)
    # Every operation the client knows is a method (tail_events: tail).
    assert set(OPERATIONS) - {"tail_events"} <= calls
    wrong = []
    for name in sorted(calls):
        s, a = getattr(sync, name), getattr(aio, name, None)
        if a is None:
            wrong.append(f"{name}: missing on AsyncRunkeepClient")
        elif not inspect.iscoroutinefunction(a):
            wrong.append(f"{name}: not a coroutine function on AsyncRunkeepClient")
        elif inspect.signature(s) != inspect.signature(a):
            wrong.append(f"{name}: {inspect.signature(s)} vs {inspect.signature(a)}")
        elif inspect.iscoroutinefunction(s):
            wrong.append(f"{name}: a coroutine on RunkeepClient")
        elif (s.__doc__ or "") != (a.__doc__ or ""):
            wrong.append(f"{name}: its docs differ")
    for name, twin in NOT_CALLS.items():
        if twin is not None and not callable(getattr(aio, twin, None)):
            wrong.append(f"{name}: no {twin} on AsyncRunkeepClient")
    assert not wrong, "\n".join(wrong)
    # And nothing the async client has is missing from the sync one.
    assert public(AsyncRunkeepClient) - calls - {"aclose", "tail", "connect"} == set()
    sync.close()
    asyncio.run(aio.aclose())


def test_both_clients_send_the_same_request_for_each_call():
    """One request builder per operation: the same call makes the same
    method, path, query and body on both transports."""
    seen: dict[str, list[tuple[str, str, bytes]]] = {"sync": [], "async": []}

    def answer(kind: str):
        def handle(request: httpx.Request) -> httpx.Response:
            seen[kind].append((request.method, str(request.url), request.content))
            return httpx.Response(200, json={"checkpoints": [], "checkpoint": None, "checkpointCount": 0, "done": True})

        return handle

    run = RunRef("p", "s", "r", parent="run_parent")
    calls = [
        ("get_thread_checkpoint", (run,), {"ns": "a", "checkpoint_id": "c1"}),
        ("list_thread_checkpoints", (run,), {"before": "c9", "limit": 3, "filter": {"source": "loop"}}),
        ("list_threads_checkpoints", (), {"project": "p", "limit": 2}),
        ("put_thread_checkpoint", (run, {"thread": "t", "ns": "", "checkpointId": "c1", "fence": None}), {}),
        ("put_thread_writes", (run, {"thread": "t", "checkpointId": "c1", "taskId": "x", "writes": []}), {}),
        ("delete_thread", (run, 3), {}),
        ("release", (run,), {"fence": 2}),
    ]
    sync = RunkeepClient("http://x", "t", tenant="acme", transport=httpx.MockTransport(answer("sync")))
    aio = sync.to_async(transport=httpx.MockTransport(answer("async")))

    async def drive() -> None:
        for name, args, kwargs in calls:
            await getattr(aio, name)(*args, **kwargs)
        await aio.aclose()

    for name, args, kwargs in calls:
        getattr(sync, name)(*args, **kwargs)
    asyncio.run(drive())
    assert len(seen["sync"]) == len(calls)
    assert seen["sync"] == seen["async"]


def test_to_async_carries_the_url_token_tenant_and_timeout(serve):
    sync = RunkeepClient(serve.url + "/", serve.tokens["worker"], timeout=7.5)
    aio = sync.to_async()
    assert isinstance(aio, AsyncRunkeepClient)
    assert (aio.base_url, aio.token, aio.tenant, aio.timeout) == (sync.base_url, sync.token, serve.tenant, 7.5)

    async def use() -> str:
        try:
            return (await aio.whoami())["role"]
        finally:
            await aio.aclose()

    assert asyncio.run(use()) == "worker"
    sync.close()


async def test_the_tenant_is_learnt_on_first_use_without_connect(serve):
    c = AsyncRunkeepClient(serve.url, serve.tokens["worker"])
    assert c.tenant == ""
    run = serve.run("run_async_lazy")
    await c.enqueue(run, {"id": "cp0", "createdAt": 1, "state": {}})
    assert c.tenant == serve.tenant
    assert (await c.latest_checkpoint(run))["id"] == "cp0"
    await c.aclose()
    bad = AsyncRunkeepClient(serve.url, "rk_bogus_token")
    with pytest.raises(Unauthorized):
        await bad.lease(run)
    await bad.aclose()


def thread_checkpoint(cp_id: str, parent: str | None, fence: int | None, step: int) -> dict:
    return {
        "thread": "t-1",
        "ns": "",
        "checkpointId": cp_id,
        "parentId": parent,
        "checkpoint": {"channel_versions": {"a": step}, "serde": {"type": "json", "data": "e30="}},
        "metadata": {"step": step, "source": "loop"},
        "blobs": [{"channel": "a", "version": str(step), "type": "json", "data": "MQ=="}],
        "fence": fence,
    }


def test_the_thread_routes(serve, connect):
    op, worker = connect("operator"), connect("worker")
    run = RunRef(serve.project, "threads", f"run_thread_{connect.kind}")
    worker.enqueue(run, {"id": "cp_in", "createdAt": 1, "state": {}})
    held = worker.claim(run, holder="w", ttl_ms=30_000).lease
    for i, (cp, parent) in enumerate([("c1", None), ("c2", "c1"), ("c3", "c2")], start=1):
        worker.put_thread_checkpoint(run, thread_checkpoint(cp, parent, held.fence, i))
    writes = {"thread": "t-1", "ns": "", "checkpointId": "c3", "taskId": "task", "taskPath": "", "writes": [{"idx": 0, "channel": "a", "type": "json", "data": "Mg=="}], "fence": held.fence}
    worker.put_thread_writes(run, writes)
    latest = worker.get_thread_checkpoint(run)
    assert latest["checkpointId"] == "c3" and latest["parentId"] == "c2"
    assert worker.get_thread_checkpoint(run, checkpoint_id="c1")["checkpointId"] == "c1"
    assert worker.get_thread_checkpoint(run, checkpoint_id="nope") is None
    assert [c["checkpointId"] for c in worker.list_thread_checkpoints(run)] == ["c3", "c2", "c1"]
    assert [c["checkpointId"] for c in worker.list_thread_checkpoints(run, before="c3", limit=1)] == ["c2"]
    assert [c["checkpointId"] for c in worker.list_thread_checkpoints(run, filter={"step": 1})] == ["c1"]
    across = op.list_threads_checkpoints(project=serve.project, session="threads")
    assert {c["checkpointId"] for c in across} >= {"c1", "c2", "c3"}
    # Taken over: the old holder's thread writes are fenced out, and change nothing.
    assert op.release(run)
    new = op.claim(run, holder="op", ttl_ms=30_000).lease
    with pytest.raises(FencedOut) as e:
        worker.put_thread_checkpoint(run, thread_checkpoint("c4", "c3", held.fence, 4))
    assert (e.value.presented, e.value.current) == (held.fence, new.fence)
    with pytest.raises(FencedOut):
        worker.delete_thread(run, held.fence)
    assert worker.get_thread_checkpoint(run)["checkpointId"] == "c3"
    # The count is of thread records (the server's unit: checkpoints, and writes).
    assert op.delete_thread(run, new.fence) >= 3
    assert worker.get_thread_checkpoint(run) is None
    assert worker.list_thread_checkpoints(run) == []


def test_a_write_on_a_cancelled_run_is_refused_as_cancelled(serve, connect):
    op, worker = connect("operator"), connect("worker")
    run = RunRef(serve.project, "cancels", f"run_cancel_{connect.kind}")
    worker.enqueue(run, {"id": "cp_in", "createdAt": 1, "state": {}})
    fence = worker.claim(run, holder="w", ttl_ms=30_000).lease.fence
    op.cancel(run, reason="stop")
    with pytest.raises(Cancelled) as e:
        worker.commit_step(run, fence, {"events": [{"type": "late", "payload": {}}]})
    assert e.value.reason == "stop" and e.value.lost_holding
    assert worker.read_events(run)["events"] == []
