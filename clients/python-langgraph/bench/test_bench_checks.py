"""The bench's read-back checks fail for a saver that does not store what it
is given (so a bench run that passes them measured savers that worked)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from langgraph.checkpoint.memory import InMemorySaver

sys.path.insert(0, str(Path(__file__).parent))
import bench_savers as b  # noqa: E402


class LosesAPut(InMemorySaver):
    """Silently drops the put number `lose` (0-based), as a broken saver might."""

    def __init__(self, lose: int) -> None:
        super().__init__()
        self.lose, self.seen = lose, 0

    def put(self, config, checkpoint, metadata, new_versions):  # type: ignore[no-untyped-def]
        self.seen += 1
        if self.seen - 1 == self.lose:
            return {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}
        return super().put(config, checkpoint, metadata, new_versions)


class LosesWrites(InMemorySaver):
    def put_writes(self, config, writes, task_id, task_path=""):  # type: ignore[no-untyped-def]
        return None


def savers(s):  # type: ignore[no-untyped-def]
    return [b.Saver("postgres", s)]


def test_chat_check_passes_for_a_working_saver_and_fails_when_a_turn_is_lost() -> None:
    good = InMemorySaver()
    b.chat_phase(savers(good), 6, "t", random.Random(1))
    b.check_chat(good, "t-chat", 6)
    # the last turn's final checkpoint lost: the thread reads back one reply short
    bad = LosesAPut(lose=6 * 2 - 1)
    b.chat_phase(savers(bad), 6, "t", random.Random(1))
    with pytest.raises(b.Failed):
        b.check_chat(bad, "t-chat", 6)


def test_invocation_check_fails_when_a_checkpoint_is_lost() -> None:
    good = InMemorySaver()
    b.invoke_phase(savers(good), 3, "t", random.Random(1))
    b.check_small(good, "t-one", 3)
    bad = LosesAPut(lose=3 * 5 + 4)  # 3 fresh threads of 5 puts each, then the one thread's 5th
    b.invoke_phase(savers(bad), 3, "t", random.Random(1))
    with pytest.raises(b.Failed):
        b.check_small(bad, "t-one", 3)


@pytest.mark.parametrize("broken", [LosesAPut(lose=7), LosesWrites()])
def test_put_check_fails_when_a_put_or_its_writes_are_lost(broken: InMemorySaver) -> None:
    rates, putters = b.put_phase(savers(InMemorySaver()), 8, 3, "t", random.Random(1))
    b.check_puts(putters["postgres"], full_list=True)
    rates, putters = b.put_phase(savers(broken), 8, 3, "t", random.Random(1))
    with pytest.raises(b.Failed):
        b.check_puts(putters["postgres"], full_list=True)
