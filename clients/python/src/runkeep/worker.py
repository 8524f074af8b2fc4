"""The lease-keeping worker helper.

For each run it takes, :class:`Worker`:

1. **claims** with ``claim_next`` and a long-poll (``wait_ms``), so an idle
   worker waits at the server instead of polling;
2. **keeps** the lease (:class:`HeldRun`): renews (a claim by the same
   holder, which mints a new, higher fence) every third of the TTL,
   measured from when the previous claim was *sent*. Renewals and writes
   exclude each other, so no write presents a fence a renewal is retiring;
3. **stops the work the moment the lease is lost**: ``held.lost`` is set
   (and the handler's ``held.check()`` raises :class:`LeaseLost`) when a
   renewal finds another holder, when a write is refused as fenced out, or
   when no renewal landed before the safety margin (a tenth of the TTL
   before the local deadline, on the monotonic clock from when the claim
   was sent, so never later than the store's). A renewal is never sent
   after that margin: a lease that lapsed is lost, not re-taken;
4. **writes through the atomic step** (``held.step(step)``: one
   ``POST …/steps`` under the current fence) or any fenced write
   (``held.fenced(lambda fence: ...)``);
5. **ends the holding** by what the handler returned: finish (default),
   release or snooze; a handler that raises has its run released. When
   :meth:`Worker.run` would claim again anyway, the finish is a hand-over
   (``commit_step_and_claim_next``: a finishing step and the next claim in
   one request); the next run it took is handled without a ``claim_next``.

Python threads cannot be killed: the sync handler is stopped cooperatively
(``held.lost``, ``held.check()``, and every write refused once lost).

This is the worker protocol every runkeep runtime follows (Rust, TypeScript,
Python), written down once in the repository's
``docs/design/worker-protocol.md``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .client import ClaimAnswer, HandOver, Lease, RunkeepClient, RunRef
from .errors import FencedOut, RunkeepError


class LeaseLost(RunkeepError):
    """The holding is gone: ``kind`` is ``superseded`` (another holder has
    the run), ``fenced-out`` (a write was refused), ``expiring`` (no renewal
    before the safety margin) or ``renewal-failed``."""

    def __init__(self, kind: str, fence: int, detail: str, current: int | None = None) -> None:
        super().__init__({"type": "urn:runkeep:client:lease-lost", "title": "Lease lost", "status": 0, "detail": detail})
        self.kind = kind
        self.fence = fence
        self.current = current


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
        on_event: Callable[[dict], None] | None = None,
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
            else:
                self._lose(LeaseLost("renewal-failed", old, f"the run answered {answer.outcome} while fence {old} was held"))
            return

    # -- writes --------------------------------------------------------
    def check(self) -> None:
        """Raises :class:`LeaseLost` once the holding is lost or within its margin."""
        if self.lost.is_set() and self.loss is not None:
            raise self.loss
        if time.monotonic() >= self.deadline - self.safety:
            self._lose(LeaseLost("expiring", self.fence, f"fence {self.fence} is within the safety margin of its deadline"))
            raise self.loss  # type: ignore[misc]

    def fenced(self, write: Callable[[int], Any]) -> Any:
        """Runs ``write(fence)`` under the current fence, excluded from
        renewals; refused locally once lost; a ``FencedOut`` answer marks
        the holding lost (and is raised)."""
        with self._gate.shared():
            self.check()
            fence = self.fence
            try:
                return write(fence)
            except FencedOut as e:
                self._lose(LeaseLost("fenced-out", fence, str(e), e.current))
                raise

    def step(self, step: Mapping[str, Any]) -> dict:
        """One atomic step (events, checkpoint, messages, record, finish)."""
        return self.fenced(lambda fence: self.client.commit_step(self.run, fence, step))

    # -- endings -------------------------------------------------------
    def _end(self) -> None:
        self.ended = True
        self._stop.set()

    def finish(self, status: str = "completed", *, result: Any = None, reason: str | None = None) -> dict:
        try:
            return self.fenced(lambda fence: self.client.finish(self.run, fence, status, result=result, reason=reason))
        finally:
            self._end()

    def release(self) -> bool:
        self._stop.set()
        with self._gate.shared():
            try:
                return bool(self.client.release(self.run, self.fence))
            except FencedOut:
                return False
            finally:
                self._end()

    def snooze(self, until_ms: int) -> bool:
        try:
            return bool(self.fenced(lambda fence: self.client.snooze(self.run, fence, until_ms)))
        finally:
            self._end()

    def stop_renewing(self) -> None:
        self._stop.set()

    def __enter__(self) -> "HeldRun":
        return self.start()

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if not self.ended:
            if exc_type is None:
                self.finish()
            elif not self.lost.is_set():
                self.release()
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


class Worker:
    """Claims runs with ``claim_next`` and hands each to a handler as a
    :class:`HeldRun` whose lease it keeps."""

    def __init__(self, client: RunkeepClient, *, holder: str | None = None, ttl_ms: int = 30_000, project: str | None = None, session: str | None = None, park: list[str] | None = None, wait_ms: int = 20_000, on_event: Callable[[dict], None] | None = None) -> None:
        self.client = client
        self.holder = holder or default_holder()
        self.ttl_ms = ttl_ms
        self.project = project
        self.session = session
        self.park = park
        self.wait_ms = wait_ms
        self.on_event = on_event

    def _held(self, run: RunRef, lease: Lease, sent: float) -> HeldRun:
        return HeldRun(self.client, run, lease, holder=self.holder, ttl_ms=self.ttl_ms, sent_at=sent, on_event=self.on_event)

    def claim_next(self, wait_ms: int | None = None) -> HeldRun | None:
        """The next runnable run (long-poll up to ``wait_ms``), held and renewing; ``None`` when none came."""
        sent = time.monotonic()
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
        step = {"finish": {"status": "completed", **({} if result is None else {"result": result})}}
        sent = time.monotonic()

        def write(fence: int) -> HandOver:
            nonlocal sent
            sent = time.monotonic()
            return self.client.commit_step_and_claim_next(held.run, fence, step, holder=self.holder, ttl_ms=self.ttl_ms, project=self.project, session=self.session, park=self.park)

        try:
            over: HandOver = held.fenced(write)
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
        that result; a raised :class:`LeaseLost` abandons it; another
        exception releases it. Answers how many runs were handled.

        While another run is wanted (``stop`` not set, ``max_runs`` not
        reached), that finish is a hand-over
        (:meth:`finish_and_claim_next`) and the run it took is handled
        next, as a run ``claim_next`` answered would be; when it took none,
        the loop long-polls ``claim_next`` as before."""
        done = 0

        def wanted() -> bool:
            return (stop is None or not stop.is_set()) and (max_runs is None or done < max_runs)

        while wanted():
            held = self.claim_next()
            while held is not None:
                done += 1
                held = self._handle(handler, held, wanted)
        return done

    def _handle(self, handler: Callable[[HeldRun], Any], held: HeldRun, wanted: Callable[[], bool]) -> HeldRun | None:
        """Runs the handler on ``held`` and ends the holding; answers the
        run a hand-over took (only when another run is ``wanted()`` once
        the handler returned)."""
        try:
            result = handler(held)
        except LeaseLost:
            held.stop_renewing()
            return None
        except Exception:
            if not held.ended:
                held.release()
            return None
        if held.ended:
            return None
        try:
            if wanted():
                return self.finish_and_claim_next(held, result=result)
            held.finish(result=result)
        except (LeaseLost, FencedOut):
            pass
        return None
