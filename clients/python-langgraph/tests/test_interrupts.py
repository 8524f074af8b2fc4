"""Interrupts as parks, their answers, and RunkeepGraphWorker, end to end
against a live ``runkeep serve``: every interrupt of a step in one park
with its id; an answer to several interrupts keyed by id (and one that
misses an id refused, the thread unchanged); ``Command(resume=…)`` in code
closing the park; a graph interrupted twice released and resumed again;
``claim_thread`` telling a finished thread from a held one."""

from __future__ import annotations

import uuid

import pytest
from langgraph.types import Command

import graphs
from langgraph.checkpoint.runkeep.saver import NULL_TASK_ID
from langgraph.checkpoint.runkeep import (
    InterruptAnswerError,
    RunkeepGraphWorker,
    RunkeepSaver,
    ThreadFinished,
)


@pytest.fixture
def saver(serve) -> RunkeepSaver:
    return RunkeepSaver(serve.client("worker"), project="interrupts", session=f"i{uuid.uuid4().hex[:10]}")


def log_result(out):
    return {"log": out["log"]}


def test_two_interrupts_in_one_step_make_one_park_with_both_ids_answered_with_a_map(serve, saver):
    thread = "two-1"
    out = graphs.start(saver, thread, graphs.two_interrupts())
    asked = {i.id: i.value["q"] for i in out["__interrupt__"]}
    assert len(asked) == 2
    run = saver.run_ref(thread)

    pending = serve.client("reader").find_pending(run)
    request = pending["pending"]["request"]
    assert {i["id"] for i in request["interrupts"]} == set(asked), "one park lists both interrupts"
    assert len({i["taskId"] for i in request["interrupts"]}) == 2, "each with the task that raised it"
    park = saver.interrupt_park(thread)
    assert park is not None and set(park.ids) == set(asked) and not park.answered
    assert park.park_id == pending["id"]
    assert saver.answered_interrupt(thread) == (False, None)

    answer = {i: f"ans-{q}" for i, q in asked.items()}
    serve.client("operator").resolve_park(run, park.park_id, answer)
    assert saver.answered_interrupt(thread) == (True, answer)

    worker = RunkeepGraphWorker(graphs.two_interrupts().compile(), saver, holder="w", wait_ms=2_000, result=log_result)
    outcome = worker.run_once(wait_s=30)
    assert outcome is not None, worker.report
    assert (outcome.how, outcome.interrupted) == ("resumed", False)
    assert sorted(outcome.output["log"]) == ["a:ans-a?", "b:ans-b?"]
    life = serve.client("reader").lifecycle(run)
    assert life["status"] == "completed"
    assert saver.interrupt_park(thread) is None


@pytest.mark.parametrize("kind", ["misses an id", "names an unknown id", "is not keyed by id"])
def test_an_answer_that_does_not_fit_several_interrupts_is_refused_naming_the_ids(serve, saver, kind):
    thread = f"bad-{kind.replace(' ', '-')}"
    out = graphs.start(saver, thread, graphs.two_interrupts())
    ids = sorted(i.id for i in out["__interrupt__"])
    run = saver.run_ref(thread)
    park = saver.interrupt_park(thread)
    answer = {
        "misses an id": {ids[0]: "x"},
        "names an unknown id": {ids[0]: "x", ids[1]: "y", "f" * 32: "z"},
        "is not keyed by id": "yes",
    }[kind]
    serve.client("operator").resolve_park(run, park.park_id, answer)
    before = saver.get_tuple({"configurable": {"thread_id": thread}})

    with pytest.raises(InterruptAnswerError) as e:
        saver.answered_interrupt(thread)
    message = str(e.value)
    for i in ids:
        assert i in message, "the refusal names the park's interrupt ids"
    if kind == "misses an id":
        assert e.value.missing == [ids[1]] and ids[1] in message
    if kind == "names an unknown id":
        assert e.value.unknown == ["f" * 32] and "f" * 32 in message

    # The worker reports the attempt failed and leaves the thread as it was.
    worker = RunkeepGraphWorker(graphs.two_interrupts().compile(), saver, holder="w", wait_ms=2_000)
    assert worker.run_once(wait_s=10) is None
    assert worker.report.failed == 1 and worker.report.completed == 0
    life = serve.client("reader").lifecycle(run)
    assert life.failures[0].kind == "InterruptAnswerError"
    after = saver.get_tuple({"configurable": {"thread_id": thread}})
    assert after.config == before.config and after.pending_writes == before.pending_writes


def test_command_resume_in_code_closes_the_park(serve, saver):
    thread = "in-code-1"
    held = saver.claim_thread(thread, holder="me")
    graph = graphs.two_interrupts().compile(checkpointer=saver.owned(thread, held))
    config = {"configurable": {"thread_id": thread}}
    out = graph.invoke({"log": []}, config, durability="sync")
    run = saver.run_ref(thread)
    reader = serve.client("reader")
    parked = reader.find_pending(run)
    assert parked is not None
    answers = {i.id: f"code-{i.value['q']}" for i in out["__interrupt__"]}

    out = graph.invoke(Command(resume=answers), config, durability="sync")
    assert sorted(out["log"]) == ["a:code-a?", "b:code-b?"]
    assert reader.find_pending(run) is None, "resumed in code: the park no longer waits"
    closed = reader.read_checkpoint(run, parked["id"])["pending"]
    assert closed["resolvedAt"] is not None
    decision = closed["decision"]
    assert decision and all(answers[k] == v for k, v in decision.items()), decision
    held.finish()


def test_the_null_task_resume_write_closes_the_park_by_itself(serve, saver):
    """A plain ``Command(resume=v)`` makes LangGraph write ``__resume__``
    under the null task id before the node runs: that write alone closes
    the park, with ``v`` (the node's own write, which would close it too,
    may never come: its process can die first)."""
    thread = "in-code-3"
    held = saver.claim_thread(thread, holder="me")
    owned = saver.owned(thread, held)
    graph = graphs.fails_after_answer().compile(checkpointer=owned)
    config = {"configurable": {"thread_id": thread}}
    graph.invoke({"log": []}, config, durability="sync")
    run = saver.run_ref(thread)
    reader = serve.client("reader")
    parked = reader.find_pending(run)
    assert parked is not None
    tip = owned.get_tuple(config)
    owned.put_writes(tip.config, [("__resume__", "go")], "00000000-0000-0000-0000-000000000000")
    assert reader.find_pending(run) is None
    assert reader.read_checkpoint(run, parked["id"])["pending"]["decision"] == "go"
    # LangGraph then resumes from that write: the node reads "go" (and fails).
    with pytest.raises(RuntimeError, match="failed after the answer 'go'"):
        graph.invoke(None, config, durability="sync")
    held.release()


def test_a_resumed_node_asking_again_opens_a_new_park_on_the_same_checkpoint(serve, saver):
    thread = "in-code-2"
    held = saver.claim_thread(thread, holder="me")
    graph = graphs.asks_twice().compile(checkpointer=saver.owned(thread, held))
    config = {"configurable": {"thread_id": thread}}
    graph.invoke({"log": []}, config, durability="sync")
    run = saver.run_ref(thread)
    reader = serve.client("reader")
    first = reader.find_pending(run)
    graph.invoke(Command(resume="one"), config, durability="sync")
    # The node asked again on the same checkpoint: the answered park gave way to the new question.
    second = reader.find_pending(run)
    assert second is not None and second["pending"].get("resolvedAt") is None
    assert [i["value"]["q"] for i in second["pending"]["request"]["interrupts"]] == ["second?"]
    assert second["id"] == first["id"]
    held.release()


class _ResumeHeldBack:
    """Wraps ``client.put_thread_writes`` so that the null task's
    ``__resume__`` batch (what ``Command(resume=v)`` writes before the node
    runs) is sent only once a batch carrying an ``__interrupt__`` write has
    been stored: the order LangGraph's background executor can produce,
    made every time."""

    def __init__(self, client) -> None:
        import threading

        self.inner = client.put_thread_writes
        self.interrupt_stored = threading.Event()
        self.order: list[str] = []
        self.waited = False

    def __call__(self, run, body, *args, **kwargs):
        channels = {w["channel"] for w in body.get("writes", [])}
        null_resume = body.get("taskId") == NULL_TASK_ID and "__resume__" in channels
        if null_resume:
            self.waited = self.interrupt_stored.wait(timeout=20)
        out = self.inner(run, body, *args, **kwargs)
        self.order.append("null-resume" if null_resume else ("interrupt" if "__interrupt__" in channels else "other"))
        if "__interrupt__" in channels:
            self.interrupt_stored.set()
        return out


def test_a_resume_stored_after_the_next_question_does_not_answer_it(serve, saver, monkeypatch):
    """LangGraph's sync loop hands every ``put_writes`` to its background
    executor: the null task's ``__resume__`` (written before the node runs)
    and the node's next ``__interrupt__`` can reach the server in either
    order. Forced here to the late one: the resume answers the question it
    was given for, never the one asked after it."""
    thread = "late-resume-1"
    held = saver.claim_thread(thread, holder="me")
    owned = saver.owned(thread, held)
    graph = graphs.asks_twice().compile(checkpointer=owned)
    config = {"configurable": {"thread_id": thread}}
    graph.invoke({"log": []}, config, durability="sync")
    run = saver.run_ref(thread)
    reader = serve.client("reader")
    first = reader.find_pending(run)
    assert [i["value"]["q"] for i in first["pending"]["request"]["interrupts"]] == ["first?"]

    hold = _ResumeHeldBack(saver.client)
    hold.interrupt_stored.clear()
    monkeypatch.setattr(saver.client, "put_thread_writes", hold)
    graph.invoke(Command(resume="one"), config, durability="sync")
    monkeypatch.undo()
    assert hold.waited and hold.order == ["interrupt", "null-resume"], hold.order

    second = reader.find_pending(run)
    assert second is not None, "the second question is still waiting"
    assert second["pending"].get("resolvedAt") is None
    assert [i["value"]["q"] for i in second["pending"]["request"]["interrupts"]] == ["second?"]
    assert second["id"] == first["id"]

    # Answered in turn, the graph ends with both answers.
    out = graph.invoke(Command(resume="two"), config, durability="sync")
    assert out["log"] == ["first:one", "second:two"]
    assert reader.find_pending(run) is None
    held.release()


def test_a_graph_interrupted_again_is_released_then_resumed_again_by_the_worker(serve, saver):
    thread = "twice-1"
    graphs.start(saver, thread, graphs.asks_twice())
    run = saver.run_ref(thread)
    operator = serve.client("operator")
    reader = serve.client("reader")
    worker = RunkeepGraphWorker(graphs.asks_twice().compile(), saver, holder="w", wait_ms=2_000, result=log_result)

    operator.resolve_park(run, saver.interrupt_park(thread).park_id, "one")
    outcome = worker.run_once(wait_s=30)
    assert outcome is not None and outcome.interrupted and outcome.resume == "one"
    assert reader.lifecycle(run)["status"] == "active", "interrupted again: released, not finished"
    assert reader.lease(run) is None or reader.lease(run).get("holder") in (None, ""), "released"
    park = saver.interrupt_park(thread)
    assert not park.answered and [i.value["q"] for i in park.interrupts] == ["second?"]

    operator.resolve_park(run, park.park_id, "two")
    outcome = worker.run_once(wait_s=30)
    assert outcome is not None and not outcome.interrupted
    assert outcome.output["log"] == ["first:one", "second:two"]
    assert reader.lifecycle(run)["status"] == "completed"
    assert worker.report.completed == 1 and worker.report.failed == 0


def test_claim_thread_tells_a_finished_thread_from_a_held_one(serve, saver):
    thread = "fin-1"
    held = saver.claim_thread(thread, holder="one")
    assert held is not None
    assert saver.claim_thread(thread, holder="two") is None, "held live by another owner"
    held.finish()
    with pytest.raises(ThreadFinished) as e:
        saver.claim_thread(thread, holder="two")
    assert e.value.run_status == "completed"
    assert "reopen" in str(e.value)
    # What the error names works: reopened, the thread can be claimed again.
    serve.client("operator").reopen(saver.run_ref(thread))
    again = saver.claim_thread(thread, holder="two")
    assert again is not None
    again.release()


async def test_aclaim_write_ownership_tells_a_finished_thread_from_a_held_one(serve, saver):
    thread = "fin-2"
    owned = await saver.aclaim_write_ownership(thread, ttl_ms=60_000)
    with pytest.raises(Exception) as e:
        await saver.aclaim_write_ownership(thread)
    assert not isinstance(e.value, ThreadFinished) and "held live" in str(e.value)
    saver.client.finish(saver.run_ref(thread), owned._owner[1].fence)
    with pytest.raises(ThreadFinished):
        await saver.aclaim_write_ownership(thread)
    await saver.aclose()


def test_a_thread_whose_worker_died_after_the_answer_is_continued_from_its_latest_checkpoint(serve, saver):
    thread = "died-1"
    graphs.start(saver, thread, graphs.approval())
    run = saver.run_ref(thread)
    serve.client("operator").resolve_park(run, saver.interrupt_park(thread).park_id, "yes")

    # A first resumer takes the answer, gets past the approval and dies in
    # `ship` (its holding is never ended; its lease lapses). The lease is
    # long enough that a loaded machine renews it in time while it runs.
    held = saver.claim_thread(thread, holder="dies", ttl_ms=2_000)
    with pytest.raises(KeyboardInterrupt):
        graphs.approval(die_in_ship=True).compile(checkpointer=saver.owned(thread, held)).invoke(Command(resume="yes"), {"configurable": {"thread_id": thread}}, durability="sync")
    held.stop_renewing()
    assert saver.interrupt_park(thread) is None, "the graph moved past its answered park"

    worker = RunkeepGraphWorker(graphs.approval().compile(), saver, holder="w", wait_ms=2_000, result=log_result)
    outcome = worker.run_once(wait_s=30)
    assert outcome is not None and outcome.how == "continued" and not outcome.interrupted, worker.report
    assert outcome.output["log"] == ["drafted", "approval: yes", "shipped"]
    assert serve.client("reader").lifecycle(run)["status"] == "completed"
