"""The saver: :class:`RunkeepSaver`, its write ownership and its errors.

Every operation is built once (the request body, the config it answers,
how the answer parses) and sent by a sync method over
:class:`runkeep.RunkeepClient` or by its ``a``-twin, natively, over
:class:`runkeep.AsyncRunkeepClient`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
import re
import threading
import time
import weakref
import zlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, TypeVar

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
from langgraph.checkpoint.serde.types import INTERRUPT, RESUME
from runkeep import AsyncRunkeepClient, Cancelled, FencedOut, HeldRun, LeaseLost, RunkeepClient, RunkeepError, RunRef, default_holder

from .interrupts import InterruptPark, jsonable, park_request, task_resume

__all__ = [
    "FixedFence",
    "RunkeepSaver",
    "StaleWriteOwnerError",
    "ThreadFinished",
    "WriteLease",
    "thread_run_id",
]

T = TypeVar("T")

#: The task id LangGraph writes graph input and a plain ``Command(resume=v)`` under.
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
#: The most checkpoints one delete request names (the server's limit).
DELETE_BATCH = 10_000
#: How many checkpoints' parks a saver remembers from its reads (see
#: :class:`_ParksRead`).
PARKS_REMEMBERED = 1024

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


class ThreadFinished(RunkeepError):
    """The thread's run is finished (``status``: ``completed``, ``failed``,
    ``cancelled`` …): no claim takes it, and nobody holds it. Not the same
    as "held by another owner" (:meth:`RunkeepSaver.claim_thread` answers
    ``None`` for that). To run the thread again an operator reopens its run
    (``RunkeepClient.reopen(saver.run_ref(thread_id))`` with an operator
    token); or start a new thread id."""

    def __init__(self, thread_id: str, run: RunRef, status: str | None) -> None:
        super().__init__(
            {
                "type": "urn:runkeep:client:thread-finished",
                "title": "Thread finished",
                "status": 409,
                "detail": (
                    f"thread {thread_id!r} is finished ({status or 'finished'}): its run {run.run} takes no claim. "
                    f"Reopen it with an operator token (RunkeepClient.reopen(saver.run_ref({thread_id!r}))), "
                    "or use a new thread id"
                ),
            }
        )
        self.thread_id = thread_id
        self.run = run
        self.run_status = status


class WriteLease(Protocol):
    """What a saver bound with :meth:`RunkeepSaver.owned` writes under:
    ``fenced(write)`` runs ``write(fence)`` with the current fence
    (:class:`runkeep.HeldRun`, :class:`FixedFence`)."""

    @property
    def fence(self) -> int: ...

    def fenced(self, write: Callable[[int], Any], operation: str = ...) -> Any: ...


class FixedFence:
    """Write ownership at one fence, never renewed (the server judges every
    write). :class:`runkeep.HeldRun` is the renewing kind."""

    def __init__(self, fence: int) -> None:
        self.fence = fence

    def fenced(self, write: Callable[[int], T], operation: str = "write") -> T:
        return write(self.fence)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(data: str | None) -> bytes:
    return b"" if data is None else base64.b64decode(data)


#: The type prefix of a value stored deflated (``zlib:msgpack``): values of
#: at least :data:`COMPRESS_FROM` bytes are deflated when that makes them
#: smaller, as PostgreSQL's TOAST does for PostgresSaver's blobs. A chat
#: thread's ``messages`` channel stores its whole list at every version (as
#: every LangGraph saver does); deflated, a 500-turn thread takes about a
#: fifth of the room and of the bytes sent.
ZLIB_PREFIX = "zlib:"
COMPRESS_FROM = 1024


def _pack(t: str, data: bytes) -> tuple[str, bytes]:
    """``(type, bytes)`` as stored: deflated (level 1, fast) when large and
    smaller for it."""
    if len(data) >= COMPRESS_FROM:
        packed = zlib.compress(data, 1)
        if len(packed) < len(data):
            return ZLIB_PREFIX + t, packed
    return t, data


def _unpack(t: str, data: bytes) -> tuple[str, bytes]:
    if t.startswith(ZLIB_PREFIX):
        return t[len(ZLIB_PREFIX) :], zlib.decompress(data)
    return t, data


def _thread_of(config: RunnableConfig) -> str:
    c = config.get("configurable") or {}
    if c.get("thread_id") is None:
        raise ValueError("the config names no thread: configurable.thread_id is required")
    return str(c["thread_id"])


@dataclass
class _Writes:
    """One ``put_writes`` batch, built: ``lookup`` says the resume it
    carries needs the park's interrupts (a task's own ``__resume__``)."""

    thread_id: str
    body: dict[str, Any]
    resume_values: Any = None
    lookup: bool = False
    task_id: str = ""

    def close_park(self, park: InterruptPark | None) -> None:
        close, decision = task_resume(park, self.task_id, self.resume_values)
        if close and park is not None:
            self.body["resume"] = decision
            self.body["resumeOf"] = park.ids


class _ParksRead:
    """The interrupt ids of the park each checkpoint carried when this
    saver last read it (``get_tuple``), keyed by ``(thread, ns,
    checkpoint_id)``; the most recent :data:`PARKS_REMEMBERED`.

    LangGraph reads the checkpoint (``get_tuple``), then writes a
    ``Command(resume=v)``'s ``__resume__`` under the null task: that resume
    answers the interrupts of the park it read. It hands that write and the
    resumed node's next ``__interrupt__`` to its background executor at
    once, so the server may store the next question first; the resume says
    which interrupts it answers (``resumeOf``) and leaves that question
    waiting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[tuple[str, str, str], list[str]] = {}

    def note(self, thread_id: str, body: Mapping[str, Any]) -> None:
        park = InterruptPark.of(thread_id, body)
        key = (thread_id, body["ns"], body["checkpointId"])
        with self._lock:
            self._ids.pop(key, None)
            self._ids[key] = park.ids if park is not None else []
            while len(self._ids) > PARKS_REMEMBERED:
                del self._ids[next(iter(self._ids))]

    def ids(self, thread_id: str, ns: str, checkpoint_id: str) -> list[str] | None:
        with self._lock:
            return self._ids.get((thread_id, ns, checkpoint_id))


@dataclass
class _ThreadCopy:
    """The requests that copy one thread into another, oldest first."""

    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    writes: list[dict[str, Any]] = field(default_factory=list)


class RunkeepSaver(BaseCheckpointSaver[str]):
    """A checkpoint saver keeping each thread in a runkeep run.

    ``client`` is a :class:`runkeep.RunkeepClient` (a worker token to write,
    a reader token to read). Threads live under ``project``/``session``.
    Unbound, the saver writes unfenced (like every other LangGraph saver:
    two writers on one thread fork it). Bound to a lease
    (:meth:`owned`, :meth:`claim_thread`, :meth:`aclaim_write_ownership`),
    every write to that thread carries the lease's fence and a superseded
    owner's write raises :class:`StaleWriteOwnerError`.

    The async methods are native: they send over ``async_client`` (an
    :class:`runkeep.AsyncRunkeepClient`; by default one per event loop,
    made with ``client.to_async()``). Close those with :meth:`aclose`.
    """

    def __init__(
        self,
        client: RunkeepClient,
        *,
        project: str = "langgraph",
        session: str = "threads",
        serde: Any = None,
        parks: bool = True,
        async_client: AsyncRunkeepClient | None = None,
        _owner: tuple[str, WriteLease] | None = None,
        _async_clients: "_AsyncClients | None" = None,
    ) -> None:
        super().__init__(serde=serde)
        self.client = client
        self.project = project
        self.session = session
        self.parks = parks
        self._owner = _owner
        self._async = _async_clients or _AsyncClients(client, async_client)
        self._parks_read = _ParksRead()

    # -- ownership -----------------------------------------------------
    def run_ref(self, thread_id: str) -> RunRef:
        """The runkeep run that keeps ``thread_id``."""
        return RunRef(self.project, self.session, thread_run_id(thread_id))

    def owned(self, thread_id: str, lease: WriteLease) -> "RunkeepSaver":
        """This saver bound to ``lease`` (a :class:`runkeep.HeldRun` or a
        :class:`FixedFence`) for ``thread_id``: its writes to that thread
        carry the lease's fence; writes to any other thread are refused."""
        return RunkeepSaver(
            self.client,
            project=self.project,
            session=self.session,
            serde=self.serde,
            parks=self.parks,
            _owner=(str(thread_id), lease),
            _async_clients=self._async,
        )

    def claim_thread(self, thread_id: str, *, holder: str | None = None, ttl_ms: int = 30_000) -> HeldRun | None:
        """Claims the thread's run for this process, its lease renewed in the
        background. Answers ``None`` when another owner holds it live (or
        the run is deferred until later); raises :class:`ThreadFinished`
        when the thread's run is finished (nobody holds it: it must be
        reopened). Bind the holding with :meth:`owned`; end it with
        ``held.release()`` when the graph stopped at an interrupt (the
        thread waits on its park) and ``held.finish()`` when the graph
        ended."""
        holder = holder or default_holder()
        run = self.run_ref(thread_id)
        sent = time.monotonic()
        answer = self.client.claim(run, holder=holder, ttl_ms=ttl_ms)
        if answer.outcome == "finished":
            raise ThreadFinished(str(thread_id), run, answer.status)
        if not answer.acquired or answer.lease is None:
            return None
        return HeldRun(self.client, run, answer.lease, holder=holder, ttl_ms=ttl_ms, sent_at=sent).start()

    async def aclaim_write_ownership(self, thread_id: str, *, holder: str | None = None, ttl_ms: int = 30_000) -> "RunkeepSaver":
        """The proposed LangGraph capability's claim: takes the thread's
        run (fence above every earlier one, superseding any live owner only
        once its lease lapsed) and answers a saver that writes under it.
        Raises :class:`ThreadFinished` for a finished thread, and a
        ``RunkeepError`` (``urn:runkeep:client:held``) while another owner
        holds it live."""
        run = self.run_ref(thread_id)
        answer = await self._async.get().claim(run, holder=holder or default_holder(), ttl_ms=ttl_ms)
        if answer.outcome == "finished":
            raise ThreadFinished(str(thread_id), run, answer.status)
        if not answer.acquired or answer.lease is None:
            raise RunkeepError({"type": "urn:runkeep:client:held", "title": "Held", "status": 409, "detail": f"thread {thread_id!r} is held live by another owner ({answer.outcome})"})
        return self.owned(thread_id, FixedFence(answer.lease.fence))

    def _lease_for(self, thread_id: str) -> WriteLease | None:
        if self._owner is None:
            return None
        owned_thread, lease = self._owner
        if str(thread_id) != owned_thread:
            raise ValueError(f"this saver owns thread {owned_thread!r}, not {thread_id!r}")
        return lease

    def _stale(self, lease: WriteLease, e: Exception) -> StaleWriteOwnerError:
        owned_thread = self._owner[0] if self._owner else ""
        if isinstance(e, FencedOut):
            return StaleWriteOwnerError(owned_thread, e.presented, e.current, e)
        if isinstance(e, LeaseLost):
            return StaleWriteOwnerError(owned_thread, e.fence, e.current, e)
        # An operator cancelled the thread's run: this owner is as
        # superseded as one a takeover fenced out, and says why.
        return StaleWriteOwnerError(owned_thread, lease.fence, None, e)

    def _write(self, thread_id: str, send: Callable[[int | None], T]) -> T:
        """Runs ``send(fence)`` with the fence this saver writes ``thread_id`` under."""
        lease = self._lease_for(thread_id)
        if lease is None:
            return send(None)
        try:
            return lease.fenced(send)  # type: ignore[no-any-return]
        except (FencedOut, LeaseLost, Cancelled) as e:
            raise self._stale(lease, e) from e

    async def _awrite(self, thread_id: str, send: Callable[[int | None], Awaitable[T]]) -> T:
        """Async twin of :meth:`_write`. A :class:`FixedFence` is sent as
        is; a :class:`runkeep.HeldRun` is checked, its current fence
        presented, and a refusal that a renewal of this very holding
        caused (the renewal minted the fence the server now knows) retried
        at the new fence; any other refusal marks the holding lost and
        raises :class:`StaleWriteOwnerError`."""
        lease = self._lease_for(thread_id)
        if lease is None:
            return await send(None)
        if not isinstance(lease, HeldRun):
            try:
                return await send(lease.fence)
            except (FencedOut, Cancelled) as e:
                raise self._stale(lease, e) from e
        while True:
            try:
                lease.check()
                fence = lease.fence
                return await send(fence)
            except LeaseLost as e:
                raise self._stale(lease, e) from e
            except Cancelled as e:
                lease.stop_step("cancelled", str(e))
                raise self._stale(lease, e) from e
            except FencedOut as e:
                if await _renewed_past(lease, fence, e.current):
                    continue
                lease.stop_step("fenced-out", str(e))
                raise self._stale(lease, e) from e

    # -- serialization -------------------------------------------------
    def _dump(self, value: Any) -> tuple[str, str | None]:
        t, data = self.serde.dumps_typed(value)
        if data is None:
            return t, None
        t, data = _pack(t, data)
        return t, _b64(data)

    def _load(self, t: str, data: str | None) -> Any:
        return self.serde.loads_typed(_unpack(t, _unb64(data)))

    def _read_tuple(self, body: Mapping[str, Any], thread_id: str) -> CheckpointTuple:
        """``get_tuple``'s answer, the park it carries remembered for the
        ``Command(resume=…)`` that may follow (:class:`_ParksRead`)."""
        if self.parks:
            self._parks_read.note(thread_id, body)
        return self._tuple(body, thread_id)

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
            metadata=body.get("metadata") or {},  # type: ignore[arg-type]
            parent_config=({"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": parent}} if parent else None),
            pending_writes=[(w["taskId"], w["channel"], self._load(w["type"], w["data"])) for w in body["writes"]],
        )

    # -- requests, built once for both transports ------------------------
    def _get_args(self, config: RunnableConfig) -> tuple[str, dict[str, Any]]:
        c = config["configurable"]
        thread_id = _thread_of(config)
        return thread_id, {"ns": c.get("checkpoint_ns", "") or "", "checkpoint_id": get_checkpoint_id(config)}

    def _list_args(
        self, config: RunnableConfig | None, filter: dict[str, Any] | None, before: RunnableConfig | None, limit: int | None
    ) -> tuple[str | None, dict[str, Any]]:
        """``(thread_id, keyword arguments)`` of the listing: one thread's
        (``list_thread_checkpoints``) or, with no thread, the session's
        (``list_threads_checkpoints``)."""
        before_id = get_checkpoint_id(before) if before else None
        c = (config or {}).get("configurable", {}) or {}
        if c.get("thread_id") is None:
            return None, {"project": self.project, "session": self.session, "ns": c.get("checkpoint_ns"), "before": before_id, "limit": limit, "filter": filter}
        assert config is not None
        return str(c["thread_id"]), {"ns": c.get("checkpoint_ns"), "checkpoint_id": get_checkpoint_id(config), "before": before_id, "limit": limit, "filter": filter}

    def _put_body(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions) -> tuple[str, dict[str, Any], RunnableConfig]:
        c = config["configurable"]
        thread_id = _thread_of(config)
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
            "metadata": jsonable(get_serializable_checkpoint_metadata(config, metadata)),
            "blobs": blobs,
        }
        answer: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}
        return thread_id, body, answer

    def _writes_body(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str) -> _Writes:
        c = config["configurable"]
        thread_id = _thread_of(config)
        ns = c.get("checkpoint_ns", "") or ""
        checkpoint_id = c["checkpoint_id"]
        items = []
        park = None
        plan = _Writes(thread_id, {}, task_id=task_id)
        resume: list[Any] = []
        for idx, (channel, value) in enumerate(writes):
            t, data = self._dump(value)
            items.append({"idx": WRITES_IDX_MAP.get(channel, idx), "channel": channel, "type": t, "data": data})
            if channel == INTERRUPT and self.parks:
                park = {"request": park_request(thread_id, ns, checkpoint_id, task_id, value)}
            elif channel == RESUME and self.parks:
                resume.append(value)
        plan.body = {
            "thread": thread_id,
            "ns": ns,
            "checkpointId": checkpoint_id,
            "taskId": task_id,
            "taskPath": task_path,
            "writes": items,
            "park": park,
        }
        if resume:
            if task_id == NULL_TASK_ID:
                # A plain Command(resume=v): closes the park with v at once,
                # answering the interrupts of the park LangGraph read.
                plan.body["resume"] = jsonable(resume[-1])
                ids = self._parks_read.ids(thread_id, ns, checkpoint_id)
                if ids is not None:
                    plan.body["resumeOf"] = ids
            else:
                # A task's own answers: the park says which interrupts they are.
                plan.resume_values = resume[-1]
                plan.lookup = True
        return plan

    @staticmethod
    def _copy_plan(source: Sequence[Mapping[str, Any]], target_thread: str) -> _ThreadCopy:
        """The writes that copy ``source`` (a thread's checkpoint bodies, as
        listed) into ``target_thread``: each checkpoint oldest first with
        the blobs not sent before for its namespace (each value stored
        once, as the source keeps it), then its pending writes per task
        (ids, indices and serde bytes as stored), with an unanswered park
        sent again (the copy waits on the same interrupts)."""
        plan = _ThreadCopy()
        sent: set[tuple[str, str, str]] = set()
        for b in sorted(source, key=lambda b: (b["ns"], b["checkpointId"])):
            ns = b["ns"]
            blobs = []
            for v in b["values"]:
                key = (ns, v["channel"], v["version"])
                if key not in sent:
                    sent.add(key)
                    blobs.append({"channel": v["channel"], "version": v["version"], "type": v["type"], "data": v.get("data")})
            plan.checkpoints.append(
                {
                    "thread": target_thread,
                    "ns": ns,
                    "checkpointId": b["checkpointId"],
                    "parentId": b.get("parentId"),
                    "checkpoint": b["checkpoint"],
                    "metadata": b.get("metadata") or {},
                    "blobs": blobs,
                }
            )
            by_task: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for w in b["writes"]:
                by_task.setdefault((w["taskId"], w.get("taskPath", "")), []).append(
                    {"idx": w["idx"], "channel": w["channel"], "type": w["type"], "data": w.get("data")}
                )
            park = b.get("park")
            request = None
            if park and park["pending"].get("resolvedAt") is None:
                request = dict(park["pending"]["request"])
                if "thread" in request:
                    request["thread"] = target_thread
            for (task_id, task_path), items in by_task.items():
                body: dict[str, Any] = {
                    "thread": target_thread,
                    "ns": ns,
                    "checkpointId": b["checkpointId"],
                    "taskId": task_id,
                    "taskPath": task_path,
                    "writes": items,
                }
                if request is not None and any(i["channel"] == INTERRUPT for i in items):
                    body["park"] = {"request": request}
                    request = None
                plan.writes.append(body)
        return plan

    @staticmethod
    def _keep_latest_plan(bodies: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        """For ``prune(keep_latest)`` of one thread: the latest checkpoint
        of each namespace put again carrying every value it reads (its
        blobs may live in the records pruned), and the checkpoints to
        delete."""
        latest: dict[str, Mapping[str, Any]] = {}
        for b in bodies:
            if b["ns"] not in latest or b["checkpointId"] > latest[b["ns"]]["checkpointId"]:
                latest[b["ns"]] = b
        doomed = [{"ns": b["ns"], "checkpointId": b["checkpointId"]} for b in bodies if latest[b["ns"]] is not b]
        keep_ns = {d["ns"] for d in doomed}
        reput = [
            {
                "thread": b["thread"],
                "ns": b["ns"],
                "checkpointId": b["checkpointId"],
                "parentId": b.get("parentId"),
                "checkpoint": b["checkpoint"],
                "metadata": b.get("metadata") or {},
                "blobs": [{"channel": v["channel"], "version": v["version"], "type": v["type"], "data": v.get("data")} for v in b["values"]],
            }
            for ns, b in latest.items()
            if ns in keep_ns
        ]
        return reput, doomed

    def _runs_of(self, bodies: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, list[dict[str, str]]]]:
        """The checkpoints of ``bodies`` per runkeep run: ``run -> (thread, refs)``.
        Refused (``ValueError``, nothing deleted) when a bound saver would
        touch a thread it does not own."""
        runs: dict[str, tuple[str, list[dict[str, str]]]] = {}
        for b in bodies:
            thread = str(b["thread"])
            self._lease_for(thread)
            runs.setdefault(b["run"], (thread, []))[1].append({"ns": b["ns"], "checkpointId": b["checkpointId"]})
        return runs

    # -- the saver -----------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, args = self._get_args(config)
        body = self.client.get_thread_checkpoint(self.run_ref(thread_id), **args)
        return None if body is None else self._read_tuple(body, thread_id)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        thread_id, args = self._list_args(config, filter, before, limit)
        if thread_id is None:
            for b in self.client.list_threads_checkpoints(**args):
                yield self._tuple(b)
            return
        for b in self.client.list_thread_checkpoints(self.run_ref(thread_id), **args):
            yield self._tuple(b, thread_id)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        thread_id, body, answer = self._put_body(config, checkpoint, metadata, new_versions)
        run = self.run_ref(thread_id)
        self._write(thread_id, lambda fence: self.client.put_thread_checkpoint(run, {**body, "fence": fence}))
        return answer

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        plan = self._writes_body(config, writes, task_id, task_path)
        run = self.run_ref(plan.thread_id)
        if plan.lookup:
            plan.close_park(self._park_at(plan.thread_id, plan.body["ns"], plan.body["checkpointId"]))
        self._write(plan.thread_id, lambda fence: self.client.put_thread_writes(run, {**plan.body, "fence": fence}))

    def delete_thread(self, thread_id: str) -> None:
        thread_id = str(thread_id)
        run = self.run_ref(thread_id)
        self._write(thread_id, lambda fence: self.client.delete_thread(run, fence))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies every checkpoint of ``source_thread_id`` (every namespace,
        values, metadata, pending writes, an unanswered park) into
        ``target_thread_id`` under the same ids. Refused (``ValueError``,
        nothing written) when the source has no checkpoints or the target
        has some."""
        source, target = str(source_thread_id), str(target_thread_id)
        self._lease_for(target)
        bodies = self.client.list_thread_checkpoints(self.run_ref(source))
        self._check_copy(source, target, bodies, self.client.list_thread_checkpoints(self.run_ref(target), limit=1))
        plan = self._copy_plan(bodies, target)
        run = self.run_ref(target)
        for cp in plan.checkpoints:
            self._write(target, lambda fence: self.client.put_thread_checkpoint(run, {**cp, "fence": fence}))
        for w in plan.writes:
            self._write(target, lambda fence: self.client.put_thread_writes(run, {**w, "fence": fence}))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Deletes, across the threads of this saver's session, every
        checkpoint (and its pending writes) whose metadata ``run_id`` is one
        of ``run_ids``. A bound saver refuses (``ValueError``, nothing
        deleted) when one of them is in a thread it does not own."""
        found: list[Mapping[str, Any]] = []
        for rid in dict.fromkeys(str(r) for r in run_ids):
            found.extend(self.client.list_threads_checkpoints(project=self.project, session=self.session, filter={"run_id": rid}))
        for run_id, (thread, refs) in self._runs_of(found).items():
            self._delete_checkpoints(thread, RunRef(self.project, self.session, run_id), refs)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keeps only the latest checkpoint of each
        namespace (with its pending writes; it is put again carrying every
        value it reads first, so none is lost with the records pruned);
        ``delete``: deletes the threads. Any other strategy is refused
        (``ValueError``) before anything is deleted."""
        threads = _prune_threads(thread_ids, strategy)
        for t in threads:
            self._lease_for(t)
        for t in threads:
            if strategy == "delete":
                self.delete_thread(t)
                continue
            run = self.run_ref(t)
            reput, doomed = self._keep_latest_plan(self.client.list_thread_checkpoints(run))
            for cp in reput:
                self._write(t, lambda fence: self.client.put_thread_checkpoint(run, {**cp, "fence": fence}))
            self._delete_checkpoints(t, run, doomed)

    def _delete_checkpoints(self, thread: str, run: RunRef, refs: Sequence[dict[str, str]]) -> None:
        for i in range(0, len(refs), DELETE_BATCH):
            chunk = list(refs[i : i + DELETE_BATCH])
            self._write(thread, lambda fence: self.client.delete_thread_checkpoints(run, chunk, fence))

    @staticmethod
    def _check_copy(source: str, target: str, bodies: Sequence[Any], in_target: Sequence[Any]) -> None:
        if not bodies:
            raise ValueError(f"copy_thread: source thread {source!r} has no checkpoints")
        if in_target:
            raise ValueError(f"copy_thread: target thread {target!r} already has checkpoints; delete it first or copy to a new thread id")

    # -- interrupts ----------------------------------------------------
    def _park_at(self, thread_id: str, ns: str, checkpoint_id: str | None) -> InterruptPark | None:
        body = self.client.get_thread_checkpoint(self.run_ref(thread_id), ns=ns, checkpoint_id=checkpoint_id)
        return None if body is None else InterruptPark.of(thread_id, body)

    def interrupt_park(self, thread_id: str) -> InterruptPark | None:
        """The park on the thread's latest root checkpoint (the interrupts
        the graph waits on, their ids, and the answer once given); ``None``
        when that checkpoint carries none (the graph is not waiting on an
        interrupt)."""
        return self._park_at(str(thread_id), "", None)

    def answered_interrupt(self, thread_id: str) -> tuple[bool, Any]:
        """``(True, resume)`` when the thread's latest root checkpoint
        carries a park (from ``interrupt()``) that was answered (in the
        console, ``resolve_park``, or by a ``Command(resume=…)``);
        ``resume`` is what to resume with: ``graph.invoke(Command(resume=
        resume), config)``. ``(False, None)`` otherwise. Raises
        :class:`~langgraph.checkpoint.runkeep.interrupts.InterruptAnswerError`
        when the answer to several interrupts is not an object keyed by
        every one of their ids."""
        park = self.interrupt_park(thread_id)
        if park is None or not park.answered:
            return False, None
        return True, park.resume_value()

    def get_next_version(self, current: str | None, channel: None) -> str:
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- async: the same requests over the async client ------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, args = self._get_args(config)
        body = await self._async.get().get_thread_checkpoint(self.run_ref(thread_id), **args)
        return None if body is None else self._read_tuple(body, thread_id)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        thread_id, args = self._list_args(config, filter, before, limit)
        client = self._async.get()
        if thread_id is None:
            for b in await client.list_threads_checkpoints(**args):
                yield self._tuple(b)
            return
        for b in await client.list_thread_checkpoints(self.run_ref(thread_id), **args):
            yield self._tuple(b, thread_id)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        thread_id, body, answer = self._put_body(config, checkpoint, metadata, new_versions)
        run, client = self.run_ref(thread_id), self._async.get()
        await self._awrite(thread_id, lambda fence: client.put_thread_checkpoint(run, {**body, "fence": fence}))
        return answer

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        plan = self._writes_body(config, writes, task_id, task_path)
        run, client = self.run_ref(plan.thread_id), self._async.get()
        if plan.lookup:
            plan.close_park(await self._apark_at(plan.thread_id, plan.body["ns"], plan.body["checkpointId"]))
        await self._awrite(plan.thread_id, lambda fence: client.put_thread_writes(run, {**plan.body, "fence": fence}))

    async def adelete_thread(self, thread_id: str) -> None:
        thread_id = str(thread_id)
        run, client = self.run_ref(thread_id), self._async.get()
        await self._awrite(thread_id, lambda fence: client.delete_thread(run, fence))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async twin of :meth:`copy_thread`."""
        source, target = str(source_thread_id), str(target_thread_id)
        self._lease_for(target)
        client = self._async.get()
        bodies = await client.list_thread_checkpoints(self.run_ref(source))
        self._check_copy(source, target, bodies, await client.list_thread_checkpoints(self.run_ref(target), limit=1))
        plan = self._copy_plan(bodies, target)
        run = self.run_ref(target)
        for cp in plan.checkpoints:
            await self._awrite(target, lambda fence: client.put_thread_checkpoint(run, {**cp, "fence": fence}))
        for w in plan.writes:
            await self._awrite(target, lambda fence: client.put_thread_writes(run, {**w, "fence": fence}))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async twin of :meth:`delete_for_runs`."""
        client = self._async.get()
        found: list[Mapping[str, Any]] = []
        for rid in dict.fromkeys(str(r) for r in run_ids):
            found.extend(await client.list_threads_checkpoints(project=self.project, session=self.session, filter={"run_id": rid}))
        for run_id, (thread, refs) in self._runs_of(found).items():
            await self._adelete_checkpoints(thread, RunRef(self.project, self.session, run_id), refs)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async twin of :meth:`prune`."""
        threads = _prune_threads(thread_ids, strategy)
        for t in threads:
            self._lease_for(t)
        client = self._async.get()
        for t in threads:
            if strategy == "delete":
                await self.adelete_thread(t)
                continue
            run = self.run_ref(t)
            reput, doomed = self._keep_latest_plan(await client.list_thread_checkpoints(run))
            for cp in reput:
                await self._awrite(t, lambda fence: client.put_thread_checkpoint(run, {**cp, "fence": fence}))
            await self._adelete_checkpoints(t, run, doomed)

    async def _adelete_checkpoints(self, thread: str, run: RunRef, refs: Sequence[dict[str, str]]) -> None:
        client = self._async.get()
        for i in range(0, len(refs), DELETE_BATCH):
            chunk = list(refs[i : i + DELETE_BATCH])
            await self._awrite(thread, lambda fence: client.delete_thread_checkpoints(run, chunk, fence))

    async def _apark_at(self, thread_id: str, ns: str, checkpoint_id: str | None) -> InterruptPark | None:
        body = await self._async.get().get_thread_checkpoint(self.run_ref(thread_id), ns=ns, checkpoint_id=checkpoint_id)
        return None if body is None else InterruptPark.of(thread_id, body)

    async def ainterrupt_park(self, thread_id: str) -> InterruptPark | None:
        """Async twin of :meth:`interrupt_park`."""
        return await self._apark_at(str(thread_id), "", None)

    async def aclose(self) -> None:
        """Closes the async client this saver made for the running event
        loop (one given as ``async_client`` is the caller's to close)."""
        await self._async.aclose()


def _prune_threads(thread_ids: Sequence[str], strategy: str) -> list[str]:
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"prune: unknown strategy {strategy!r}; use 'keep_latest' or 'delete'")
    if isinstance(thread_ids, str):
        raise ValueError("prune: thread_ids is a sequence of thread ids, not one string")
    return list(dict.fromkeys(str(t) for t in thread_ids))


async def _renewed_past(held: HeldRun, presented: int, current: int | None, wait_s: float = 2.0) -> bool:
    """True when a write at ``presented`` was refused only because this
    very holding renewed meanwhile: ``held`` adopts a fence above
    ``presented`` (at least the server's ``current``) without being lost.
    Waits up to ``wait_s`` for the renewal's answer to arrive."""
    deadline = time.monotonic() + wait_s
    while not held.lost.is_set():
        if held.fence > presented and (current is None or held.fence >= current):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return False


class _AsyncClients:
    """The async client per event loop (an httpx async client belongs to
    the loop it first ran on), or the one the caller gave."""

    def __init__(self, client: RunkeepClient, given: AsyncRunkeepClient | None) -> None:
        self._client = client
        self._given = given
        self._lock = threading.Lock()
        self._per_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRunkeepClient]" = weakref.WeakKeyDictionary()

    def get(self) -> AsyncRunkeepClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        with self._lock:
            c = self._per_loop.get(loop)
            if c is None:
                c = self._per_loop[loop] = self._client.to_async()
            return c

    async def aclose(self) -> None:
        if self._given is not None:
            return
        with self._lock:
            c = self._per_loop.pop(asyncio.get_running_loop(), None)
        if c is not None:
            await c.aclose()

