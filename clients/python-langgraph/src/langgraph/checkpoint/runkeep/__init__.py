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
  opens a runkeep park on that checkpoint (every interrupt of the step,
  with its id: :mod:`.interrupts`), unless ``parks=False``; a
  ``__resume__`` write closes it.

Modules: :mod:`.saver` (the saver, ownership, errors), :mod:`.interrupts`
(parks and their answers), :mod:`.worker` (:class:`RunkeepGraphWorker`,
which resumes answered threads by itself).
"""

from .interrupts import InterruptAnswerError, InterruptPark, PendingInterrupt
from .saver import FixedFence, RunkeepSaver, StaleWriteOwnerError, ThreadFinished, WriteLease, thread_run_id
from .worker import GraphStoppedWithoutInterrupt, RunkeepGraphWorker, ThreadOutcome

__all__ = [
    "FixedFence",
    "GraphStoppedWithoutInterrupt",
    "InterruptAnswerError",
    "InterruptPark",
    "PendingInterrupt",
    "RunkeepGraphWorker",
    "RunkeepSaver",
    "StaleWriteOwnerError",
    "ThreadFinished",
    "ThreadOutcome",
    "WriteLease",
    "thread_run_id",
]
