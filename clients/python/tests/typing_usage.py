"""Checked by ``mypy --strict`` in ``scripts/ci.sh``, never run: what a
caller's type checker sees of both clients. A sync call answers its value,
an async one a coroutine of the same value; a mix-up is a type error."""

from __future__ import annotations

from typing import Any

from runkeep import AsyncRunkeepClient, ClaimAnswer, Claimed, HandOver, Lifecycle, RunkeepClient, RunRef


def sync_use(c: RunkeepClient, run: RunRef) -> tuple[ClaimAnswer, Lifecycle, int, dict[str, Any] | None, list[Any], Claimed | None]:
    a: ClaimAnswer = c.claim(run, holder="w", ttl_ms=1000)
    life: Lifecycle = c.finish(run, 1, result={"ok": True})
    gone: int = c.delete_thread(run, fence=1)
    latest: dict[str, Any] | None = c.get_thread_checkpoint(run, ns="")
    page: list[Any] = c.list_thread_checkpoints(run, limit=3)
    nxt: Claimed | None = c.claim_next(holder="w", ttl_ms=1000)
    return a, life, gone, latest, page, nxt


async def async_use(c: AsyncRunkeepClient, run: RunRef) -> tuple[ClaimAnswer, Lifecycle, int, HandOver, bool]:
    a: ClaimAnswer = await c.claim(run, holder="w", ttl_ms=1000)
    life: Lifecycle = await c.finish(run, 1, result={"ok": True})
    gone: int = await c.delete_thread(run, fence=1)
    over: HandOver = await c.commit_step_and_claim_next(run, 1, {}, holder="w", ttl_ms=1000)
    done: bool = await c.release(run, 1)
    return a, life, gone, over, done


async def both(c: RunkeepClient) -> AsyncRunkeepClient:
    async with c.to_async() as aio:
        await aio.whoami()
        async for _event in aio.tail(RunRef("p", "s", "r")):
            break
    return aio
