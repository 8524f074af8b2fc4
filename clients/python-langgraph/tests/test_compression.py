"""Large channel values and writes are stored deflated (``zlib:<type>``)
and read back as given; small ones are stored as they are."""

from __future__ import annotations

import uuid

from langgraph.checkpoint.base import empty_checkpoint

from langgraph.checkpoint.runkeep import RunkeepSaver
from langgraph.checkpoint.runkeep.saver import ZLIB_PREFIX


def test_a_large_value_is_stored_deflated_and_read_back_whole(serve) -> None:
    saver = RunkeepSaver(serve.client("worker"), project="compress", session=f"c{uuid.uuid4().hex[:10]}")
    messages = [{"role": "user", "content": f"message {i} " + "words " * 20} for i in range(200)]
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": messages, "small": 7}
    cp["channel_versions"] = {"messages": saver.get_next_version(None, None), "small": saver.get_next_version(None, None)}
    config = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, cp, {"step": 0}, dict(cp["channel_versions"]))
    saver.put_writes(config, [("messages", messages), ("small", 1)], task_id="task-1")

    got = saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert got is not None
    assert got.checkpoint["channel_values"] == {"messages": messages, "small": 7}
    assert [(c, v) for _, c, v in got.pending_writes] == [("messages", messages), ("small", 1)]

    # As stored: the large value deflated and smaller than its JSON, the
    # small one as it was.
    raw = saver.client.get_thread_checkpoint(saver.run_ref("t"), ns="")
    types = {b["channel"]: b["type"] for b in raw["values"]}
    assert types["messages"].startswith(ZLIB_PREFIX), types
    assert not types["small"].startswith(ZLIB_PREFIX), types
    stored = next(b for b in raw["values"] if b["channel"] == "messages")
    assert len(stored["data"]) < len(str(messages)) / 3
    wtypes = [w["type"] for w in raw["writes"]]
    assert wtypes[0].startswith(ZLIB_PREFIX) and not wtypes[1].startswith(ZLIB_PREFIX), wtypes
