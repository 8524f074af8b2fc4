"""A worker that resumes answered threads by itself.

:class:`RunkeepGraphWorker` runs a :class:`runkeep.Worker` over the saver's
session with the park filter ``resolved``: the server hands it (long-poll,
no listing by the user) a thread's run once every park of it is answered
and nobody holds it. For each it:

1. reads the thread's latest root checkpoint (one request: it names the
   thread and carries its park);
2. resumes the graph under write ownership (``saver.owned(thread, held)``,
   ``durability="sync"``): with ``Command(resume=park.resume_value())``
   when the park there is answered; with ``None`` when the graph moved on
   from its last answered park and stopped mid-way (its worker died): the
   graph continues from its latest checkpoint;
3. ends the holding by how the graph stopped: **released** when it is
   interrupted again (the thread waits on its new park, and comes back to
   a worker once that is answered), **finished** (``completed``, with
   ``result(output)``) when the graph ended.

An answer that does not fit the interrupts
(:class:`~langgraph.checkpoint.runkeep.interrupts.InterruptAnswerError`)
or a graph that raises fails the attempt (``fail_attempt``: the store
keeps the error, defers the run by its backoff, dead-letters it at its
limit); a superseded worker's write is refused
(:class:`~langgraph.checkpoint.runkeep.StaleWriteOwnerError`) and that run
gets nothing more from it. Static ``interrupt_before``/``interrupt_after``
breakpoints open no park and are not supported: a worker continuing such
a thread runs past them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Command
from runkeep import HeldRun, RunRef, Worker, WorkerReport

from .interrupts import InterruptPark
from .saver import RunkeepSaver

__all__ = ["GraphStoppedWithoutInterrupt", "RunkeepGraphWorker", "ThreadOutcome"]


class GraphStoppedWithoutInterrupt(RuntimeError):
    """The graph stopped with work left and no interrupt to wait on (a
    static breakpoint): the worker cannot tell when to go on, so the
    attempt fails instead of releasing a run it would take again at once."""


@dataclass(frozen=True)
class ThreadOutcome:
    """What the worker did with one thread: ``how`` is ``resumed`` (with
    the park's answer, ``resume``) or ``continued`` (from the latest
    checkpoint); ``interrupted`` says the graph stopped at a new interrupt
    (the run was released) rather than ending (finished)."""

    thread_id: str
    run: RunRef
    how: str
    resume: Any
    interrupted: bool
    output: Any


class RunkeepGraphWorker:
    """Resumes the threads of ``saver``'s session whose interrupts were
    answered, with ``graph`` (compiled; its own checkpointer is replaced by
    the saver bound to each thread's holding).

    ``result(output)`` is the run's result when the graph ends (default:
    none). ``holder``, ``ttl_ms``, ``wait_ms``, ``attempt_timeout``,
    ``max_attempts`` and ``on_event`` are :class:`runkeep.Worker`'s.
    ``on_outcome`` is called with each :class:`ThreadOutcome`.
    """

    def __init__(
        self,
        graph: "Pregel[Any, Any, Any, Any]",
        saver: RunkeepSaver,
        *,
        holder: str | None = None,
        ttl_ms: int = 30_000,
        wait_ms: int = 20_000,
        attempt_timeout: float | None = None,
        max_attempts: int | None = None,
        result: Callable[[Any], Any] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        on_outcome: Callable[[ThreadOutcome], None] | None = None,
    ) -> None:
        self.graph = graph
        self.saver = saver
        self.result = result
        self.on_outcome = on_outcome
        self.last: ThreadOutcome | None = None
        self.worker = Worker(
            saver.client,
            holder=holder,
            ttl_ms=ttl_ms,
            project=saver.project,
            session=saver.session,
            park=["resolved"],
            wait_ms=wait_ms,
            on_event=on_event,
            attempt_timeout=attempt_timeout,
            max_attempts=max_attempts,
        )

    @property
    def report(self) -> WorkerReport:
        """What the underlying :class:`runkeep.Worker` counted."""
        return self.worker.report

    def run(self, *, stop: threading.Event | None = None, max_runs: int | None = None) -> int:
        """Resumes threads until ``stop`` is set (or ``max_runs`` were
        handled); answers how many were handled."""
        return self.worker.run(self.handle, stop=stop, max_runs=max_runs)

    def run_once(self, wait_s: float = 20.0) -> ThreadOutcome | None:
        """Handles one thread, waiting up to about ``wait_s`` for one to be
        answered; answers what was done (``None`` when none came, or the
        attempt failed or was lost: :attr:`report` says which)."""
        stop = threading.Event()
        timer = threading.Timer(wait_s, stop.set)
        timer.daemon = True
        timer.start()
        self.last = None
        try:
            self.worker.run(self.handle, stop=stop, max_runs=1)
        finally:
            timer.cancel()
        return self.last

    def handle(self, held: HeldRun) -> Any:
        """One claimed thread: resume or continue it, then release it
        (interrupted again) or answer its result (the worker finishes it)."""
        body = self.saver.client.get_thread_checkpoint(held.run)
        if body is None:
            raise LookupError(f"run {held.run.run} keeps no thread checkpoint: not a LangGraph thread of this saver")
        thread = str(body["thread"])
        park = InterruptPark.of(thread, body)
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        graph = self.graph.copy(update={"checkpointer": self.saver.owned(thread, held)})
        if park is not None and park.answered:
            how, resume = "resumed", park.resume_value()
            output = graph.invoke(Command(resume=resume), config, durability="sync")
        else:
            how, resume = "continued", None
            if not graph.get_state(config).next:
                return self._done(held, thread, how, resume, False, None)
            output = graph.invoke(None, config, durability="sync")
        state = graph.get_state(config)
        if state.interrupts:
            held.release()
            return self._done(held, thread, how, resume, True, output)
        if state.next:
            raise GraphStoppedWithoutInterrupt(
                f"thread {thread!r} stopped before {list(state.next)} with no interrupt to wait on (a static breakpoint?): not supported by RunkeepGraphWorker"
            )
        return self._done(held, thread, how, resume, False, output)

    def _done(self, held: HeldRun, thread: str, how: str, resume: Any, interrupted: bool, output: Any) -> Any:
        outcome = ThreadOutcome(thread, held.run, how, resume, interrupted, output)
        self.last = outcome
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        if interrupted or self.result is None:
            return None
        return self.result(output)
