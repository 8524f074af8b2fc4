"""Parks from interrupts, end to end through the API: worker 1 runs the
approval graph to its ``interrupt()``, the saver parks the run with a
readable request; an operator answers the park (what the console's answer
does); worker 2 takes the run with ``claim_next`` (answered parks), resumes
the graph with ``Command(resume=answer)`` and finishes it."""

from __future__ import annotations

import sys
import uuid

import pytest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))

import approval  # noqa: E402

from langgraph.checkpoint.runkeep import RunkeepSaver  # noqa: E402


# "yes" as an API answer; the decision the console's Approve records.
@pytest.mark.parametrize("answer", ["yes", {"action": "approve", "by": "operator"}], ids=["api", "console-approve"])
def test_an_interrupt_parks_the_run_and_the_answer_resumes_it_on_another_worker(serve, answer):
    transcript: list[str] = []
    client = serve.client("worker")
    saver = RunkeepSaver(client, project="examples", session=f"a{uuid.uuid4().hex[:8]}")
    thread = f"approval-{'api' if answer == 'yes' else 'console'}"
    approval.worker_one(client, saver, thread, say=transcript.append)
    run = saver.run_ref(thread)
    park = client.find_pending(run)
    assert park is not None, "the interrupt parked the run"
    request = park["pending"]["request"]
    assert request["type"] == "langgraph-interrupt"
    assert request["interrupts"][0]["value"]["question"] == "Ship the draft?"
    assert saver.answered_interrupt(thread) == (False, None)
    transcript.append(f"park {park['id']}: {request['interrupts'][0]['value']}")
    serve.client("operator").resolve_park(run, park["id"], answer)
    transcript.append(f"operator: answered {answer!r}")
    out = approval.worker_two(client, saver, say=transcript.append, wait_s=30)
    print("\n--- parks from interrupts ---\n" + "\n".join(transcript))
    assert out["log"] == ["drafted", "approval: yes", "shipped"]
    assert serve.client("reader").lifecycle(run)["status"] == "completed"
    # Resumed: the answer is not handed out again.
    assert saver.answered_interrupt(thread) == (False, None)
