"""Write ownership, proven with two processes on one thread.

The interleaving is forced (no sleeps decide it): process 1 starts the
thread and blocks inside node ``b`` (a file barrier); its lease lapses
(``fixed``: it is never renewed; ``renewing``: the process is stopped with
SIGSTOP, renewals included); process 2 claims the thread (a higher fence),
resumes it and finishes; then process 1 is let go and tries to write its
own step.

With ownership the stale process is refused with a typed error and the
chain read back holds exactly the legitimate checkpoints, process 2's last
as the latest: 0 forks. Without ownership (the meta-test) both processes
succeed and the chain forks, process 1's branch the latest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from langgraph.checkpoint.runkeep import RunkeepSaver

WORKER = str(Path(__file__).with_name("ownership_worker.py"))


def _spawn(serve, session, thread, role, own, barrier):
    args = [
        sys.executable, WORKER,
        "--url", serve.url, "--token", serve.tokens["worker"], "--tenant", serve.tenant,
        "--session", session, "--thread", thread, "--role", role, "--own", own,
        "--ttl-ms", "1500", "--barrier", barrier,
    ]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_file(path, proc, limit=60):
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early: {proc.stdout.read()} {proc.stderr.read()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _report(proc):
    out, err = proc.communicate(timeout=120)
    line = out.strip().splitlines()[-1] if out.strip() else "{}"
    return proc.returncode, json.loads(line), err


def scenario(serve, own):
    session = f"o{uuid.uuid4().hex[:10]}"
    thread = f"thread-{own}"
    barrier = tempfile.mkdtemp(prefix="rk-own-")
    client = serve.client("operator")
    saver = RunkeepSaver(client, project="ownership", session=session)
    run = saver.run_ref(thread)
    transcript = []

    p1 = _spawn(serve, session, thread, "first", own, barrier)
    _wait_file(os.path.join(barrier, "first-in-b"), p1)
    transcript.append("process 1: wrote its checkpoints, blocked inside node b")
    if own == "renewing":
        os.kill(p1.pid, signal.SIGSTOP)
        transcript.append("process 1: SIGSTOP (its renewals stop too)")
    if own != "none":
        deadline = time.monotonic() + 30
        while True:
            lease = client.lease(run)
            if lease and lease.get("expired"):
                break
            assert time.monotonic() < deadline, f"lease never expired: {lease}"
            time.sleep(0.1)
        transcript.append(f"lease of fence {lease['fence']} expired")
    p2 = _spawn(serve, session, thread, "second", own, barrier)
    rc2, r2, err2 = _report(p2)
    transcript.append(f"process 2: exit {rc2} {r2}")
    assert rc2 == 0, (r2, err2)
    if own == "renewing":
        os.kill(p1.pid, signal.SIGCONT)
        transcript.append("process 1: SIGCONT")
    Path(barrier, "go").touch()
    rc1, r1, err1 = _report(p1)
    transcript.append(f"process 1: exit {rc1} {r1}")

    chain = list(saver.list({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}))
    children = Counter(t.parent_config["configurable"]["checkpoint_id"] for t in chain if t.parent_config)
    forks = sum(n - 1 for n in children.values() if n > 1)
    latest = saver.get_tuple({"configurable": {"thread_id": thread}})
    transcript.append(
        f"chain: {len(chain)} checkpoints, {forks} fork(s); latest step {latest.metadata.get('step')} log {latest.checkpoint['channel_values'].get('log')}"
    )
    print(f"\n--- write ownership: {own} ---\n" + "\n".join(transcript))
    return rc1, r1, err1, r2, chain, forks, latest


@pytest.mark.parametrize("own", ["fixed", "renewing"])
def test_a_superseded_owner_is_refused_and_the_chain_does_not_fork(serve, own):
    rc1, r1, err1, r2, chain, forks, latest = scenario(serve, own)
    assert rc1 == 3 and r1["refused"] == "StaleWriteOwnerError" and r1["stale_marker"] is True, (r1, err1)
    assert r1["presented"] < r2["fence"]
    if own == "fixed":
        # The server refused it (409 fenced-out), naming the new holding.
        assert r1["cause"] == "FencedOut" and r1["current"] >= r2["fence"], r1
    assert forks == 0
    # Exactly the legitimate checkpoints: input, after a, after b (process 2's).
    assert [t.metadata["step"] for t in chain] == [2, 1, 0, -1]
    assert latest.checkpoint["channel_values"]["log"] == ["a:first", "b:second"]


def test_without_ownership_the_chain_forks(serve):
    """The meta-test: the same choreography without ownership forks the
    thread, and the stale process's branch becomes the latest."""
    rc1, r1, err1, r2, chain, forks, latest = scenario(serve, "none")
    assert rc1 == 0 and r1["ok"], (r1, err1)
    assert forks == 1
    assert latest.checkpoint["channel_values"]["log"] == ["a:first", "b:first"]
