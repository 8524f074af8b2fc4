"""copy_thread, delete_for_runs and prune beyond what LangGraph's suite
checks: a pruned thread's latest checkpoint keeps values that earlier
checkpoints stored; bad input is refused with nothing changed."""

from __future__ import annotations

import uuid

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph.checkpoint.runkeep import FixedFence, RunkeepSaver


@pytest.fixture
def saver(serve) -> RunkeepSaver:
    return RunkeepSaver(serve.client("worker"), project="optional", session=f"o{uuid.uuid4().hex[:10]}")


def chain(saver: RunkeepSaver, thread: str, n: int = 3, run_id: str = "r") -> list[dict]:
    """``n`` checkpoints; only the first writes channel ``kept`` (later
    ones carry its version and store nothing for it)."""
    config: dict = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    out = []
    for i in range(n):
        cp = empty_checkpoint()
        cp["channel_values"] = {"kept": "from the first", "step": i}
        cp["channel_versions"] = {"kept": saver.get_next_version(None, None) if i == 0 else out[0]["kept"], "step": saver.get_next_version(None, None)}
        new = {"step": cp["channel_versions"]["step"]} if i else dict(cp["channel_versions"])
        config = saver.put(config, cp, {"step": i, "run_id": run_id}, new)
        out.append({"kept": cp["channel_versions"]["kept"], "config": config})
    return out


def test_prune_keep_latest_keeps_the_values_earlier_checkpoints_stored(saver):
    made = chain(saver, "p-1")
    latest = saver.get_tuple({"configurable": {"thread_id": "p-1"}})
    assert latest.checkpoint["channel_values"]["kept"] == "from the first"
    saver.prune(["p-1"], strategy="keep_latest")
    left = list(saver.list({"configurable": {"thread_id": "p-1"}}))
    assert [t.config for t in left] == [made[-1]["config"]]
    assert left[0].checkpoint["channel_values"] == {"kept": "from the first", "step": 2}


def test_bad_input_is_refused_and_changes_nothing(saver):
    chain(saver, "b-1")
    chain(saver, "b-2", run_id="other")
    before = {t: [x.config for x in saver.list({"configurable": {"thread_id": t}})] for t in ("b-1", "b-2")}

    with pytest.raises(ValueError, match="unknown strategy"):
        saver.prune(["b-1"], strategy="keep_oldest")
    with pytest.raises(ValueError, match="not one string"):
        saver.prune("b-1")
    with pytest.raises(ValueError, match="has no checkpoints"):
        saver.copy_thread("nobody", "b-3")
    with pytest.raises(ValueError, match="already has checkpoints"):
        saver.copy_thread("b-1", "b-2")
    # A saver bound to b-1 may not delete b-2's checkpoints of run "other"
    # (nor b-1's of it: the refusal comes before anything is deleted).
    chain(saver, "b-1x", run_id="other")
    bound = saver.owned("b-1x", FixedFence(1))
    with pytest.raises(ValueError, match="owns thread"):
        bound.delete_for_runs(["other"])

    after = {t: [x.config for x in saver.list({"configurable": {"thread_id": t}})] for t in ("b-1", "b-2")}
    assert after == before
    assert len(list(saver.list({"configurable": {"thread_id": "b-1x"}}))) == 3
    assert list(saver.list({"configurable": {"thread_id": "b-3"}})) == []
