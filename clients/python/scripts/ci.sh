#!/usr/bin/env bash
# The Python clients' CI: clients/python (runkeep) and clients/python-langgraph
# (langgraph-checkpoint-runkeep). Makes a CPython 3.11 venv under
# target/python-clients (reused while clients/python/requirements.lock and the
# interpreter are unchanged), installs the pinned requirements, and runs both
# packages' tests against live `runkeep serve`s (each test module starts its
# own on a free port): the client's, LangGraph's conformance suite
# (langgraph-checkpoint-conformance 0.0.2: every base capability and every
# implemented optional one must pass) and the two-process write-ownership
# test. Fails, never skips, when python3.11 is missing. `scripts/test.sh`
# calls this.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
started=$(date +%s)

python="${RUNKEEP_PYTHON:-python3.11}"
if ! command -v "$python" >/dev/null 2>&1; then
    echo "clients/python: $python is required (CPython 3.11; Debian: apt-get install python3.11 python3.11-venv); set RUNKEEP_PYTHON to use another >= 3.10" >&2
    exit 1
fi

base="$repo/target/python-clients"
venv="$base/venv"
lock="$here/requirements.lock"
stamp="$( (sha256sum "$lock" | cut -d' ' -f1; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$base/stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "clients/python: creating $venv from requirements.lock"
    rm -rf "$venv"
    mkdir -p "$base"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$lock"
    echo "$stamp" >"$base/stamp"
fi
# scripts/prepare.sh stops here: the venv is all it wants.
if [ -n "${RUNKEEP_PREPARE_ONLY:-}" ]; then exit 0; fi

# The server the tests start: this repository's, built now, unless the
# caller names one in RUNKEEP_BIN.
if [ -z "${RUNKEEP_BIN:-}" ]; then
    (cd "$repo" && cargo build --quiet -p runkeep-cli --bin runkeep --all-features)
    export RUNKEEP_BIN="$repo/target/debug/runkeep"
fi


export PYTHONPATH="$here/src:$repo/clients/python-langgraph/src"
export PYTHONDONTWRITEBYTECODE=1
cd "$repo"
status=0
# A hung test fails the run instead of blocking CI.
timeout 300 "$venv/bin/python" -m pytest -p no:cacheprovider -q -rA --rootdir clients/python clients/python/tests || status=1
timeout 600 "$venv/bin/python" -m pytest -p no:cacheprovider -q -s --rootdir clients/python-langgraph clients/python-langgraph/tests || status=1
# --- the LangGraph saver bench at its small size: checks every saver stores
# what it is given (not timings); its own venv (clients/python-langgraph/bench).
timeout 180 bash "$repo/clients/python-langgraph/bench/run.sh" --small || status=1
# ---
echo "clients/python: $(( $(date +%s) - started )) s"
exit "$status"
