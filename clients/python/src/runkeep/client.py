"""The HTTP API's client, sync (:class:`RunkeepClient`) and async
(:class:`AsyncRunkeepClient`), over httpx.

Every API method is described once, on :class:`_Api`: an
:class:`_Operation` builds its :class:`_Request` (method and path from
:data:`OPERATIONS`, query, body, how the answer parses). Read on the sync
client it is a method answering the parsed value; on the async one, a
coroutine method with the same name and parameters. Every refusal raises
the typed error of its problem (:mod:`runkeep.errors`).
"""

from __future__ import annotations

import functools
import json
import re
import types
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Concatenate, Coroutine, Generic, Iterator, Mapping, ParamSpec, Sequence, TypeVar, overload
from urllib.parse import quote

import httpx

from .errors import ConnectionFailed, RunkeepError, parse_retry_after, problem_error

T = TypeVar("T")
P = ParamSpec("P")
Json = Any


@dataclass(frozen=True)
class RunRef:
    """A run's address within the client's tenant."""

    project: str
    session: str
    run: str
    parent: str | None = None


@dataclass(frozen=True)
class Lease:
    """A holding: the run is yours at ``fence`` until ``expires_at`` (epoch ms)."""

    holder: str
    fence: int
    expires_at: int
    #: The run's own attempt timeout, ms (set on enqueue); ``None``: none.
    attempt_timeout_ms: int | None = None

    @staticmethod
    def of(body: Mapping[str, Any]) -> "Lease":
        timeout = body.get("attemptTimeoutMs")
        return Lease(
            holder=body["holder"],
            fence=int(body["fence"]),
            expires_at=int(body["expiresAt"]),
            attempt_timeout_ms=int(timeout) if timeout is not None else None,
        )


@dataclass(frozen=True)
class ClaimAnswer:
    """What a claim answered: ``outcome`` is ``acquired`` (``lease`` set),
    ``held`` (``held_by``: the holder's summary), ``finished`` (``status``),
    ``notBefore`` (``available_at``) or ``atLimit`` (the run's concurrency
    ``key`` is at its ``limit``: ``held`` other runs of it are held live;
    nothing changed)."""

    outcome: str
    lease: Lease | None = None
    held_by: dict[str, Any] | None = None
    status: str | None = None
    available_at: int | None = None
    key: str | None = None
    limit: int | None = None
    held: int | None = None

    @property
    def acquired(self) -> bool:
        return self.outcome == "acquired"

    @staticmethod
    def of(body: Mapping[str, Any]) -> "ClaimAnswer":
        o = body["outcome"]
        if o == "acquired":
            return ClaimAnswer(o, lease=Lease.of(body["lease"]))
        if o == "held":
            return ClaimAnswer(o, held_by=body.get("lease"))
        if o == "finished":
            return ClaimAnswer(o, status=body.get("status"))
        if o == "atLimit":
            return ClaimAnswer(o, key=body.get("key"), limit=body.get("limit"), held=body.get("held"))
        return ClaimAnswer(o, available_at=body.get("availableAt"))


@dataclass(frozen=True)
class Enqueued:
    """What an enqueue with an idempotency key answered: the run (the one
    asked for when ``created``, else the one the key's window belongs to;
    nothing changed then) and its checkpoint."""

    created: bool
    run: RunRef
    checkpoint: dict[str, Any] | None

    @staticmethod
    def of(body: Mapping[str, Any]) -> "Enqueued":
        r = body["run"]
        return Enqueued(
            created=bool(body["created"]),
            run=RunRef(r["projectId"], r["sessionId"], r["runId"], r.get("parentRunId")),
            checkpoint=body.get("checkpoint"),
        )


@dataclass(frozen=True)
class Claimed:
    """A run ``claim_next`` took, and its lease."""

    run: RunRef
    lease: Lease

    @staticmethod
    def of(body: Mapping[str, Any] | None) -> "Claimed | None":
        """A ``{run, lease}`` answer member; ``None`` for null."""
        if not body:
            return None
        r = body["run"]
        ref = RunRef(r["projectId"], r["sessionId"], r["runId"], r.get("parentRunId"))
        return Claimed(ref, Lease.of(body["lease"]))


@dataclass(frozen=True)
class StepOutcome:
    """One step's outcome in a group commit (:meth:`commit_steps`): its
    ``receipt`` (as ``commit_step`` answers it) when it committed, else the
    typed ``error`` it was refused with (nothing of it was written)."""

    receipt: dict[str, Any] | None = None
    error: RunkeepError | None = None

    @staticmethod
    def of(body: Mapping[str, Any], *, method: str | None = None, path: str | None = None) -> "StepOutcome":
        problem = body.get("problem")
        if problem:
            return StepOutcome(error=problem_error(problem, method=method, path=path))
        return StepOutcome(receipt=body["receipt"])


@dataclass(frozen=True)
class HandOver:
    """What :meth:`commit_step_and_claim_next` did: the step committed
    (``receipt``, as ``commit_step`` answers it) and the run taken next.

    ``next`` is ``None`` when no run was claimable, or when the claim failed
    after the step committed: then ``next_error`` is the claim's typed error
    (the same :class:`RunkeepError` subclass a ``claim_next`` refusal
    raises); the step stands, nothing was claimed, and ``claim_next`` may
    be retried."""

    receipt: dict[str, Any]
    next: Claimed | None = None
    next_error: RunkeepError | None = None

    @staticmethod
    def of(body: Mapping[str, Any], *, method: str | None = None, path: str | None = None) -> "HandOver":
        problem = body.get("nextError")
        return HandOver(
            receipt=body["receipt"],
            next=Claimed.of(body.get("next")),
            next_error=problem_error(problem, method=method, path=path) if problem else None,
        )


#: The longest failed-attempt message the server keeps, in characters
#: (it refuses longer text; :func:`cut_text` cuts it first).
MAX_ERROR_MESSAGE_CHARS = 4096
#: The longest failed-attempt kind, in characters.
MAX_ERROR_KIND_CHARS = 128


def cut_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with a marker saying how many
    were cut (the marker counts within the limit), as every runtime cuts
    an error it reports. Text within the limit is answered unchanged."""
    n = len(text)
    if n <= limit:
        return text
    marker = f" … [{n - limit} more characters cut]"
    return text[: max(0, limit - len(marker))] + marker


@dataclass(frozen=True)
class RetryPolicy:
    """How a run is retried after a failed attempt, set on enqueue: the
    first delay ``base_ms``, growing by ``factor`` per attempt, at most
    ``cap_ms``, with equal jitter (the store computes it). The server's
    defaults: 1 000 ms, ×2, 600 000 ms (10 min)."""

    base_ms: int
    factor: float = 2.0
    cap_ms: int = 600_000

    def body(self) -> dict[str, Any]:
        return {"baseMs": self.base_ms, "factor": self.factor, "capMs": self.cap_ms}

    @staticmethod
    def of(body: Mapping[str, Any] | None) -> "RetryPolicy | None":
        if not body:
            return None
        return RetryPolicy(base_ms=int(body["baseMs"]), factor=float(body["factor"]), cap_ms=int(body["capMs"]))


@dataclass(frozen=True)
class FailedAttempt:
    """One failed attempt of a run, as the store keeps it: the attempt
    count it brought the run to, the fence that failed, when (epoch ms,
    store clock), the error's ``kind`` and ``message``, and ``retry_at``
    (epoch ms; ``None`` when this failure dead-lettered the run)."""

    attempt: int
    fence: int
    at: int
    kind: str
    message: str
    retry_at: int | None = None

    @staticmethod
    def of(body: Mapping[str, Any]) -> "FailedAttempt":
        return FailedAttempt(
            attempt=int(body["attempt"]),
            fence=int(body["fence"]),
            at=int(body["at"]),
            kind=str(body["kind"]),
            message=str(body["message"]),
            retry_at=body.get("retryAt"),
        )


class Lifecycle(dict[str, Any]):
    """A run's lifecycle as the server answers it (``status``,
    ``attempts``, ``reason``, ``availableAt``, ``deadLettered`` …): the
    JSON object itself, so ``life["status"]`` reads as before, with
    ``failures`` (a list, empty when none; the newest 20, oldest first)
    and ``retry`` (the run's own policy, or ``None``) always present, and
    typed views of them."""

    @staticmethod
    def of(body: Mapping[str, Any]) -> "Lifecycle":
        life = Lifecycle(body)
        life.setdefault("failures", [])
        life.setdefault("retry", None)
        return life

    @property
    def status(self) -> str:
        return str(self["status"])

    @property
    def attempts(self) -> int:
        return int(self.get("attempts") or 0)

    @property
    def reason(self) -> str | None:
        return self.get("reason")

    @property
    def dead_lettered(self) -> bool:
        return self.get("deadLettered") is True

    @property
    def failures(self) -> list[FailedAttempt]:
        return [FailedAttempt.of(f) for f in self.get("failures") or []]

    @property
    def retry(self) -> RetryPolicy | None:
        return RetryPolicy.of(self.get("retry"))

    @property
    def priority(self) -> int:
        """The run's priority (0 when the answer leaves it out)."""
        return int(self.get("priority") or 0)

    @property
    def concurrency(self) -> dict[str, Any] | None:
        """The run's concurrency ``{"key", "limit"}``, or ``None``."""
        return self.get("concurrency")


def _retry_body(retry: "RetryPolicy | Mapping[str, Any] | None") -> dict[str, Any] | None:
    if retry is None:
        return None
    if isinstance(retry, RetryPolicy):
        return retry.body()
    return dict(retry)


def _enqueue_body(
    checkpoint: Mapping[str, Any],
    available_at: int | None,
    max_attempts: int | None,
    retry: "RetryPolicy | Mapping[str, Any] | None",
    attempt_timeout_ms: int | None,
    deadline: int | None,
    priority: int | None,
    concurrency_key: str | None,
    concurrency_limit: int | None,
    retention_ms: int | None,
) -> dict[str, Any]:
    concurrency = None
    if concurrency_key is not None:
        concurrency = {"key": concurrency_key, "limit": 1 if concurrency_limit is None else concurrency_limit}
    elif concurrency_limit is not None:
        raise ValueError("concurrency_limit needs a concurrency_key")
    return _drop_none(
        {
            "checkpoint": dict(checkpoint),
            "availableAt": available_at,
            "maxAttempts": max_attempts,
            "retry": _retry_body(retry),
            "attemptTimeoutMs": attempt_timeout_ms,
            "deadline": deadline,
            "priority": priority,
            "concurrency": concurrency,
            "retentionMs": retention_ms,
        }
    )


#: The per-run path prefix ``{run}`` stands for in :data:`OPERATIONS`.
RUN_PATH = "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/runs/{run}"

#: Every operation this client calls, by its name in the API's operation
#: table (its OpenAPI ``operationId``): method and path template
#: (``{run}…`` for :data:`RUN_PATH` followed by the rest). The one place the
#: client spells a method or a path: every request names its operation and
#: takes both from here (:meth:`_Api._path`). ``tests/test_operations.py``
#: checks each entry against ``crates/runkeep-http/operations.json``, the
#: table the server is built from.
OPERATIONS: dict[str, tuple[str, str]] = {
    "clock": ("GET", "/v1/clock"),
    "whoami": ("GET", "/v1/whoami"),
    "list_runs": ("GET", "/v1/tenants/{tenant}/runs"),
    "claim_next": ("POST", "/v1/tenants/{tenant}/claim-next"),
    "claim_next_batch": ("POST", "/v1/tenants/{tenant}/claim-next-batch"),
    "run_summary": ("GET", "{run}"),
    "claim": ("POST", "{run}/claim"),
    "release": ("POST", "{run}/release"),
    "finish": ("POST", "{run}/finish"),
    "snooze": ("POST", "{run}/snooze"),
    "fail_attempt": ("POST", "{run}/attempts/failed"),
    "cancel": ("POST", "{run}/cancel"),
    "enqueue": ("POST", "{run}/enqueue"),
    "reopen": ("POST", "{run}/reopen"),
    "set_priority": ("POST", "{run}/priority"),
    "key_holdings": ("GET", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/key-holdings"),
    "lease": ("GET", "{run}/lease"),
    "lifecycle": ("GET", "{run}/lifecycle"),
    "commit_step": ("POST", "{run}/steps"),
    "commit_step_and_claim_next": ("POST", "{run}/steps/hand-over"),
    "commit_steps": ("POST", "/v1/tenants/{tenant}/steps"),
    "write_checkpoint": ("POST", "{run}/checkpoints"),
    "list_checkpoints": ("GET", "{run}/checkpoints"),
    "read_checkpoint": ("GET", "{run}/checkpoints/by-id/{checkpoint}"),
    "delete_checkpoint": ("DELETE", "{run}/checkpoints/by-id/{checkpoint}"),
    "latest_checkpoint": ("GET", "{run}/checkpoints/latest"),
    "find_pending": ("GET", "{run}/checkpoints/pending"),
    "resume_point": ("GET", "{run}/checkpoints/resume-point"),
    "resolve_park": ("POST", "{run}/checkpoints/by-id/{checkpoint}/answer"),
    "append_events": ("POST", "{run}/events"),
    "read_events": ("GET", "{run}/events"),
    "tail_events": ("GET", "{run}/events/stream"),
    "put_thread_checkpoint": ("PUT", "{run}/thread/checkpoints"),
    "put_thread_writes": ("POST", "{run}/thread/writes"),
    "get_thread_checkpoint": ("GET", "{run}/thread/checkpoint"),
    "list_thread_checkpoints": ("GET", "{run}/thread/checkpoints"),
    "list_threads_checkpoints": ("GET", "/v1/tenants/{tenant}/thread-checkpoints"),
    "delete_thread": ("DELETE", "{run}/thread"),
    "delete_thread_checkpoints": ("POST", "{run}/thread/checkpoints/delete"),
    "prune_finished": ("POST", "/v1/tenants/{tenant}/prune-finished"),
    "list_schedules": ("GET", "/v1/tenants/{tenant}/schedules"),
    "put_schedule": ("PUT", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/schedules/{schedule}"),
    "get_schedule": ("GET", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/schedules/{schedule}"),
    "delete_schedule": ("DELETE", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/schedules/{schedule}"),
}


def _template(operation: str) -> tuple[str, str]:
    """``operation``'s method and full path template."""
    method, path = OPERATIONS[operation]
    if path.startswith("{run}"):
        path = RUN_PATH + path[len("{run}") :]
    return method, path


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _claim_next_body(
    holder: str,
    ttl_ms: int,
    project: str | None,
    session: str | None,
    park: list[str] | None,
    order: str | None,
    wait_ms: int | None,
    max_attempts: int | None,
) -> dict[str, Any]:
    """``claim-next``'s body (also a batch's ``claim`` and a hand-over's
    ``next``, which carries no ``waitMs``)."""
    return _drop_none(
        {
            "holder": holder,
            "ttlMs": ttl_ms,
            "project": project,
            "session": session,
            "park": park,
            "order": order,
            "waitMs": wait_ms,
            "maxAttempts": max_attempts,
        }
    )


@dataclass
class _Request(Generic[T]):
    """One request of an operation, transport-free: method and path (from
    :data:`OPERATIONS`), query, JSON body, and how its answer parses
    (``None``: the JSON as it is)."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    body: Any = None
    parse: Callable[[Any], T] | None = None
    timeout: float | None = None

    def answer(self, body: Any) -> T:
        if self.parse is None:
            return body  # type: ignore[no-any-return]  # the JSON as it is (T is Any then)
        return self.parse(body)


class _Operation(Generic[P, T]):
    """An API method, described once: ``build`` makes its :class:`_Request`
    from the method's arguments. Read on a :class:`RunkeepClient` it is a
    method answering ``T``; on an :class:`AsyncRunkeepClient`, a coroutine
    method answering ``T``: the same name and parameters on both, one
    request builder and one answer parser for both transports."""

    def __init__(self, build: Callable[Concatenate[Any, P], _Request[T]]) -> None:
        self.build = build
        self.name = self.__name__ = build.__name__
        self.__doc__ = build.__doc__
        self.__wrapped__ = build

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __call__(self, obj: "_Api", /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Called on the class (``RunkeepClient.claim(client, …)``): as on ``obj``."""
        return obj._bind(self)(*args, **kwargs)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "_Operation[P, T]": ...
    @overload
    def __get__(self, obj: "RunkeepClient", owner: type | None = None) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: "AsyncRunkeepClient", owner: type | None = None) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, obj: "_Api", owner: type | None = None) -> Callable[P, Any]: ...
    def __get__(self, obj: "_Api | None", owner: type | None = None) -> Any:
        if obj is None:
            return self
        bound = obj._bind(self)
        # Bound once per client: later reads find it in the instance dict.
        obj.__dict__[self.name] = bound
        return bound


def _operation(build: Callable[Concatenate[Any, P], _Request[T]]) -> _Operation[P, T]:
    return _Operation(build)


class _Api:
    """Every API method, transport-free. ``_send`` answers the parsed value
    (sync) or an awaitable of it (async)."""

    tenant: str

    def _bind(self, op: _Operation[P, T]) -> Callable[P, Any]:  # pragma: no cover - per transport
        raise NotImplementedError

    # -- addresses -------------------------------------------------------
    def _path(self, operation: str, run: RunRef | None = None, checkpoint: str | None = None) -> str:
        """``operation``'s path (:data:`OPERATIONS`) in the client's tenant,
        for ``run`` (and its ``checkpoint``) when the path names them. A
        schedule's path takes its project and session from ``run`` and its
        name from ``checkpoint`` (the last id the path names)."""
        _, path = _template(operation)

        def value(name: str) -> str:
            if name == "tenant":
                return self.tenant
            if name in ("checkpoint", "schedule") and checkpoint is not None:
                return checkpoint
            if run is not None and name in ("project", "session", "run"):
                return str(getattr(run, name))
            raise ValueError(f"{operation}: its path names {{{name}}}, which this call does not give")

        return re.sub(r"\{(\w+)\}", lambda m: quote(value(m.group(1)), safe=""), path)

    def _run_params(self, run: RunRef, extra: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        p = dict(extra or {})
        if run.parent:
            p["parent"] = run.parent
        p = _drop_none(p)
        return p or None

    @overload
    def _request(self, operation: str, run: RunRef | None = None, *, checkpoint: str | None = None, body: Any = None, params: Mapping[str, Any] | None = None, parse: Callable[[Any], T], timeout: float | None = None) -> _Request[T]: ...
    @overload
    def _request(self, operation: str, run: RunRef | None = None, *, checkpoint: str | None = None, body: Any = None, params: Mapping[str, Any] | None = None, parse: None = None, timeout: float | None = None) -> _Request[Any]: ...
    def _request(self, operation: str, run: RunRef | None = None, *, checkpoint: str | None = None, body: Any = None, params: Mapping[str, Any] | None = None, parse: Callable[[Any], Any] | None = None, timeout: float | None = None) -> _Request[Any]:
        """A request of ``operation``: its method and path from
        :data:`OPERATIONS`; a per-run one carries the run's ``parent``."""
        method, _ = _template(operation)
        path = self._path(operation, run, checkpoint)
        query = self._run_params(run, params) if run is not None else (_drop_none(dict(params)) or None if params else None)
        return _Request(method, path, query, body, parse, timeout)

    # -- the store -------------------------------------------------------
    @_operation
    def clock(self) -> _Request[int]:
        """The store's clock, epoch ms."""
        return self._request("clock", parse=lambda b: int(b["now"]))

    @_operation
    def whoami(self) -> _Request[dict[str, Any]]:
        """The token's tenant, role and id."""
        return self._request("whoami")

    @_operation
    def list_runs(self, /, *, project: str | None = None, session: str | None = None, min_priority: int | None = None, **filters: Any) -> _Request[dict[str, Any]]:
        """One page of runs (``order``: ``runId``, ``createdAt`` or
        ``priority``; ``park``, ``claimed``, ``status``, ``limit``,
        ``cursor``; ``min_priority``: only runs whose priority is at least
        it)."""
        params = _drop_none({"project": project, "session": session, "minPriority": min_priority, **filters})
        for k, v in list(params.items()):
            if isinstance(v, bool):
                params[k] = "true" if v else "false"
            elif isinstance(v, (list, tuple)):
                params[k] = ",".join(v)
        return self._request("list_runs", params=params)

    @_operation
    def run_summary(self, run: RunRef) -> _Request[dict[str, Any]]:
        """Everything the console shows of one run; its ``lifecycle`` is a :class:`Lifecycle`."""

        def parse(b: dict[str, Any]) -> dict[str, Any]:
            if isinstance(b.get("lifecycle"), dict):
                b["lifecycle"] = Lifecycle.of(b["lifecycle"])
            return b

        return self._request("run_summary", run, parse=parse)

    # -- leases ----------------------------------------------------------
    @_operation
    def claim(self, run: RunRef, *, holder: str, ttl_ms: int, max_attempts: int | None = None) -> _Request[ClaimAnswer]:
        """Claims, renews (same holder) or reclaims the run."""
        body = _drop_none({"holder": holder, "ttlMs": ttl_ms, "maxAttempts": max_attempts})
        return self._request("claim", run, body=body, parse=ClaimAnswer.of)

    @_operation
    def claim_next(
        self,
        *,
        holder: str,
        ttl_ms: int,
        project: str | None = None,
        session: str | None = None,
        park: list[str] | None = None,
        order: str | None = None,
        wait_ms: int | None = None,
        max_attempts: int | None = None,
    ) -> _Request[Claimed | None]:
        """Takes the next runnable run, waiting up to ``wait_ms`` (≤ 30 000) for one."""
        body = _claim_next_body(holder, ttl_ms, project, session, park, order, wait_ms, max_attempts)

        def parse(b: Any) -> Claimed | None:
            return Claimed.of(b.get("claimed"))

        timeout = None if not wait_ms else wait_ms / 1000 + 30
        return self._request("claim_next", body=body, parse=parse, timeout=timeout)

    @_operation
    def claim_next_batch(
        self,
        max: int,
        *,
        holder: str,
        ttl_ms: int,
        project: str | None = None,
        session: str | None = None,
        park: list[str] | None = None,
        order: str | None = None,
        wait_ms: int | None = None,
        max_attempts: int | None = None,
    ) -> _Request[list[Claimed]]:
        """Takes up to ``max`` runs (1 to 256) in one request, in the order
        :meth:`claim_next` would hand them out, each under its own lease and
        fence (a worker's local queue); with ``wait_ms``, waits until at
        least one is runnable. Answers the runs taken (empty: none)."""
        claim = _claim_next_body(holder, ttl_ms, project, session, park, order, wait_ms, max_attempts)

        def parse(b: Any) -> list[Claimed]:
            return [c for c in (Claimed.of(x) for x in b["claimed"]) if c is not None]

        timeout = None if not wait_ms else wait_ms / 1000 + 30
        return self._request("claim_next_batch", body={"max": max, "claim": claim}, parse=parse, timeout=timeout)

    @_operation
    def release(self, run: RunRef, fence: int | None = None) -> _Request[bool]:
        return self._request("release", run, body=_drop_none({"fence": fence}), parse=lambda b: bool(b["done"]))

    @_operation
    def finish(self, run: RunRef, fence: int, status: str = "completed", *, result: Any = None, reason: str | None = None) -> _Request[Lifecycle]:
        outcome = _drop_none({"status": status, "result": result, "reason": reason})
        return self._request("finish", run, body={"fence": fence, "outcome": outcome}, parse=Lifecycle.of)

    @_operation
    def fail_attempt(self, run: RunRef, fence: int, kind: str, message: str, max_attempts: int | None = None) -> _Request[Lifecycle]:
        """Reports the attempt at ``fence`` failed (``POST …/attempts/failed``)
        with its error: ``kind`` in a word (``error``, ``timeout``, or the
        exception's class name), ``message`` its text, cut here to 4 096
        characters with a marker (the server refuses longer text). The store
        keeps the error, counts the attempt, ends the holding and defers the
        run by its retry backoff, or dead-letters it at its limit
        (``max_attempts``: this report's limit, over the run's own). Answers
        the lifecycle after it. Refused as ``FencedOut`` when the fence no
        longer holds the run, ``Cancelled`` when an operator cancelled it."""
        kind = cut_text(kind, MAX_ERROR_KIND_CHARS) if kind.strip() else "error"
        error = {"kind": kind, "message": cut_text(message, MAX_ERROR_MESSAGE_CHARS)}
        body = _drop_none({"fence": fence, "error": error, "maxAttempts": max_attempts})
        return self._request("fail_attempt", run, body=body, parse=Lifecycle.of)

    @_operation
    def cancel(self, run: RunRef, reason: str | None = None) -> _Request[Lifecycle]:
        """An operator's cancel (``POST …/cancel``): the run, claimed or not,
        is finished as ``cancelled`` with ``reason`` and its holding ended;
        the holder's next write is refused as ``Cancelled`` and its next
        renewal answers the run finished (``cancelled``). A finished run is
        refused (``Conflict``). Answers the lifecycle after it."""
        return self._request("cancel", run, body=_drop_none({"reason": reason}), parse=Lifecycle.of)

    @_operation
    def snooze(self, run: RunRef, fence: int, until: int) -> _Request[bool]:
        return self._request("snooze", run, body={"fence": fence, "until": until}, parse=lambda b: bool(b["done"]))

    @_operation
    def enqueue(
        self,
        run: RunRef,
        checkpoint: Mapping[str, Any],
        *,
        available_at: int | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        attempt_timeout_ms: int | None = None,
        deadline: int | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        retention_ms: int | None = None,
    ) -> _Request[dict[str, Any]]:
        """Creates the run with its first checkpoint. ``max_attempts``: its
        attempt limit; ``retry``: its backoff after a failed attempt (a
        :class:`RetryPolicy`, or the wire's ``{"baseMs", "factor", "capMs"}``);
        ``attempt_timeout_ms``: each attempt's time limit (on every lease, a
        worker stops a handler past it); ``deadline`` (epoch ms, store clock):
        the first claim after it finishes the run as failed, reason
        ``deadline``; ``priority`` (-1 000 000 to 1 000 000, default 0):
        workers take the highest first; ``concurrency_key`` (and
        ``concurrency_limit``, default 1): at most that many runs of the key
        in the session held at once; ``retention_ms``: how long it is kept
        once finished. Answers the checkpoint written."""
        body = _enqueue_body(checkpoint, available_at, max_attempts, retry, attempt_timeout_ms, deadline, priority, concurrency_key, concurrency_limit, retention_ms)
        return self._request("enqueue", run, body=body)

    @_operation
    def enqueue_once(
        self,
        run: RunRef,
        checkpoint: Mapping[str, Any],
        *,
        dedupe_key: str,
        dedupe_window_ms: int,
        available_at: int | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        attempt_timeout_ms: int | None = None,
        deadline: int | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        retention_ms: int | None = None,
    ) -> _Request[Enqueued]:
        """:meth:`enqueue` with an idempotency key: while the window of a
        first enqueue with ``dedupe_key`` (in the run's session) is open and
        its run exists, this one creates nothing and answers that run
        (``created`` false); otherwise it creates ``run`` and starts the
        key's window of ``dedupe_window_ms`` (at most 30 days)."""
        body = _enqueue_body(checkpoint, available_at, max_attempts, retry, attempt_timeout_ms, deadline, priority, concurrency_key, concurrency_limit, retention_ms)
        body["dedupe"] = {"key": dedupe_key, "windowMs": dedupe_window_ms}
        return self._request("enqueue", run, body=body, parse=Enqueued.of)

    @_operation
    def set_priority(self, run: RunRef, priority: int) -> _Request[Lifecycle]:
        """An operator's priority change (``POST …/priority``): workers take
        the highest first; a holding is not touched. A finished run is
        refused (``Conflict``). Answers the lifecycle after it."""
        return self._request("set_priority", run, body={"priority": priority}, parse=Lifecycle.of)

    @_operation
    def key_holdings(self, key: str, *, project: str, session: str) -> _Request[list[dict[str, Any]]]:
        """Every holding of a run carrying the concurrency key ``key`` in
        the session, oldest first (``runId``, ``fence``, ``acquiredAt``,
        ``expiresAt``, ``endedAt``): the evidence the key's limit held."""
        return self._request("key_holdings", RunRef(project, session, ""), params={"key": key}, parse=lambda b: list(b["holdings"]))

    @_operation
    def reopen(self, run: RunRef) -> _Request[Lifecycle]:
        return self._request("reopen", run, parse=Lifecycle.of)

    @_operation
    def lease(self, run: RunRef) -> _Request[dict[str, Any] | None]:
        return self._request("lease", run, parse=lambda b: b.get("lease"))

    @_operation
    def lifecycle(self, run: RunRef) -> _Request[Lifecycle]:
        """The run's :class:`Lifecycle` (with its ``failures`` and ``retry``)."""
        return self._request("lifecycle", run, parse=Lifecycle.of)

    # -- retention -------------------------------------------------------
    @_operation
    def prune_finished(self, keep_finished_for_ms: int, /, *, limit: int = 1000, project: str | None = None, session: str | None = None, now: int | None = None) -> _Request[dict[str, Any]]:
        """One batch of the retention prune (operator, ``POST
        …/prune-finished``): deletes up to ``limit`` finished top-level runs
        whose finish is older than ``keep_finished_for_ms`` (a run's own
        retention wins), each with all its evidence and its sub-runs, never
        a held or reopened one. Answers ``{"deleted": [run addresses],
        "subRunsDeleted", "scanned", "more"}``; call again while ``more``."""
        body = _drop_none({"keepFinishedForMs": keep_finished_for_ms, "limit": limit, "project": project, "session": session, "now": now})
        return self._request("prune_finished", body=body, parse=dict)

    # -- schedules -------------------------------------------------------
    @_operation
    def list_schedules(self, /, *, project: str | None = None, session: str | None = None) -> _Request[list[dict[str, Any]]]:
        """The tenant's recurring schedules (narrowed to a project, and a
        session in it), each ``{"tenantId", "projectId", "sessionId",
        "schedule"}``; a schedule carries its ``nextTick`` and ``lastRun``."""
        return self._request("list_schedules", params=_drop_none({"project": project, "session": session}), parse=lambda b: list(b["schedules"]))

    @_operation
    def put_schedule(
        self,
        project: str,
        session: str,
        name: str,
        /,
        *,
        cron: str,
        timezone: str | None = None,
        input: Any = None,
        missed: Mapping[str, Any] | None = None,
        priority: int | None = None,
        concurrency: Mapping[str, Any] | None = None,
        max_attempts: int | None = None,
        paused: bool | None = None,
    ) -> _Request[dict[str, Any]]:
        """Creates or replaces schedule ``name`` of the session (operator):
        ``cron`` (5 fields, or 6 with seconds first) in ``timezone`` (IANA,
        default UTC) enqueues one run per tick, ``run_<name>-<YYYYMMDDTHHMMSSZ>``,
        whose first checkpoint holds ``input``. ``missed``: ``{"policy":
        "skip"}`` (default) or ``{"policy": "catchUp", "max": N}``. A
        replacement keeps the stored creation time and cursor."""
        body = _drop_none({"name": name, "cron": cron, "timezone": timezone, "input": input, "missed": dict(missed) if missed is not None else None, "priority": priority, "concurrency": dict(concurrency) if concurrency is not None else None, "maxAttempts": max_attempts, "paused": paused})
        return self._request("put_schedule", RunRef(project, session, ""), checkpoint=name, body=body)

    @_operation
    def get_schedule(self, project: str, session: str, name: str, /) -> _Request[dict[str, Any] | None]:
        """Schedule ``name`` of the session; ``None`` when there is none."""
        return self._request("get_schedule", RunRef(project, session, ""), checkpoint=name, parse=lambda b: b.get("schedule"))

    @_operation
    def delete_schedule(self, project: str, session: str, name: str, /) -> _Request[bool]:
        """Deletes schedule ``name`` (operator); ``False`` when absent. Its runs stay."""
        return self._request("delete_schedule", RunRef(project, session, ""), checkpoint=name, parse=lambda b: bool(b["done"]))

    # -- checkpoints -----------------------------------------------------
    @_operation
    def commit_step(self, run: RunRef, fence: int, step: Mapping[str, Any]) -> _Request[dict[str, Any]]:
        """One step (events, checkpoint, messages, record, finish) under one fence check."""
        return self._request("commit_step", run, body={"fence": fence, "step": dict(step)})

    @_operation
    def commit_steps(self, steps: Sequence[tuple[RunRef, int, Mapping[str, Any]]]) -> _Request[list[StepOutcome]]:
        """A group commit in one request (``POST /v1/tenants/{tenant}/steps``):
        ``(run, fence, step)`` for up to 256 runs, one step per run, each
        judged as :meth:`commit_step` judges it under its own fence. Answers
        one :class:`StepOutcome` per step, in the order given: one refused
        step (``FencedOut``, ``Forbidden``) leaves the others committed. A
        batch bad as a whole (empty, a run twice, an invalid step) raises
        ``InvalidInput`` and writes nothing."""

        def address(run: RunRef) -> dict[str, Any]:
            return _drop_none(
                {
                    "tenantId": self.tenant,
                    "projectId": run.project,
                    "sessionId": run.session,
                    "runId": run.run,
                    "parentRunId": run.parent,
                }
            )

        body = {"steps": [{"run": address(run), "fence": fence, "step": dict(step)} for run, fence, step in steps]}
        method, _ = _template("commit_steps")
        path = self._path("commit_steps")
        return self._request("commit_steps", body=body, parse=lambda b: [StepOutcome.of(o, method=method, path=path) for o in b["outcomes"]])

    @_operation
    def commit_step_and_claim_next(
        self,
        run: RunRef,
        fence: int,
        step: Mapping[str, Any],
        *,
        holder: str,
        ttl_ms: int,
        project: str | None = None,
        session: str | None = None,
        park: list[str] | None = None,
        order: str | None = None,
        max_attempts: int | None = None,
    ) -> _Request[HandOver]:
        """The hand-over (``POST …/steps/hand-over``): commits ``step`` on
        ``run`` under ``fence`` as :meth:`commit_step` does, then takes the
        next run as :meth:`claim_next` would (same keywords, no ``wait_ms``:
        it never long-polls), in one request.

        A refused step (``FencedOut``, a finished run, invalid input,
        ``Forbidden``) raises as ``commit_step`` does and claimed nothing.
        Otherwise the :class:`HandOver` answers the receipt, the next run or
        ``None`` (none claimable), and ``next_error`` when the claim failed
        after the step committed. A lost answer (``ConnectionFailed`` /
        ``Unavailable`` with ``outcome_unknown``) leaves both unknown: the
        step may have committed, and a next run may be held under
        ``holder`` until its lease expires."""
        nxt = _claim_next_body(holder, ttl_ms, project, session, park, order, None, max_attempts)
        body = {"fence": fence, "step": dict(step), "next": nxt}
        method, _ = _template("commit_step_and_claim_next")
        path = self._path("commit_step_and_claim_next", run)
        return self._request("commit_step_and_claim_next", run, body=body, parse=lambda b: HandOver.of(b, method=method, path=path))

    @_operation
    def write_checkpoint(self, run: RunRef, checkpoint: Mapping[str, Any], fence: int | None = None) -> _Request[dict[str, Any]]:
        return self._request("write_checkpoint", run, body=_drop_none({"checkpoint": dict(checkpoint), "fence": fence}))

    @_operation
    def list_checkpoints(self, run: RunRef, fields: str | None = None, limit: int | None = None, after: str | None = None) -> _Request[list[Any]]:
        """One page of the run's checkpoints in the store's order: at most ``limit``
        (server default 100, at most 1000), after the checkpoint ``after`` (the
        last id of the previous page; a page shorter than ``limit`` is the last).
        ``fields``: ``"summary"`` (the server's default: without ``state``, read
        one with ``read_checkpoint``) or ``"full"``."""
        return self._request("list_checkpoints", run, params={"fields": fields, "limit": limit, "after": after})

    @_operation
    def read_checkpoint(self, run: RunRef, checkpoint_id: str) -> _Request[dict[str, Any] | None]:
        return self._request("read_checkpoint", run, checkpoint=checkpoint_id, parse=lambda b: b.get("checkpoint"))

    @_operation
    def delete_checkpoint(self, run: RunRef, checkpoint_id: str, fence: int | None = None) -> _Request[bool]:
        return self._request("delete_checkpoint", run, checkpoint=checkpoint_id, params={"fence": fence}, parse=lambda b: bool(b["done"]))

    @_operation
    def latest_checkpoint(self, run: RunRef) -> _Request[dict[str, Any] | None]:
        return self._request("latest_checkpoint", run, parse=lambda b: b.get("checkpoint"))

    @_operation
    def find_pending(self, run: RunRef) -> _Request[dict[str, Any] | None]:
        return self._request("find_pending", run, parse=lambda b: b.get("checkpoint"))

    @_operation
    def resume_point(self, run: RunRef) -> _Request[dict[str, Any] | None]:
        return self._request("resume_point", run, parse=lambda b: b.get("checkpoint"))

    @_operation
    def resolve_park(self, run: RunRef, checkpoint_id: str, decision: Any, fence: int | None = None) -> _Request[dict[str, Any]]:
        """Answers a park exactly once (a second answer raises ``Conflict`` with ``first_answer``)."""
        body = _drop_none({"resolution": {"action": "answer", "decision": decision}, "fence": fence})
        return self._request("resolve_park", run, checkpoint=checkpoint_id, body=body)

    # -- events ----------------------------------------------------------
    @_operation
    def append_events(self, run: RunRef, events: list[Mapping[str, Any]], fence: int | None = None) -> _Request[list[Any]]:
        """Appends events (``{"type": ..., "payload": {...}}``); answers them as recorded."""
        return self._request("append_events", run, body=_drop_none({"events": [dict(e) for e in events], "fence": fence}), parse=lambda b: b["events"])

    @_operation
    def read_events(self, run: RunRef, since_seq: int = 0, limit: int | None = None) -> _Request[dict[str, Any]]:
        """One page of the events after ``since_seq``: at most ``limit`` (server
        default 1000, at most 10 000). ``more`` says events follow; read on from
        ``nextSinceSeq`` (the page's last seq) while ``more`` is true."""
        return self._request("read_events", run, params={"sinceSeq": since_seq, "limit": limit})

    # -- threads (checkpoint savers) ---------------------------------------
    @_operation
    def put_thread_checkpoint(self, run: RunRef, body: Mapping[str, Any]) -> _Request[dict[str, Any]]:
        """``PUT …/thread/checkpoints``: a thread checkpoint (``thread``, ``ns``,
        ``checkpointId``, ``parentId``, ``checkpoint``, ``metadata``, ``blobs``, ``fence``)."""
        return self._request("put_thread_checkpoint", run, body=_drop_none(dict(body)))

    @_operation
    def put_thread_writes(self, run: RunRef, body: Mapping[str, Any]) -> _Request[dict[str, Any]]:
        """``POST …/thread/writes``: a task's pending writes on a thread checkpoint."""
        return self._request("put_thread_writes", run, body=_drop_none(dict(body)))

    @_operation
    def get_thread_checkpoint(self, run: RunRef, *, ns: str = "", checkpoint_id: str | None = None) -> _Request[dict[str, Any] | None]:
        return self._request("get_thread_checkpoint", run, params={"ns": ns, "checkpointId": checkpoint_id}, parse=lambda b: b.get("checkpoint"))

    @_operation
    def list_thread_checkpoints(
        self,
        run: RunRef,
        *,
        ns: str | None = None,
        checkpoint_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> _Request[list[Any]]:
        params = {
            "ns": ns,
            "checkpointId": checkpoint_id,
            "before": before,
            "limit": limit,
            "filter": json.dumps(dict(filter), separators=(",", ":")) if filter else None,
        }
        return self._request("list_thread_checkpoints", run, params=params, parse=lambda b: b["checkpoints"])

    @_operation
    def list_threads_checkpoints(
        self,
        *,
        project: str | None = None,
        session: str | None = None,
        ns: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> _Request[list[Any]]:
        params = _drop_none(
            {
                "project": project,
                "session": session,
                "ns": ns,
                "before": before,
                "limit": limit,
                "filter": json.dumps(dict(filter), separators=(",", ":")) if filter else None,
            }
        )
        return self._request("list_threads_checkpoints", params=params, parse=lambda b: b["checkpoints"])

    @_operation
    def delete_thread(self, run: RunRef, fence: int | None = None) -> _Request[int]:
        return self._request("delete_thread", run, params={"fence": fence}, parse=lambda b: int(b["checkpointCount"]))

    @_operation
    def delete_thread_checkpoints(self, run: RunRef, checkpoints: Sequence[Mapping[str, str]], fence: int | None = None) -> _Request[int]:
        """``POST …/thread/checkpoints/delete``: deletes the named checkpoints
        (each ``{"ns", "checkpointId"}``) and their pending writes; the answer
        is how many existed."""
        body = {"checkpoints": [{"ns": c.get("ns", ""), "checkpointId": c["checkpointId"]} for c in checkpoints], "fence": fence}
        return self._request("delete_thread_checkpoints", run, body=body, parse=lambda b: int(b["deleted"]))


_WRITE_METHODS = {"POST", "PUT", "DELETE", "PATCH"}


def _raise_for(res: httpx.Response, method: str, path: str) -> None:
    if res.is_success:
        return
    try:
        problem = res.json()
        if not isinstance(problem, dict) or "type" not in problem:
            raise ValueError
    except ValueError:
        problem = {
            "type": "about:blank",
            "title": res.reason_phrase or "HTTP error",
            "status": res.status_code,
            "detail": res.text[:500],
        }
    raise problem_error(problem, method=method, path=path, retry_after=parse_retry_after(res.headers.get("retry-after")))


def _connection_error(e: httpx.TransportError, method: str, path: str) -> ConnectionFailed:
    # A connect failure never reached the server; anything later may have.
    unknown = method in _WRITE_METHODS and not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
    return ConnectionFailed(f"{type(e).__name__}: {e}", method=method, path=path, outcome_unknown=unknown)


def _headers(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "accept": "application/json"}


def _json_of(req: _Request[Any]) -> Any:
    """The JSON body a request sends: POST and PUT always send one."""
    return req.body if req.body is not None else ({} if req.method in ("POST", "PUT") else None)


class RunkeepClient(_Api):
    """The sync client. ``tenant`` defaults to the token's (``whoami``,
    asked here)."""

    def __init__(self, base_url: str, token: str, *, tenant: str | None = None, timeout: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._http = httpx.Client(base_url=self.base_url, headers=_headers(token), timeout=timeout, transport=transport)
        self.tenant = tenant or ""
        if not self.tenant:
            self.tenant = str(self.whoami()["tenant"])

    def _send(self, req: _Request[T]) -> T:
        try:
            res = self._http.request(req.method, req.path, params=req.params, json=_json_of(req), timeout=req.timeout or self.timeout)
        except httpx.TransportError as e:
            raise _connection_error(e, req.method, req.path) from e
        _raise_for(res, req.method, req.path)
        return req.answer(res.json())

    def _bind(self, op: _Operation[P, T]) -> Callable[P, T]:
        build = op.build

        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return self._send(build(self, *args, **kwargs))

        functools.update_wrapper(call, types.MethodType(build, self))
        return call

    def to_async(self, *, transport: httpx.AsyncBaseTransport | None = None) -> "AsyncRunkeepClient":
        """An :class:`AsyncRunkeepClient` with this client's URL, token,
        tenant and timeout (a transport is per kind: pass an async one to
        replace httpx's default). The two share nothing else; close both."""
        return AsyncRunkeepClient(self.base_url, self.token, tenant=self.tenant, timeout=self.timeout, transport=transport)

    def tail(self, run: RunRef, since_seq: int = 0, *, reconnect_delay: float = 0.5) -> Iterator[dict[str, Any]]:
        """The run's events after ``since_seq``, live, forever: resumes
        after a dropped stream from the last event seen (``Last-Event-ID``),
        so no event is lost or repeated. Break out of the loop to stop."""
        from .sse import tail_sync

        return tail_sync(self, run, since_seq, reconnect_delay)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RunkeepClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRunkeepClient(_Api):
    """The async client: :class:`RunkeepClient`'s methods, each a coroutine
    with the same name and parameters, over ``httpx.AsyncClient``. Without
    ``tenant``, the first call asks the token's (``whoami``); ``async with``
    or :meth:`connect` asks it at once."""

    def __init__(self, base_url: str, token: str, *, tenant: str | None = None, timeout: float = 60.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=_headers(token), timeout=timeout, transport=transport)
        self.tenant = tenant or ""

    async def connect(self) -> "AsyncRunkeepClient":
        """Learns the token's tenant when none was given; answers the client."""
        if not self.tenant:
            me = await self._send(_Api.whoami.build(self))
            self.tenant = str(me["tenant"])
        return self

    async def _send(self, req: _Request[T]) -> T:
        try:
            res = await self._http.request(req.method, req.path, params=req.params, json=_json_of(req), timeout=req.timeout or self.timeout)
        except httpx.TransportError as e:
            raise _connection_error(e, req.method, req.path) from e
        _raise_for(res, req.method, req.path)
        return req.answer(res.json())

    def _bind(self, op: _Operation[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
        build = op.build

        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            if not self.tenant:
                await self.connect()
            return await self._send(build(self, *args, **kwargs))

        functools.update_wrapper(call, types.MethodType(build, self))
        return call

    def tail(self, run: RunRef, since_seq: int = 0, *, reconnect_delay: float = 0.5) -> AsyncIterator[dict[str, Any]]:
        """Async twin of :meth:`RunkeepClient.tail`."""
        from .sse import tail_async

        return tail_async(self, run, since_seq, reconnect_delay)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncRunkeepClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = [
    "AsyncRunkeepClient",
    "ClaimAnswer",
    "Claimed",
    "FailedAttempt",
    "HandOver",
    "Lease",
    "Lifecycle",
    "RetryPolicy",
    "RunRef",
    "RunkeepClient",
    "Enqueued",
    "OPERATIONS",
    "RunkeepError",
    "cut_text",
]
