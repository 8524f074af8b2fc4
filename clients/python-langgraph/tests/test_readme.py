"""The README's code blocks, run in order against a live ``runkeep serve``
(each ```python block, in one namespace, as a reader would paste them):
``builder`` is the approval graph of ``examples/approval.py`` (one
``interrupt()``), ``inputs`` its input. Then checks that they did what the
README says."""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))

import approval  # noqa: E402

README = Path(__file__).parents[1] / "README.md"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_the_readme_blocks_run_and_do_what_it_says(serve) -> None:
    code = blocks()
    assert len(code) >= 6, "the README's examples were found"
    session = f"r{uuid.uuid4().hex[:8]}"
    # The README's project/session, made unique per test run.
    ns: dict = {
        "url": serve.url,
        "worker_token": serve.tokens["worker"],
        "operator_token": serve.tokens["operator"],
        "builder": approval.build(),
        "inputs": {"log": []},
        "__name__": "readme",
    }
    for i, block in enumerate(code):
        block = block.replace('session="threads"', f'session="{session}"')
        exec(compile(block, f"README.md block {i + 1}", "exec"), ns)

    saver = ns["saver"]
    reader = serve.client("reader")
    # Use: t-1 ran to its interrupt (unbound, nothing held).
    # Ownership: t-2 was released at its interrupt, not finished; the
    # operator's answer and the worker then resumed and finished it.
    assert reader.lifecycle(saver.run_ref("t-2"))["status"] == "completed"
    assert ns["worker"].last is not None and ns["worker"].last.output["log"] == ["drafted", "approval: yes", "shipped"]
    # Copy and prune: the copy keeps only its latest checkpoint, with its values.
    copy = list(saver.list({"configurable": {"thread_id": "t-2-copy"}}))
    assert len(copy) == 1
    assert copy[0].checkpoint["channel_values"]["log"] == ["drafted", "approval: yes", "shipped"]
    # delete_for_runs removed t-1's checkpoints of run "r-1" (all of them), and only those.
    assert list(saver.list({"configurable": {"thread_id": "t-1"}})) == []
    assert saver.get_tuple({"configurable": {"thread_id": "t-2"}}) is not None
    # Async: t-3 ran to its interrupt through the async methods.
    t3 = saver.get_tuple({"configurable": {"thread_id": "t-3"}})
    assert t3 is not None and saver.interrupt_park("t-3") is not None
