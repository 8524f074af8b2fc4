"""Interrupts as runkeep parks, and what an answer to them resumes with.

An ``interrupt()`` makes LangGraph write an ``__interrupt__`` pending write
on the step's checkpoint, one batch per interrupted task. The saver sends
each batch with a park request (``type: "langgraph-interrupt"``) whose
``interrupts`` list every interrupt of that batch as ``{"id", "value",
"taskId"}``; the server keeps one park per checkpoint and, while it is
unanswered, merges the batches of one step into it (the union by interrupt
id). So the park lists every interrupt the step is waiting on, each with
the id LangGraph resumes it by.

**The answer** (the park's decision, from the console or
``RunkeepClient.resolve_park``):

- **one interrupt**: the decision is its answer, as is (a plain value, or
  ``{interrupt_id: value}``: LangGraph accepts both);
- **several**: the decision must be a JSON object keyed by interrupt id,
  naming every interrupt of the park and nothing else; each value is that
  interrupt's answer. Any other answer is refused by
  :meth:`InterruptPark.resume_value` with :class:`InterruptAnswerError`,
  naming the ids it lacks or does not know (the park cannot be answered
  twice: the thread then needs an operator).

**Resuming in code** with ``Command(resume=…)`` closes the park too: the
saver sends the resume value with the ``__resume__`` write LangGraph makes
(a plain ``Command(resume=v)`` writes it at once, under the null task id:
the park's decision becomes ``v``; a resume map is written by each resumed
task with its output: the first such write closes the park, its decision
``{interrupt_id: value}`` for that task's interrupts, or the bare value
when the park has one interrupt). Each such write names the interrupts it
answers (``resumeOf``: the park's ids as the saver read them), and answers
no others: LangGraph sends the null task's write and the resumed node's
next ``__interrupt__`` at once, and the server may store the next question
first; it stays waiting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from runkeep import RunkeepError

__all__ = [
    "InterruptAnswerError",
    "InterruptPark",
    "PendingInterrupt",
    "PARK_TYPE",
]

#: The ``type`` of a park request the saver sends for an interrupt.
PARK_TYPE = "langgraph-interrupt"


def jsonable(value: Any) -> Any:
    """``value`` as JSON can carry it (anything JSON cannot is its ``repr``)."""
    return json.loads(json.dumps(value, default=repr))


@dataclass(frozen=True)
class PendingInterrupt:
    """One interrupt a park waits on: ``id`` is what LangGraph resumes it by
    (``Command(resume={id: answer})``), ``value`` what ``interrupt()`` was
    given (as JSON), ``task_id`` the task that raised it."""

    id: str
    value: Any
    task_id: str | None


class InterruptAnswerError(RunkeepError):
    """A park's answer that cannot resume its interrupts: with several
    interrupts it must be an object keyed by every interrupt id and nothing
    else. ``missing`` and ``unknown`` name the ids at fault; ``ids`` are
    the park's."""

    def __init__(self, thread_id: str, ids: Sequence[str], decision: Any, missing: Sequence[str], unknown: Sequence[str]) -> None:
        if isinstance(decision, Mapping):
            why = []
            if missing:
                why.append(f"it does not answer {', '.join(missing)}")
            if unknown:
                why.append(f"it names {', '.join(unknown)}, which the park does not wait on")
            reason = " and ".join(why)
        else:
            reason = f"it is a {type(decision).__name__}, not an object keyed by interrupt id"
        super().__init__(
            {
                "type": "urn:runkeep:client:interrupt-answer",
                "title": "Interrupt answer does not fit",
                "status": 422,
                "detail": (
                    f"thread {thread_id!r} waits on {len(ids)} interrupts ({', '.join(ids)}): "
                    f"their answer must be an object with one key per interrupt id, but {reason}"
                ),
            }
        )
        self.thread_id = thread_id
        self.ids = list(ids)
        self.decision = decision
        self.missing = list(missing)
        self.unknown = list(unknown)


@dataclass(frozen=True)
class InterruptPark:
    """The park on a thread checkpoint: the interrupts it waits on and, once
    answered, the decision. ``park_id`` is the runkeep checkpoint to answer
    (``RunkeepClient.resolve_park(saver.run_ref(thread_id), park_id, …)``)."""

    thread_id: str
    ns: str
    checkpoint_id: str
    park_id: str
    interrupts: tuple[PendingInterrupt, ...]
    answered: bool
    decision: Any = None

    @property
    def ids(self) -> list[str]:
        return [i.id for i in self.interrupts]

    def resume_value(self) -> Any:
        """What to resume the graph with (``Command(resume=…)``): the
        decision as is for one interrupt; for several, the decision checked
        to be keyed by exactly the park's interrupt ids
        (:class:`InterruptAnswerError` otherwise). Refused
        (``ValueError``) while unanswered."""
        if not self.answered:
            raise ValueError(f"thread {self.thread_id!r}: the park on checkpoint {self.checkpoint_id} is not answered yet")
        if len(self.interrupts) <= 1:
            return self.decision
        ids = self.ids
        if not isinstance(self.decision, Mapping):
            raise InterruptAnswerError(self.thread_id, ids, self.decision, ids, [])
        missing = [i for i in ids if i not in self.decision]
        unknown = sorted(str(k) for k in self.decision if k not in ids)
        if missing or unknown:
            raise InterruptAnswerError(self.thread_id, ids, self.decision, missing, unknown)
        return {i: self.decision[i] for i in ids}

    @staticmethod
    def of(thread_id: str, body: Mapping[str, Any]) -> "InterruptPark | None":
        """The park a thread checkpoint body (the server's answer) carries,
        when it is one an interrupt opened; else ``None``."""
        park = body.get("park")
        if not park:
            return None
        pending = park["pending"]
        request = pending.get("request") or {}
        if request.get("type") != PARK_TYPE:
            return None
        default_task = request.get("taskId")
        interrupts = tuple(
            PendingInterrupt(id=str(i["id"]), value=i.get("value"), task_id=i.get("taskId", default_task))
            for i in request.get("interrupts", [])
            if i.get("id") is not None
        )
        answered = pending.get("resolvedAt") is not None and "decision" in pending
        return InterruptPark(
            thread_id=thread_id,
            ns=body["ns"],
            checkpoint_id=body["checkpointId"],
            park_id=park["checkpoint"],
            interrupts=interrupts,
            answered=answered,
            decision=pending.get("decision") if answered else None,
        )


def park_request(thread_id: str, ns: str, checkpoint_id: str, task_id: str, value: Any) -> dict[str, Any]:
    """The park request for one task's ``__interrupt__`` write (``value``:
    the tuple of ``Interrupt`` LangGraph writes)."""
    interrupts = value if isinstance(value, (list, tuple)) else [value]
    return {
        "type": PARK_TYPE,
        "thread": thread_id,
        "ns": ns,
        "checkpointId": checkpoint_id,
        "taskId": task_id,
        "interrupts": [
            {"id": getattr(i, "id", None), "value": jsonable(getattr(i, "value", i)), "taskId": task_id} for i in interrupts
        ],
    }


def task_resume(park: InterruptPark | None, task_id: str, values: Any) -> tuple[bool, Any]:
    """The decision a task's own ``__resume__`` write (``values``: the
    answers its interrupts consumed, oldest first) closes ``park`` with:
    ``(False, None)`` when there is no outstanding park to close."""
    if park is None or park.answered:
        return False, None
    got = list(values) if isinstance(values, (list, tuple)) else [values]
    if len(park.interrupts) == 1:
        return True, jsonable(got[-1]) if got else None
    mine = [i.id for i in park.interrupts if i.task_id == task_id]
    if not mine or not got:
        return False, None
    # The park's interrupts of this task are its latest ones: the answers
    # they consumed are the last of the list.
    return True, {i: jsonable(v) for i, v in zip(mine, got[-len(mine) :])}
