"""A LangGraph checkpoint saver over runkeep's HTTP API, with opt-in write
ownership: a saver bound to a runkeep lease refuses a superseded owner's
writes (:class:`StaleWriteOwnerError`), so two workers on one thread can
never fork its checkpoint chain.

Mapping (the server's ``thread`` routes, ``crates/runkeep-server/README.md``):

- a LangGraph **thread** is a runkeep **run** of ``project``/``session``:
  :func:`thread_run_id` maps the thread id to a run id deterministically;
- a **checkpoint** ``(checkpoint_ns, checkpoint_id)`` is a thread checkpoint
  with its parent id, its metadata (JSON, what ``filter`` matches), the
  checkpoint without its channel values (``serde``-typed, base64, plus its
  ``channel_versions`` as JSON so the server rebuilds values), and a blob
  per channel of ``new_versions``;
- **pending writes** are keyed by ``(task_id, idx)`` with LangGraph's
  conflict rule, applied by the server; an ``__interrupt__`` write also
  opens a runkeep park on that checkpoint (its request readable in the
  console), unless ``parks=False``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
import re
from typing import Any, AsyncIterator, Iterator, Mapping, Optional, Sequence, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.types import INTERRUPT
from runkeep import Cancelled, FencedOut, HeldRun, LeaseLost, RunkeepClient, RunkeepError, RunRef

__all__ = [
    "FixedFence",
    "RunkeepSaver",
    "StaleWriteOwnerError",
    "thread_run_id",
]

_RAW = re.compile(r"^[A-Za-z0-9_-]{1,124}$")


def thread_run_id(thread_id: str) -> str:
    """The run id of a LangGraph thread id: ``run_<thread>`` when the thread
    id is 1 to 124 characters of ``[A-Za-z0-9_-]`` not starting with ``x_``
    or ``h_``; else ``run_x_`` and the lowercase hex of its UTF-8 bytes when
    that fits in 128 characters; else ``run_h_`` and the hex SHA-256 of
    them. Injective on the first two forms; every form is a valid run id
    starting with ``run_`` (what a directory store lists and hands out)."""
    t = str(thread_id)
    if _RAW.match(t) and not t.startswith(("x_", "h_")):
        return f"run_{t}"
    h = t.encode("utf-8").hex()
    if len(h) <= 122:
        return f"run_x_{h}"
    return f"run_h_{hashlib.sha256(t.encode('utf-8')).hexdigest()}"


class StaleWriteOwnerError(RunkeepError):
    """A write by a superseded owner of the thread, refused: another worker
    claimed the thread since this saver's lease was taken. Nothing of the
    write landed. ``presented`` is the fence the write carried, ``current``
    the run's top holding when the server refused it (``None`` when the
    refusal was local: the lease was already known lost)."""

    #: The marker the proposed LangGraph ``write_ownership`` capability reads.
    is_stale_write_owner_error = True

    def __init__(self, thread_id: str, presented: int, current: int | None, cause: Exception) -> None:
        problem = getattr(cause, "problem", None) or {
            "type": "urn:runkeep:client:stale-write-owner",
            "title": "Stale write owner",
            "status": 409,
        }
        problem = dict(problem)
        problem["detail"] = (
            f"thread {thread_id!r}: this saver's write ownership (fence {presented}) was superseded"
            + (f" by fence {current}" if current is not None else "")
            + f"; the write was refused and nothing of it landed ({cause})"
        )
        super().__init__(problem)
        self.thread_id = thread_id
        self.presented = presented
        self.current = current
        self.__cause__ = cause


class FixedFence:
    """Write ownership at one fence, never renewed (the server judges every
    write). :class:`runkeep.HeldRun` is the renewing kind."""

    def __init__(self, fence: int) -> None:
        self.fence = fence

    def fenced(self, write: Any) -> Any:
        return write(self.fence)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(data: str | None) -> bytes:
    return b"" if data is None else base64.b64decode(data)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


class RunkeepSaver(BaseCheckpointSaver[str]):
    """A checkpoint saver keeping each thread in a runkeep run.

    ``client`` is a :class:`runkeep.RunkeepClient` (a worker token to write,
    a reader token to read). Threads live under ``project``/``session``.
    Unbound, the saver writes unfenced (like every other LangGraph saver:
    two writers on one thread fork it). Bound to a lease
    (:meth:`owned`, :meth:`claim_thread`, :meth:`aclaim_write_ownership`),
    every write to that thread carries the lease's fence and a superseded
    owner's write raises :class:`StaleWriteOwnerError`.

    The async methods run the sync ones on a thread (``asyncio.to_thread``).
    """

    def __init__(
        self,
        client: RunkeepClient,
        *,
        project: str = "langgraph",
        session: str = "threads",
        serde: Any = None,
        parks: bool = True,
        _owner: tuple[str, Any] | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.client = client
        self.project = project
        self.session = session
        self.parks = parks
        self._owner = _owner

    # -- ownership -----------------------------------------------------
    def run_ref(self, thread_id: str) -> RunRef:
        """The runkeep run that keeps ``thread_id``."""
        return RunRef(self.project, self.session, thread_run_id(thread_id))

    def owned(self, thread_id: str, lease: Any) -> "RunkeepSaver":
        """This saver bound to ``lease`` (a :class:`runkeep.HeldRun` or a
        :class:`FixedFence`) for ``thread_id``: its writes to that thread
        carry the lease's fence; writes to any other thread are refused."""
        return RunkeepSaver(self.client, project=self.project, session=self.session, serde=self.serde, parks=self.parks, _owner=(str(thread_id), lease))

    def claim_thread(self, thread_id: str, *, holder: str | None = None, ttl_ms: int = 30_000) -> HeldRun | None:
        """Claims the thread's run for this process, its lease renewed in the
        background (``None`` when another holder has it live). Bind it with
        :meth:`owned`; end it with ``held.finish()`` or ``held.release()``."""
        import time

        from runkeep import default_holder

        holder = holder or default_holder()
        sent = time.monotonic()
        answer = self.client.claim(self.run_ref(thread_id), holder=holder, ttl_ms=ttl_ms)
        if not answer.acquired or answer.lease is None:
            return None
        return HeldRun(self.client, self.run_ref(thread_id), answer.lease, holder=holder, ttl_ms=ttl_ms, sent_at=sent).start()

    async def aclaim_write_ownership(self, thread_id: str, *, holder: str | None = None, ttl_ms: int = 30_000) -> "RunkeepSaver":
        """The proposed LangGraph capability's claim: takes the thread's
        run (fence above every earlier one, superseding any live owner only
        once its lease lapsed) and answers a saver that writes under it."""
        from runkeep import default_holder

        answer = await asyncio.to_thread(self.client.claim, self.run_ref(thread_id), holder=holder or default_holder(), ttl_ms=ttl_ms)
        if not answer.acquired or answer.lease is None:
            raise RunkeepError({"type": "urn:runkeep:client:held", "title": "Held", "status": 409, "detail": f"thread {thread_id!r} is held live by another owner ({answer.outcome})"})
        return self.owned(thread_id, FixedFence(answer.lease.fence))

    def _write(self, thread_id: str, send: Any) -> Any:
        """Runs ``send(fence)`` with the fence this saver writes ``thread_id`` under."""
        if self._owner is None:
            return send(None)
        owned_thread, lease = self._owner
        if str(thread_id) != owned_thread:
            raise ValueError(f"this saver owns thread {owned_thread!r}, not {thread_id!r}")
        try:
            return lease.fenced(send)
        except FencedOut as e:
            raise StaleWriteOwnerError(owned_thread, e.presented, e.current, e) from e
        except LeaseLost as e:
            raise StaleWriteOwnerError(owned_thread, e.fence, e.current, e) from e
        except Cancelled as e:
            # An operator cancelled the thread's run: this owner is as
            # superseded as one a takeover fenced out, and says why.
            raise StaleWriteOwnerError(owned_thread, lease.fence, None, e) from e

    # -- serialization -------------------------------------------------
    def _dump(self, value: Any) -> tuple[str, str | None]:
        t, data = self.serde.dumps_typed(value)
        return t, _b64(data)

    def _load(self, t: str, data: str | None) -> Any:
        return self.serde.loads_typed((t, _unb64(data)))

    def _tuple(self, body: Mapping[str, Any], thread_id: str | None = None) -> CheckpointTuple:
        thread = thread_id if thread_id is not None else body["thread"]
        ns = body["ns"]
        doc = body["checkpoint"]
        checkpoint: Checkpoint = self._load(doc["serde"]["type"], doc["serde"]["data"])
        checkpoint["channel_values"] = {
            b["channel"]: self._load(b["type"], b["data"]) for b in body["values"] if b["type"] != "empty"
        }
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": body["checkpointId"]}}
        parent = body.get("parentId")
        return CheckpointTuple(
            config=config,
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, body.get("metadata") or {}),
            parent_config=({"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": parent}} if parent else None),
            pending_writes=[(w["taskId"], w["channel"], self._load(w["type"], w["data"])) for w in body["writes"]],
        )

    # -- the saver -----------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        c = config["configurable"]
        thread_id = str(c["thread_id"])
        body = self.client.get_thread_checkpoint(self.run_ref(thread_id), ns=c.get("checkpoint_ns", "") or "", checkpoint_id=get_checkpoint_id(config))
        return None if body is None else self._tuple(body, thread_id)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        before_id = get_checkpoint_id(before) if before else None
        if config is None or config.get("configurable", {}).get("thread_id") is None:
            ns = (config or {}).get("configurable", {}).get("checkpoint_ns")
            bodies = self.client.list_threads_checkpoints(project=self.project, session=self.session, ns=ns, before=before_id, limit=limit, filter=filter)
            for b in bodies:
                yield self._tuple(b)
            return
        c = config["configurable"]
        thread_id = str(c["thread_id"])
        bodies = self.client.list_thread_checkpoints(
            self.run_ref(thread_id),
            ns=c.get("checkpoint_ns"),
            checkpoint_id=get_checkpoint_id(config),
            before=before_id,
            limit=limit,
            filter=filter,
        )
        for b in bodies:
            yield self._tuple(b, thread_id)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        c = config["configurable"]
        thread_id = str(c["thread_id"])
        ns = c.get("checkpoint_ns", "") or ""
        parent = c.get("checkpoint_id")
        rest = checkpoint.copy()
        values = rest.pop("channel_values", {})  # type: ignore[misc]
        blobs = []
        for channel, version in new_versions.items():
            t, data = self._dump(values[channel]) if channel in values else ("empty", None)
            blobs.append({"channel": channel, "version": str(version), "type": t, "data": data})
        t, data = self._dump(rest)
        body = {
            "thread": thread_id,
            "ns": ns,
            "checkpointId": checkpoint["id"],
            "parentId": parent,
            "checkpoint": {
                "channel_versions": {k: (v if isinstance(v, (int, str)) else str(v)) for k, v in checkpoint["channel_versions"].items()},
                "serde": {"type": t, "data": data},
            },
            "metadata": _jsonable(get_serializable_checkpoint_metadata(config, metadata)),
            "blobs": blobs,
        }

        def send(fence: int | None) -> Any:
            return self.client.put_thread_checkpoint(self.run_ref(thread_id), {**body, "fence": fence})

        self._write(thread_id, send)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        c = config["configurable"]
        thread_id = str(c["thread_id"])
        ns = c.get("checkpoint_ns", "") or ""
        checkpoint_id = c["checkpoint_id"]
        items = []
        park = None
        for idx, (channel, value) in enumerate(writes):
            t, data = self._dump(value)
            items.append({"idx": WRITES_IDX_MAP.get(channel, idx), "channel": channel, "type": t, "data": data})
            if channel == INTERRUPT and self.parks:
                park = {"request": self._park_request(thread_id, ns, checkpoint_id, task_id, value)}
        body = {
            "thread": thread_id,
            "ns": ns,
            "checkpointId": checkpoint_id,
            "taskId": task_id,
            "taskPath": task_path,
            "writes": items,
            "park": park,
        }

        def send(fence: int | None) -> Any:
            return self.client.put_thread_writes(self.run_ref(thread_id), {**body, "fence": fence})

        self._write(thread_id, send)

    @staticmethod
    def _park_request(thread_id: str, ns: str, checkpoint_id: str, task_id: str, value: Any) -> dict[str, Any]:
        interrupts = value if isinstance(value, (list, tuple)) else [value]
        return {
            "type": "langgraph-interrupt",
            "thread": thread_id,
            "ns": ns,
            "checkpointId": checkpoint_id,
            "taskId": task_id,
            "interrupts": [
                {"id": getattr(i, "id", None), "value": _jsonable(getattr(i, "value", i))} for i in interrupts
            ],
        }

    def answered_interrupt(self, thread_id: str) -> tuple[bool, Any]:
        """``(True, decision)`` when the thread's latest root checkpoint
        carries a park (from an ``interrupt()``) that was answered (in the
        console, or ``resolve_park``) and the graph has not resumed from it
        yet; else ``(False, None)``. Resume with
        ``graph.invoke(Command(resume=decision), config)``."""
        body = self.client.get_thread_checkpoint(self.run_ref(thread_id), ns="")
        park = (body or {}).get("park")
        if not park or body is None:
            return False, None
        pending = park["pending"]
        if pending.get("resolvedAt") is None or "decision" not in pending:
            return False, None
        if any(w["channel"] == "__resume__" for w in body["writes"]):
            return False, None
        return True, pending["decision"]

    def delete_thread(self, thread_id: str) -> None:
        thread_id = str(thread_id)
        self._write(thread_id, lambda fence: self.client.delete_thread(self.run_ref(thread_id), fence))

    def get_next_version(self, current: str | None, channel: None) -> str:
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- async ---------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)
