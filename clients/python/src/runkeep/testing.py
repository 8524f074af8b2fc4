"""A real ``runkeep serve`` for tests: a fresh directory with its own token
file (and store, for ``fs``), a free port, tokens made with
``runkeep token create``.

The binary is ``$RUNKEEP_BIN``, else ``target/debug/runkeep`` of the
repository this file sits in (``cargo build -p runkeep-cli``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from .client import RunkeepClient, RunRef

_ENV_DROP = ("RUNKEEP_STORE", "RUNKEEP_TENANT", "RUNKEEP_PROJECT", "RUNKEEP_SESSION", "RUNKEEP_TOKENS", "RUNKEEP_LOG")


def runkeep_binary() -> str:
    b = os.environ.get("RUNKEEP_BIN")
    if not b:
        b = str(Path(__file__).resolve().parents[4] / "target" / "debug" / "runkeep")
    if not os.path.exists(b):
        raise RuntimeError(f"no runkeep binary at {b}: build it with `cargo build -p runkeep-cli --bin runkeep --all-features` (or set RUNKEEP_BIN)")
    return b


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env["NO_COLOR"] = "1"
    return env


class Serve:
    """A running ``runkeep serve`` (``memory:`` or ``fs`` store)."""

    def __init__(self, *, store: str = "memory", tenant: str = "acme", project: str = "proj", session: str = "sess") -> None:
        self.tenant, self.project, self.session = tenant, project, session
        self.dir = tempfile.mkdtemp(prefix="runkeep-py-")
        self.tokens = {role: self._token(role) for role in ("reader", "worker", "operator")}
        store_arg = f"fs:{os.path.join(self.dir, 'data')}" if store == "fs" else "memory:"
        args = [
            runkeep_binary(),
            "--store", store_arg,
            "--tenant", tenant,
            "--project", project,
            "--session", session,
            "serve",
            "--listen", "127.0.0.1:0",
            "--tokens", os.path.join(self.dir, "tokens.json"),
            "--shutdown-grace", "2s",
        ]
        self.proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.url = self._wait_url()
        # Drain stdout/stderr so the server never blocks on a full pipe.
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=lambda s=stream: [None for _ in s], daemon=True).start()

    def _token(self, role: str) -> str:
        out = subprocess.run(
            [runkeep_binary(), "--tenant", self.tenant, "--json", "token", "create", "--role", role, "--label", "py-test", "--tokens", os.path.join(self.dir, "tokens.json")],
            env=_env(), capture_output=True, text=True, check=True,
        ).stdout
        return str(json.loads(out)["token"])

    def _wait_url(self) -> str:
        deadline = time.monotonic() + 20
        out = ""
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"runkeep serve exited ({self.proc.returncode}) before listening: {out}{self.proc.stderr.read() if self.proc.stderr else ''}")
                continue
            out += line
            m = re.search(r"listening on (http://[0-9.]+:\d+)", out)
            if m:
                return m.group(1)
        raise RuntimeError(f"runkeep serve printed no address within 20 s: {out}")

    def client(self, role: str = "operator") -> RunkeepClient:
        return RunkeepClient(self.url, self.tokens[role], tenant=self.tenant)

    def run(self, run_id: str) -> RunRef:
        return RunRef(self.project, self.session, run_id)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Serve":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
