"""The saver's async methods are native: they send over
``runkeep.AsyncRunkeepClient`` and never through the sync client (the
sync client's thread methods are made to fail here, as is
``asyncio.to_thread``), and an owned async saver keeps its holding's
fence across renewals."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

import graphs
from langgraph.checkpoint.runkeep import RunkeepSaver, StaleWriteOwnerError
from langgraph.checkpoint.runkeep import saver as saver_module

SYNC_THREAD_METHODS = [
    "get_thread_checkpoint",
    "list_thread_checkpoints",
    "list_threads_checkpoints",
    "put_thread_checkpoint",
    "put_thread_writes",
    "delete_thread",
    "delete_thread_checkpoints",
]


async def test_the_async_methods_never_use_the_sync_client_nor_threads(serve, monkeypatch) -> None:
    client = serve.client("worker")
    saver = RunkeepSaver(client, project="async", session=f"n{uuid.uuid4().hex[:10]}")
    for name in SYNC_THREAD_METHODS:

        def refuse(*a, _name=name, **k):
            raise AssertionError(f"the async path called the sync client's {_name}")

        monkeypatch.setattr(client, name, refuse)

    def no_threads(*a, **k):
        raise AssertionError("the async path ran on a thread (asyncio.to_thread)")

    monkeypatch.setattr(saver_module.asyncio, "to_thread", no_threads)

    graph = graphs.two_interrupts().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "a-1"}}
    out = await graph.ainvoke({"log": []}, {**config, "metadata": {"run_id": "r-a1"}}, durability="sync")  # aput, aput_writes (parks), aget_tuple
    assert len(out["__interrupt__"]) == 2
    park = await saver.ainterrupt_park("a-1")
    assert park is not None and len(park.interrupts) == 2
    state = await graph.aget_state(config)
    assert len(state.interrupts) == 2
    listed = [t async for t in saver.alist(config)]
    assert len(listed) == 2
    assert len([t async for t in saver.alist(None)]) == 2
    await saver.acopy_thread("a-1", "a-2")
    assert [t.config for t in [t async for t in saver.alist({"configurable": {"thread_id": "a-2"}})]] == [
        {"configurable": {**t.config["configurable"], "thread_id": "a-2"}} for t in listed
    ]
    await saver.aprune(["a-2"], strategy="keep_latest")
    assert len([t async for t in saver.alist({"configurable": {"thread_id": "a-2"}})]) == 1
    assert listed[0].metadata["run_id"] == "r-a1"
    await saver.adelete_for_runs(["r-a1"])
    assert [t async for t in saver.alist(config)] == []
    await saver.adelete_thread("a-2")
    assert await saver.aget_tuple({"configurable": {"thread_id": "a-2"}}) is None
    await saver.aclose()


async def test_an_async_write_refused_by_its_own_renewal_is_retried_at_the_new_fence(serve) -> None:
    client = serve.client("worker")
    aclient = client.to_async()
    saver = RunkeepSaver(client, project="async", session=f"r{uuid.uuid4().hex[:10]}", async_client=aclient)
    thread = "renewing-1"
    held = saver.claim_thread(thread, ttl_ms=1_500)  # renews every 0.5 s
    assert held is not None
    owned = saver.owned(thread, held)
    sent: list[int] = []
    real = aclient.put_thread_checkpoint

    async def put_after_a_renewal(run, body):
        sent.append(body["fence"])
        if len(sent) == 1:
            # Hold the write until this holding renewed: the fence it
            # carries is then one the renewal retired.
            deadline = time.monotonic() + 5
            while held.fence == body["fence"]:
                assert time.monotonic() < deadline, "no renewal came"
                await asyncio.sleep(0.02)
        return await real(run, body)

    aclient.put_thread_checkpoint = put_after_a_renewal  # type: ignore[method-assign]
    graph = graphs.two_interrupts().compile(checkpointer=owned)
    await graph.ainvoke({"log": []}, {"configurable": {"thread_id": thread}}, durability="sync")
    assert len(sent) >= 3 and sent[1] > sent[0], f"the refused write was retried at the renewed fence: {sent}"
    assert not held.lost.is_set()
    assert len(list(saver.list({"configurable": {"thread_id": thread}}))) == 2
    held.release()
    await aclient.aclose()


async def test_an_async_superseded_owner_is_refused(serve) -> None:
    client = serve.client("worker")
    saver = RunkeepSaver(client, project="async", session=f"s{uuid.uuid4().hex[:10]}")
    thread = "superseded-1"
    first = await saver.aclaim_write_ownership(thread, holder="first", ttl_ms=300)
    deadline = time.monotonic() + 10
    while not (client.lease(saver.run_ref(thread)) or {}).get("expired"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    second = await saver.aclaim_write_ownership(thread, holder="second", ttl_ms=60_000)
    config = {"configurable": {"thread_id": thread}}
    await graphs.two_interrupts().compile(checkpointer=second).ainvoke({"log": []}, config, durability="sync")
    tip = await saver.aget_tuple(config)
    with pytest.raises(StaleWriteOwnerError) as e:
        await first.aput(config, {**tip.checkpoint, "id": "1fffffff-ffff-6fff-bfff-ffffffffffff"}, {"step": 9}, {})
    assert e.value.is_stale_write_owner_error
    assert (await saver.aget_tuple(config)).config == tip.config, "nothing of the refused write landed"
    await saver.aclose()
