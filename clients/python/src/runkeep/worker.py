"""The lease-keeping worker helper.

For each run it takes, :class:`Worker`:

1. **claims** with ``claim_next`` and a long-poll (``wait_ms``), so an idle
   worker waits at the server instead of polling;
2. **keeps** the lease (:class:`HeldRun`): renews (a claim by the same
   holder, which mints a new, higher fence) every third of the TTL,
   measured from when the previous claim was *sent*. Renewals and writes
   exclude each other, so no write presents a fence a renewal is retiring;
3. **stops the work the moment the lease is lost**: ``held.lost`` is set
   (and the handler's ``held.check()`` raises :class:`LeaseLost`, whose
   ``kind`` says why) when a renewal finds another holder
   (``superseded``), when a write is refused as fenced out
   (``fenced-out``), when no renewal landed before the safety margin
   (``expiring``: a tenth of the TTL before the local deadline, on the
   monotonic clock from when the claim was sent, so never later than the
   store's; a renewal is never sent after that margin: a lease that lapsed
   is lost, not re-taken), when a renewal answers a fence other than the
   next one (``gap``: someone ended the holding in between, an operator's
   release or a takeover; the holding that renewal took by mistake is
   released at once), or when an operator cancelled the run (``cancelled``:
   a renewal answers it finished as cancelled, or a write is refused as
   :class:`~runkeep.errors.Cancelled`; ``LeaseLost.reason`` is the
   operator's). The same signal stops a handler past the worker's
   ``attempt_timeout`` (``timeout``);
4. **writes through the atomic step** (``held.step(step)``: one
   ``POST …/steps`` under the current fence) or any fenced write
   (``held.fenced(lambda fence: ...)``);
5. **ends the holding** by what the handler did: a return value finishes
   the run (default), or the handler released or snoozed it itself; a
   handler that raises has its attempt reported failed (``fail_attempt``:
   kind the exception's class name, message its text), and one past
   ``attempt_timeout`` is stopped and reported failed with kind
   ``timeout``: the store keeps the error, counts the attempt, and defers
   the run by its own retry backoff or dead-letters it at its limit (the
   worker keeps no backoff of its own). A run whose holding was lost (or
   cancelled) gets nothing more: no finish, release or report. When
   :meth:`Worker.run` would claim again anyway, the finish is a hand-over
   (``commit_step_and_claim_next``: a finishing step and the next claim in
   one request); the next run it took is handled without a ``claim_next``.
   With ``commit_batch`` above 1, the finishes of several runs go out
   together in one group commit (``commit_steps``) instead (see
   :class:`Worker`).

Python threads cannot be killed: the sync handler is stopped cooperatively
(``held.lost``, ``held.check()``, and every write refused once lost). With
``attempt_timeout``, the handler runs on a thread of its own and the worker
stops waiting on it the moment it times out or its holding is lost; the
abandoned thread's writes are refused locally, and any that was in flight
is refused by the store (the failure report or the loss spent its fence).
Counters of what the worker did are in :attr:`Worker.report`.

This is the worker protocol every runkeep runtime follows (Rust, TypeScript,
Python), written down once in the repository's
``docs/design/worker-protocol.md``.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from .client import ClaimAnswer, HandOver, Lease, Lifecycle, RunkeepClient, RunRef
from .errors import Cancelled, Conflict, Corrupted, FencedOut, InvalidInput, PayloadTooLarge, RunkeepError

T = TypeVar("T")


class LeaseLost(RunkeepError):
    """The holding is gone, or the step must stop: ``kind`` is
    ``superseded`` (another holder has the run), ``fenced-out`` (a write
    was refused), ``expiring`` (no renewal before the safety margin),
    ``renewal-failed``, ``gap`` (a renewal answered fence ``current``, not
    the next one: someone ended the holding in between), ``cancelled`` (an
    operator cancelled the run; ``reason`` is theirs) or ``timeout`` (the
    handler ran past the worker's ``attempt_timeout``)."""

    lost_holding = True

    def __init__(self, kind: str, fence: int, detail: str, current: int | None = None, *, reason: str | None = None) -> None:
        super().__init__({"type": "urn:runkeep:client:lease-lost", "title": "Lease lost", "status": 0, "detail": detail})
        self.kind = kind
        self.fence = fence
        self.current = current
        self.reason = reason


class _Gate:
    """Many writers or one renewal."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._writers = 0
        self._renewing = False

    def shared(self) -> "_Held":
        with self._cond:
            while self._renewing:
                self._cond.wait()
            self._writers += 1
        return _Held(self, exclusive=False)

    def exclusive(self, deadline: float) -> "_Held | None":
        with self._cond:
            while self._renewing or self._writers:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            self._renewing = True
        return _Held(self, exclusive=True)

    def _leave(self, exclusive: bool) -> None:
        with self._cond:
            if exclusive:
                self._renewing = False
            else:
                self._writers -= 1
            self._cond.notify_all()


class _Held:
    def __init__(self, gate: _Gate, exclusive: bool) -> None:
        self.gate, self.exclusive = gate, exclusive

    def __enter__(self) -> "_Held":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.gate._leave(self.exclusive)


def default_holder() -> str:
    """Unique per process: it is what tells a renewal from a theft."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class HeldRun:
    """A run held by this worker, its lease renewed in a background thread.

    ``fence`` is the current fence (it changes with every renewal). Use it
    as a context manager, or call :meth:`start` and one of :meth:`finish`,
    :meth:`release`, :meth:`snooze`.
    """

    def __init__(
        self,
        client: RunkeepClient,
        run: RunRef,
        lease: Lease,
        *,
        holder: str,
        ttl_ms: int,
        sent_at: float,
        renew_fraction: float = 1 / 3,
        safety_fraction: float = 0.1,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if not (0 < renew_fraction < 1 and 0 <= safety_fraction < 1 and renew_fraction + safety_fraction < 1):
            raise ValueError("renew_fraction in (0, 1), safety_fraction in [0, 1), their sum below 1")
        self.client = client
        self.run = run
        self.lease = lease
        self.holder = holder
        self.ttl = ttl_ms / 1000
        self.renew_fraction = renew_fraction
        self.safety = ttl_ms / 1000 * safety_fraction
        self._sent_at = sent_at
        self._gate = _Gate()
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.loss: LeaseLost | None = None
        #: True once this worker learned that an operator cancelled the run
        #: (even when the step had already been stopped for another reason).
        self.cancelled = False
        self.ended = False
        self._thread: threading.Thread | None = None
        self._emit = on_event or (lambda e: None)

    @property
    def fence(self) -> int:
        return self.lease.fence

    @property
    def deadline(self) -> float:
        """The local deadline (monotonic): the lease's TTL from when its claim was sent."""
        return self._sent_at + self.ttl

    # -- renewal -------------------------------------------------------
    def start(self) -> "HeldRun":
        if self._thread is None:
            self._thread = threading.Thread(target=self._renew_loop, name=f"runkeep-renew-{self.run.run}", daemon=True)
            self._thread.start()
        return self

    def _lose(self, loss: LeaseLost) -> None:
        if not self.lost.is_set():
            self.loss = loss
            self.lost.set()
            self._emit({"type": "lost", "run": self.run, "kind": loss.kind, "fence": loss.fence})

    def _renew_loop(self) -> None:
        while not self._stop.is_set() and not self.lost.is_set():
            renew_at = self._sent_at + self.ttl * self.renew_fraction
            margin_at = self.deadline - self.safety
            if self._stop.wait(max(0.0, renew_at - time.monotonic())):
                return
            if time.monotonic() >= margin_at:
                self._lose(LeaseLost("expiring", self.fence, f"the renewal of fence {self.fence} came due only within the safety margin of its lease (process paused or starved)"))
                return
            held = self._gate.exclusive(margin_at)
            if held is None:
                self._lose(LeaseLost("expiring", self.fence, f"writes in flight held off the renewal of fence {self.fence} until the safety margin"))
                return
            with held:
                self._renew_once(margin_at)

    def _renew_once(self, margin_at: float) -> None:
        old = self.fence
        while not self._stop.is_set():
            if time.monotonic() >= margin_at:
                self._lose(LeaseLost("expiring", old, f"no renewal of fence {old} landed before the safety margin"))
                return
            sent = time.monotonic()
            try:
                answer: ClaimAnswer = self.client.claim(self.run, holder=self.holder, ttl_ms=int(self.ttl * 1000))
            except RunkeepError as e:
                if e.retryable:
                    time.sleep(min(0.2, max(0.0, margin_at - time.monotonic())))
                    continue
                self._lose(LeaseLost("renewal-failed", old, f"renewing fence {old} failed: {e}"))
                return
            if answer.acquired and answer.lease is not None and answer.lease.fence != old + 1:
                self._gap(old, answer.lease.fence)
                return
            if time.monotonic() >= self.deadline:
                self._lose(LeaseLost("expiring", old, f"the renewal of fence {old} answered after its deadline"))
                return
            if answer.acquired and answer.lease is not None:
                self.lease = answer.lease
                self._sent_at = sent
                self._emit({"type": "renewed", "run": self.run, "from": old, "to": answer.lease.fence})
                return
            if answer.outcome == "held":
                cur = (answer.held_by or {}).get("fence")
                self._lose(LeaseLost("superseded", old, f"the run is held by another holding at fence {cur}", cur))
            elif answer.outcome == "finished" and answer.status == "cancelled":
                self._cancelled(old, self._cancel_reason())
            else:
                self._lose(LeaseLost("renewal-failed", old, f"the run answered {answer.outcome} while fence {old} was held"))
            return

    def _gap(self, held: int, answered: int) -> None:
        """A renewal of ``held`` answered ``answered``, not ``held + 1``: the
        holding was ended by someone else in between (an operator's release,
        or a takeover released again), and the store answered a new claim
        over the tombstone. The run is not ours to go on with: stop the step,
        and give back the holding the renewal took by mistake."""
        self._lose(
            LeaseLost(
                "gap",
                held,
                f"the holding at fence {held} was ended by someone else (released by an operator, or taken over): the renewal answered fence {answered}, not {held + 1}",
                answered,
            )
        )
        try:
            self.client.release(self.run, answered)
        except RunkeepError as e:
            self._emit({"type": "gap-release-failed", "run": self.run, "fence": answered, "error": e})

    def _cancel_reason(self) -> str | None:
        try:
            return self.client.lifecycle(self.run).get("reason")
        except RunkeepError:
            return None

    def _cancelled(self, fence: int, reason: str | None) -> None:
        self.cancelled = True
        why = f" ({reason})" if reason else ""
        self._lose(LeaseLost("cancelled", fence, f"an operator cancelled the run{why}", reason=reason))

    # -- writes --------------------------------------------------------
    def check(self) -> None:
        """Raises :class:`LeaseLost` once the holding is lost or within its margin."""
        if self.lost.is_set() and self.loss is not None:
            raise self.loss
        if time.monotonic() >= self.deadline - self.safety:
            self._lose(LeaseLost("expiring", self.fence, f"fence {self.fence} is within the safety margin of its deadline"))
            raise self.loss  # type: ignore[misc]

    def fenced(self, write: Callable[[int], T], operation: str = "write") -> T:
        """Runs ``write(fence)`` under the current fence, excluded from
        renewals; refused locally once lost; a ``FencedOut`` or
        ``Cancelled`` answer marks the holding lost (and is raised). A
        refusal of a run an operator cancelled is raised as ``Cancelled``
        whatever the server called it (some acts on a finished run answer
        ``Conflict`` or ``FencedOut``)."""
        with self._gate.shared():
            self.check()
            return self._send(write, operation)

    def _send(self, write: Callable[[int], T], operation: str) -> T:
        fence = self.fence
        try:
            return write(fence)
        except (Cancelled, FencedOut, Conflict) as e:
            judged = self._refused(fence, operation, e)
            if judged is e:
                raise
            raise judged from e

    def _refused(self, fence: int, operation: str, refused: RunkeepError) -> RunkeepError:
        """What the refusal of a write under ``fence`` stands for, marking
        the holding lost as it says: ``Cancelled`` (also a ``FencedOut`` or
        ``Conflict`` on a run an operator cancelled) and ``FencedOut`` lose
        it; anything else is answered unchanged."""
        if isinstance(refused, Cancelled):
            self._cancelled(fence, refused.reason)
            return refused
        if isinstance(refused, (FencedOut, Conflict)):
            cancelled = self._cancelled_refusal(fence, operation, refused)
            if cancelled is not None:
                cancelled.__cause__ = refused
                return cancelled
            if isinstance(refused, FencedOut):
                self._lose(LeaseLost("fenced-out", fence, str(refused), refused.current))
        return refused

    def step(self, step: Mapping[str, Any]) -> dict[str, Any]:
        """One atomic step (events, checkpoint, messages, record, finish)."""
        return self.fenced(lambda fence: self.client.commit_step(self.run, fence, step), "commit_step")

    # -- endings -------------------------------------------------------
    def _end(self) -> None:
        self.ended = True
        self._stop.set()

    def finish(self, status: str = "completed", *, result: Any = None, reason: str | None = None) -> Lifecycle:
        try:
            return self.fenced(lambda fence: self.client.finish(self.run, fence, status, result=result, reason=reason), "finish")
        finally:
            self._end()

    def release(self) -> bool:
        """Gives the run back (claimable at once). Sends nothing once the
        store has ended the holding itself (lost to another holder, a gap,
        a cancel): answers ``False`` then."""
        self._stop.set()
        with self._gate.shared():
            try:
                if self.lost.is_set() and self.loss is not None and self.loss.kind in ("superseded", "fenced-out", "gap", "cancelled"):
                    return False
                return bool(self._send(lambda fence: self.client.release(self.run, fence), "release"))
            except (FencedOut, Cancelled):
                return False
            finally:
                self._end()

    def fail_attempt(self, kind: str, message: str, *, max_attempts: int | None = None) -> Lifecycle:
        """Reports this attempt failed (``POST …/attempts/failed``) with the
        error's ``kind`` and ``message`` (cut to 4 096 characters with a
        marker): the store keeps it, counts the attempt, ends the holding and
        defers the run by its retry backoff, or dead-letters it at its limit
        (``max_attempts``: this report's, over the run's own). Answers the
        lifecycle after it. Refused locally (:class:`LeaseLost`) once the
        holding is lost; allowed after the attempt timeout stopped the step."""
        self._stop.set()
        try:
            with self._gate.shared():
                if self.lost.is_set() and self.loss is not None and self.loss.kind != "timeout":
                    raise self.loss
                return self._send(lambda fence: self.client.fail_attempt(self.run, fence, kind, message, max_attempts=max_attempts), "fail_attempt")
        finally:
            self._end()

    def _cancelled_refusal(self, fence: int, operation: str, refused: RunkeepError) -> Cancelled | None:
        """The :class:`Cancelled` a refusal stands for when the run turns
        out to be cancelled (marking the holding lost), else ``None``."""
        try:
            life = self.client.lifecycle(self.run)
        except RunkeepError:
            return None
        if life.get("status") != "cancelled":
            return None
        reason = life.get("reason")
        self._cancelled(fence, reason)
        problem = {
            "type": "urn:runkeep:problem:cancelled",
            "title": "Run cancelled",
            "status": 409,
            "detail": f"{operation} on run {self.run.run} was refused ({refused.detail}): an operator cancelled the run",
            "run": self.run.run,
            "operation": operation,
            "reason": reason,
        }
        return Cancelled(problem, method=refused.method, path=refused.path)

    def stop_step(self, kind: str, detail: str) -> None:
        """Sets the step's cancellation signal (``lost``, with a
        :class:`LeaseLost` of ``kind``) without ending the holding: every
        later write of the step is refused locally, and renewals stop. The
        worker does this to a handler past its ``attempt_timeout``
        (``timeout``), then reports the attempt failed."""
        self._lose(LeaseLost(kind, self.fence, detail))

    def snooze(self, until_ms: int) -> bool:
        try:
            return bool(self.fenced(lambda fence: self.client.snooze(self.run, fence, until_ms), "snooze"))
        finally:
            self._end()

    def stop_renewing(self) -> None:
        self._stop.set()

    def __enter__(self) -> "HeldRun":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, *rest: Any) -> None:
        """A clean exit finishes the run; an exception (the holding not lost)
        reports the attempt failed, kind the exception's class name."""
        if not self.ended:
            if exc_type is None:
                self.finish()
            elif not self.lost.is_set():
                try:
                    self.fail_attempt(exc_type.__name__, str(exc))
                except RunkeepError:
                    pass
            else:
                self._end()


@dataclass
class WorkerOptions:
    holder: str | None = None
    ttl_ms: int = 30_000
    project: str | None = None
    session: str | None = None
    park: list[str] | None = None
    wait_ms: int = 20_000
    attempt_timeout: float | None = None
    max_attempts: int | None = None


@dataclass
class WorkerReport:
    """What a :class:`Worker` did, counted over every :meth:`Worker.run`.

    - ``handled``: runs handed to the handler.
    - ``completed``: runs the worker finished (or handed over, or
      committed in a group: ``commit_batch``) after the handler returned;
      a group's run counts once the group's answer says it committed.
    - ``failed``: handlers that raised or ran past ``attempt_timeout``; each
      was reported as a failed attempt (unless the holding was lost first).
    - ``timed_out``: of ``failed``, the handlers stopped by ``attempt_timeout``.
    - ``dead_lettered``: failure reports that reached the run's limit (the
      store dead-lettered the run).
    - ``cancelled``: runs an operator cancelled under the worker (a renewal
      answered it cancelled, or a write was refused as ``Cancelled``).
    - ``lost``: runs whose holding was lost while handled (``cancelled``
      included: superseded, fenced out, a gap, expiring); nothing more was
      reported for them.
    - ``end_failed``: finishes and failure reports the server refused for
      another reason (the run stays held until its lease expires).
    """

    handled: int = 0
    completed: int = 0
    failed: int = 0
    timed_out: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    lost: int = 0
    end_failed: int = 0
    errors: list[BaseException] = field(default_factory=list, repr=False)


#: How many refused endings :attr:`WorkerReport.errors` keeps.
MAX_LISTED_ERRORS = 32
#: How long (seconds) the first finish of a group waits for others by
#: default (:class:`Worker`'s ``commit_linger``).
DEFAULT_COMMIT_LINGER = 0.002


class Worker:
    """Claims runs with ``claim_next`` and hands each to a handler as a
    :class:`HeldRun` whose lease it keeps.

    ``attempt_timeout`` (seconds, default ``None``: no limit): a handler
    running longer is stopped (``held.lost`` set, ``held.loss.kind ==
    "timeout"``; the worker stops waiting on it) and its attempt reported
    failed with kind ``timeout``. ``max_attempts``: the limit the worker's
    failure reports carry, over the run's own (default: the run's).
    ``claim_batch`` (1 to 256, default 1): claim up to that many runs in one
    request (``claim_next_batch``); the ones not handled at once wait in a
    local queue, held and renewing, and are handled next (the loop hands
    over only once the queue is empty); runs still queued when the loop
    stops are released.

    ``commit_batch`` (1 to 256, default 1: each finish on its own, as
    before) groups the finishes of :meth:`run`: a handler's return value
    (the step that finishes its run, nothing else: steps, failure reports,
    releases and snoozes go one by one) waits in a pending group, the run
    held and renewing, while the loop handles its next queued run; the
    group goes out as one ``commit_steps`` request once it holds
    ``commit_batch`` finishes, once its oldest has waited
    ``commit_linger`` seconds (default 0.002; 0: at once; a thread of the
    worker sends it while a handler runs), before any claim (the local
    queue is empty: finishes are never held while the worker claims or
    waits idle) and when the loop stops. Each run goes under the fence its
    keeper holds at the send, renewals held off until the answer; each is
    judged on its own (a fenced-out or cancelled run is booked lost, the
    others complete), as its own finish would be. Grouped finishes do not
    hand over (the next claim is the loop's ``claim_next``), so
    ``commit_batch`` is for ``claim_batch`` above 1. A request that fails
    whole (no answer, outcome unknown, 5xx) ends every run's keeper,
    counts none completed and is raised by :meth:`run`, as a single
    finish's failure is; one refused whole as invalid or too large
    (nothing written) is sent again run by run.
    """

    def __init__(
        self,
        client: RunkeepClient,
        *,
        holder: str | None = None,
        ttl_ms: int = 30_000,
        project: str | None = None,
        session: str | None = None,
        park: list[str] | None = None,
        wait_ms: int = 20_000,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        attempt_timeout: float | None = None,
        max_attempts: int | None = None,
        claim_batch: int = 1,
        commit_batch: int = 1,
        commit_linger: float = DEFAULT_COMMIT_LINGER,
    ) -> None:
        if not 1 <= claim_batch <= 256:
            raise ValueError("claim_batch must be from 1 to 256 (runs claimed in one request)")
        if isinstance(commit_batch, bool) or not isinstance(commit_batch, int) or not 1 <= commit_batch <= 256:
            raise ValueError(f"commit_batch must be an integer from 1 to 256 (finishes sent in one request; 1: each on its own), not {commit_batch!r}")
        if isinstance(commit_linger, bool) or not isinstance(commit_linger, (int, float)) or not (math.isfinite(commit_linger) and commit_linger >= 0):
            raise ValueError(f"commit_linger must be a finite number of seconds >= 0 (how long a finish waits for others), not {commit_linger!r}")
        if attempt_timeout is not None and not attempt_timeout > 0:
            raise ValueError("attempt_timeout must be above 0 seconds (None: no limit)")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (None: the run's own limit)")
        self.client = client
        self.holder = holder or default_holder()
        self.ttl_ms = ttl_ms
        self.project = project
        self.session = session
        self.park = park
        self.wait_ms = wait_ms
        self.on_event = on_event
        self.attempt_timeout = attempt_timeout
        self.max_attempts = max_attempts
        self.claim_batch = claim_batch
        self.commit_batch = commit_batch
        self.commit_linger = float(commit_linger)
        #: Runs a batch claimed beyond the one handled first: held and renewing.
        self._queued: collections.deque[HeldRun] = collections.deque()
        self.report = WorkerReport()
        #: The pending group commit: runs whose handler returned, with the
        #: result each finishes with, oldest first (held and renewing), and
        #: when the oldest joined (monotonic).
        self._group: list[tuple[HeldRun, Any]] = []
        self._group_since = 0.0
        #: Guards the group and :attr:`report`: the linger thread sends
        #: groups (and books their runs) while the loop handles a run.
        self._group_cond = threading.Condition(threading.RLock())
        #: What a send on the linger thread raised: the loop raises it.
        self._group_error: BaseException | None = None
        self._lingering: threading.Thread | None = None
        self._linger_stop = False

    def _emit(self, event: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def _held(self, run: RunRef, lease: Lease, sent: float) -> HeldRun:
        return HeldRun(self.client, run, lease, holder=self.holder, ttl_ms=self.ttl_ms, sent_at=sent, on_event=self.on_event)

    def claim_next(self, wait_ms: int | None = None) -> HeldRun | None:
        """The next runnable run (long-poll up to ``wait_ms``), held and
        renewing; ``None`` when none came. With ``claim_batch`` above 1, a
        run queued by an earlier batch first, else a new batch."""
        while self._queued:
            held = self._queued.popleft()
            if not held.lost.is_set():
                return held
            self._book_lost(held)
        # Nothing else to do now: the pending finishes go before the claim
        # (never held while the worker claims or waits idle).
        self._flush_group()
        sent = time.monotonic()
        if self.claim_batch > 1:
            got = self.client.claim_next_batch(self.claim_batch, holder=self.holder, ttl_ms=self.ttl_ms, project=self.project, session=self.session, park=self.park, wait_ms=self.wait_ms if wait_ms is None else wait_ms)
            runs = [self._held(c.run, c.lease, sent).start() for c in got]
            self._queued.extend(runs[1:])
            return runs[0] if runs else None
        c = self.client.claim_next(holder=self.holder, ttl_ms=self.ttl_ms, project=self.project, session=self.session, park=self.park, wait_ms=self.wait_ms if wait_ms is None else wait_ms)
        if c is None:
            return None
        return self._held(c.run, c.lease, sent).start()

    def claim(self, run: RunRef) -> HeldRun | None:
        """Claims one run by address; ``None`` when someone else holds it (or it is finished or deferred)."""
        sent = time.monotonic()
        a = self.client.claim(run, holder=self.holder, ttl_ms=self.ttl_ms)
        if not a.acquired or a.lease is None:
            return None
        return self._held(run, a.lease, sent).start()

    def finish_and_claim_next(self, held: HeldRun, *, result: Any = None) -> HeldRun | None:
        """Finishes ``held`` as ``completed`` with ``result`` and claims the
        next run in one request (the hand-over, with this worker's holder,
        TTL and scope; no long-poll). Answers the next run, held and
        renewing, or ``None`` when none was claimable or the claim failed
        after the finish committed (an ``on_event`` ``next-error`` says
        which). A refused finish raises as :meth:`HeldRun.finish` does
        (``FencedOut`` marks the holding lost; ``LeaseLost`` once lost)."""
        step = _finish_step(result)
        sent = time.monotonic()

        def write(fence: int) -> HandOver:
            nonlocal sent
            sent = time.monotonic()
            return self.client.commit_step_and_claim_next(held.run, fence, step, holder=self.holder, ttl_ms=self.ttl_ms, project=self.project, session=self.session, park=self.park)

        try:
            over: HandOver = held.fenced(write, "commit_step_and_claim_next")
        finally:
            held._end()
        if over.next_error is not None and self.on_event is not None:
            self.on_event({"type": "next-error", "run": held.run, "error": over.next_error})
        if over.next is None:
            return None
        return self._held(over.next.run, over.next.lease, sent).start()

    def run(self, handler: Callable[[HeldRun], Any], *, stop: threading.Event | None = None, max_runs: int | None = None) -> int:
        """Drains runs until ``stop`` is set (or ``max_runs`` were handled):
        each one's handler return value finishes it as ``completed`` with
        that result; a handler that raised (its holding not lost) has its
        attempt reported failed (``fail_attempt``, kind the exception's
        class name, message its text); one past ``attempt_timeout`` is
        stopped and reported failed with kind ``timeout``; a run whose
        holding was lost (``held.lost``: superseded, a gap, a cancel …)
        gets nothing more. Answers how many runs were handled;
        :attr:`report` counts the rest.

        While another run is wanted (``stop`` not set, ``max_runs`` not
        reached), that finish is a hand-over
        (:meth:`finish_and_claim_next`) and the run it took is handled
        next, as a run ``claim_next`` answered would be; when it took none,
        the loop long-polls ``claim_next`` as before. With ``commit_batch``
        above 1 the finish joins the pending group instead (no hand-over),
        and whatever is pending is sent before ``run`` returns or raises."""
        done = 0

        def wanted() -> bool:
            return (stop is None or not stop.is_set()) and (max_runs is None or done < max_runs)

        self._start_lingering()
        try:
            while wanted():
                held = self.claim_next()
                while held is not None:
                    done += 1
                    held = self._handle(handler, held, wanted)
        finally:
            try:
                self._stop_lingering()
                self._flush_group()
            finally:
                self.release_queued()
        return done

    def release_queued(self) -> None:
        """Releases the runs a batch claimed that were not handled (the
        loop stopped): another worker may take them at once."""
        while self._queued:
            held = self._queued.popleft()
            try:
                held.release()
            except RunkeepError:
                pass  # lost meanwhile: not ours to give back

    def _call(self, handler: Callable[[HeldRun], Any], held: HeldRun) -> tuple[str, Any]:
        """Runs the handler: ``("returned", value)``, ``("raised", exc)``,
        ``("timeout", None)`` or ``("lost", None)`` (stopped waiting on a
        handler whose holding was lost; only with ``attempt_timeout``)."""
        # The run's own attempt timeout (set on enqueue, on its lease) and
        # the worker's: the shorter one holds.
        own = held.lease.attempt_timeout_ms
        limits = [t for t in (self.attempt_timeout, own / 1000 if own is not None else None) if t is not None]
        limit = min(limits) if limits else None
        if limit is None:
            try:
                return ("returned", handler(held))
            except Exception as e:
                return ("raised", e)
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = handler(held)
            except BaseException as e:  # noqa: BLE001 - handed to the worker
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=target, name=f"runkeep-handler-{held.run.run}", daemon=True).start()
        ends = time.monotonic() + limit
        while not done.is_set():
            if held.lost.is_set():
                return ("lost", None)
            left = ends - time.monotonic()
            if left <= 0:
                held.stop_step("timeout", f"the handler ran past the attempt timeout of {limit} s")
                return ("timeout", None)
            done.wait(min(left, 0.02))
        if "error" in box:
            err = box["error"]
            if not isinstance(err, Exception):
                raise err
            return ("raised", err)
        return ("returned", box.get("value"))

    def _book_lost(self, held: HeldRun, error: BaseException | None = None) -> None:
        held.stop_renewing()
        with self._group_cond:
            self.report.lost += 1
            if held.cancelled or isinstance(error, Cancelled):
                self.report.cancelled += 1

    def _book_refused(self, held: HeldRun, e: RunkeepError) -> None:
        """An ending refused: a lost holding is booked as lost, anything
        else as ``end_failed``."""
        own_stop = isinstance(e, LeaseLost) and e.kind == "timeout"
        if (e.lost_holding and not own_stop) or (held.lost.is_set() and held.loss is not None and held.loss.kind != "timeout"):
            self._book_lost(held, e)
            return
        with self._group_cond:
            self.report.end_failed += 1
            if len(self.report.errors) < MAX_LISTED_ERRORS:
                self.report.errors.append(e)
        self._emit({"type": "end-failed", "run": held.run, "error": e})

    def _fail(self, held: HeldRun, kind: str, message: str) -> None:
        """Reports the attempt failed; the store decides the backoff."""
        self.report.failed += 1
        if kind == "timeout":
            self.report.timed_out += 1
        try:
            life = held.fail_attempt(kind, message, max_attempts=self.max_attempts)
        except RunkeepError as e:
            self._book_refused(held, e)
            return
        if life.dead_lettered:
            self.report.dead_lettered += 1
        self._emit({"type": "attempt-failed", "run": held.run, "kind": kind, "attempts": life.attempts, "dead_lettered": life.dead_lettered})

    def _handle(self, handler: Callable[[HeldRun], Any], held: HeldRun, wanted: Callable[[], bool]) -> HeldRun | None:
        """Runs the handler on ``held`` and ends the holding; answers the
        run a hand-over took (only when another run is ``wanted()`` once
        the handler returned)."""
        self.report.handled += 1
        how, value = self._call(handler, held)
        if how == "timeout":
            self._fail(held, "timeout", held.loss.detail if held.loss is not None and held.loss.detail else "attempt timeout")
            return None
        if held.lost.is_set() or (how == "raised" and isinstance(value, LeaseLost)):
            # Lost (superseded, fenced out, a gap, cancelled, expiring): the
            # run is not ours to end or report on.
            self._book_lost(held)
            return None
        if held.ended:
            return None  # the handler finished, released or snoozed it itself
        if how == "raised":
            self._fail(held, type(value).__name__, str(value))
            return None
        if self.commit_batch > 1:
            # Grouped: no hand-over; the claim after the group's send is
            # the loop's own claim_next.
            self._join_group(held, value)
            return None
        if wanted() and not self._queued:
            try:
                nxt = self.finish_and_claim_next(held, result=value)
            except RunkeepError as e:
                if not (e.lost_holding or held.lost.is_set()):
                    raise
                self._book_refused(held, e)
                return None
            with self._group_cond:
                self.report.completed += 1
            return nxt
        self._finish_one(held, value)
        return None

    def _finish_one(self, held: HeldRun, result: Any) -> None:
        """Finishes ``held`` on its own (``finish``): a refusal that lost
        the holding is booked; any other raises."""
        try:
            held.finish(result=result)
        except RunkeepError as e:
            if not (e.lost_holding or held.lost.is_set()):
                raise
            self._book_refused(held, e)
            return
        with self._group_cond:
            self.report.completed += 1

    # -- group commit ----------------------------------------------------
    def _join_group(self, held: HeldRun, result: Any) -> None:
        """Adds a returned handler's finish to the pending group (its keeper
        renewing meanwhile); sends the group once it holds
        ``commit_batch`` finishes. Raises what a send on the linger thread
        raised, once the finish has joined (so it is still sent on stop)."""
        with self._group_cond:
            try:
                if not self._group:
                    self._group_since = time.monotonic()
                    self._group_cond.notify_all()
                self._group.append((held, result))
                if len(self._group) >= self.commit_batch:
                    self._send_group()
            finally:
                self._raise_group_error()

    def _flush_group(self) -> None:
        """Sends the pending finishes now (the local queue is empty, or the
        loop stops), then raises what a send on the linger thread raised."""
        with self._group_cond:
            try:
                self._send_group()
            finally:
                self._raise_group_error()

    def _raise_group_error(self) -> None:
        error, self._group_error = self._group_error, None
        if error is not None:
            raise error

    def _start_lingering(self) -> None:
        if self.commit_batch > 1 and self._lingering is None:
            self._linger_stop = False
            self._lingering = threading.Thread(target=self._linger, name="runkeep-commit-linger", daemon=True)
            self._lingering.start()

    def _stop_lingering(self) -> None:
        thread = self._lingering
        if thread is None:
            return
        with self._group_cond:
            self._linger_stop = True
            self._group_cond.notify_all()
        thread.join()
        self._lingering = None

    def _linger(self) -> None:
        """The linger thread: sends the group once its oldest finish has
        waited ``commit_linger``, while the loop is busy with another run.
        What a send raises is kept for the loop to raise."""
        with self._group_cond:
            while not self._linger_stop:
                if not self._group:
                    self._group_cond.wait()
                    continue
                left = self._group_since + self.commit_linger - time.monotonic()
                if left > 0:
                    self._group_cond.wait(left)
                    continue
                try:
                    self._send_group()
                except Exception as e:  # noqa: BLE001 - raised by the loop
                    if self._group_error is None:
                        self._group_error = e

    def _send_group(self) -> None:
        """Sends the pending finishes in one ``commit_steps`` (called with
        the group's lock held). Each run goes under the fence its keeper
        holds now, its gate entered so no renewal swaps that fence while
        the request is in flight; a run lost meanwhile is booked lost and
        not sent. Per run, as a finish of its own would be: committed is
        counted ``completed``; refused as fenced out or cancelled marks the
        holding lost and is booked so, the others unaffected; any other
        refusal is raised once the whole group is booked (the others past
        the first counted ``end_failed``). A request refused whole as
        invalid or too large (nothing written) is sent again run by run;
        any other failure of the request (no answer, outcome unknown, 5xx)
        ends every run's keeper, counts none completed, and is raised, as a
        single finish's is."""
        group, self._group = self._group, []
        if not group:
            return
        live: list[tuple[HeldRun, int, Any]] = []
        judged: list[RunkeepError | None] = []
        one_by_one = False
        with contextlib.ExitStack() as gates:
            for held, result in group:
                gates.enter_context(held._gate.shared())
                try:
                    held.check()
                except LeaseLost as e:
                    held._end()
                    self._book_refused(held, e)
                    continue
                live.append((held, held.fence, result))
            if not live:
                return
            try:
                outcomes = self.client.commit_steps([(held.run, fence, _finish_step(result)) for held, fence, result in live])
                if len(outcomes) != len(live):
                    raise Corrupted(
                        {
                            "type": "urn:runkeep:problem:corrupted",
                            "title": "Malformed answer",
                            "status": 0,
                            "detail": f"a group commit of {len(live)} finishes answered {len(outcomes)} outcomes",
                        }
                    )
            except (InvalidInput, PayloadTooLarge):
                one_by_one = True
            except BaseException:
                for held, _, _ in live:
                    held._end()
                raise
            else:
                judged = [None if o.error is None else held._refused(fence, "commit_steps", o.error) for (held, fence, _), o in zip(live, outcomes)]
        if one_by_one:
            self._finish_each([(held, result) for held, _, result in live])
            return
        first: RunkeepError | None = None
        for (held, _, _), error in zip(live, judged):
            held._end()
            if error is None:
                self.report.completed += 1
            elif error.lost_holding or held.lost.is_set():
                self._book_refused(held, error)
            elif first is None:
                first = error
            else:
                self._book_refused(held, error)
        if first is not None:
            raise first

    def _finish_each(self, group: list[tuple[HeldRun, Any]]) -> None:
        """Finishes each run on its own (``finish``), raising the first
        refusal that did not lose the holding once all were sent."""
        first: RunkeepError | None = None
        for held, result in group:
            try:
                self._finish_one(held, result)
            except RunkeepError as e:
                if first is None:
                    first = e
                else:
                    self._book_refused(held, e)
        if first is not None:
            raise first


def _finish_step(result: Any) -> dict[str, Any]:
    """The step that finishes a run as ``completed`` with ``result``."""
    return {"finish": {"status": "completed", **({} if result is None else {"result": result})}}
