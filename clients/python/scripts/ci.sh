#!/usr/bin/env bash
# The Python clients' CI: clients/python (distribution runkeep-client, import
# runkeep) and clients/python-langgraph (langgraph-checkpoint-runkeep, import
# langgraph.checkpoint.runkeep), tested as a user gets them: from the files
# built here, never from the source tree.
#
# 1. Dependencies (reused while clients/python/requirements.lock and the
#    interpreter are unchanged): every pinned requirement as a wheel in
#    target/python-clients/wheels (fetched once), and a CPython 3.11 venv
#    target/python-clients/venv installed from them (the tools: build,
#    setuptools, mypy; other scripts use it with PYTHONPATH=src too).
# 2. Build: `python -m build --no-isolation` of each package: an sdist,
#    then the wheel built from that sdist (so a broken sdist fails here),
#    into target/python-clients/dist. --no-isolation: the pinned setuptools
#    of the venv builds, nothing is fetched.
# 3. A fresh venv, target/python-clients/installed, made anew each run:
#    the locked dependencies from the wheel cache (--no-index), then the
#    two built wheels (--no-deps), then `pip check` (the wheels' declared
#    requirements hold: langgraph-checkpoint-runkeep needs runkeep-client).
# 4. mypy --strict on both packages as installed there (which needs the
#    py.typed each wheel ships: without it mypy refuses to check an
#    installed package) and on tests/typing_usage.py, a caller's view of
#    both clients. Any error fails CI.
# 5. Both packages' tests with that venv's python, no PYTHONPATH, against
#    live `runkeep serve`s (each test module starts its own on a free
#    port): the client's, LangGraph's conformance suite
#    (langgraph-checkpoint-conformance 0.0.2: every base capability and
#    every implemented optional one must pass), the two-process write
#    ownership test. tests/test_installed.py (RUNKEEP_TEST_INSTALLED=1)
#    fails when `runkeep` or `langgraph.checkpoint.runkeep` is imported
#    from anywhere but that venv's site-packages.
#
# Fails, never skips, when python3.11 is missing. `scripts/test.sh` calls
# this; `scripts/prepare.sh` calls it with RUNKEEP_PREPARE_ONLY=1 (step 1).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
saver="$repo/clients/python-langgraph"
started=$(date +%s)

python="${RUNKEEP_PYTHON:-python3.11}"
if ! command -v "$python" >/dev/null 2>&1; then
    echo "clients/python: $python is required (CPython 3.11; Debian: apt-get install python3.11 python3.11-venv); set RUNKEEP_PYTHON to use another >= 3.10" >&2
    exit 1
fi

base="$repo/target/python-clients"
venv="$base/venv"
wheels="$base/wheels"
lock="$here/requirements.lock"
pip_quiet=(--quiet --disable-pip-version-check)
stamp="$( (sha256sum "$lock" | cut -d' ' -f1; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$base/stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "clients/python: filling $wheels and creating $venv from requirements.lock"
    rm -rf "$venv" "$wheels"
    mkdir -p "$base"
    "$python" -m venv "$venv"
    # Every pinned requirement as a wheel, once (built here when only an
    # sdist exists); each venv below installs from these, offline.
    "$venv/bin/pip" wheel "${pip_quiet[@]}" --no-deps -r "$lock" -w "$wheels"
    "$venv/bin/pip" install "${pip_quiet[@]}" --no-index --find-links "$wheels" --no-deps -r "$lock"
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

# 2. The distributions: sdist, then the wheel from the sdist.
dist="$base/dist"
rm -rf "$dist"
for pkg in "$here" "$saver"; do
    "$venv/bin/python" -m build --no-isolation --outdir "$dist" "$pkg" >"$base/build.log" 2>&1 \
        || { cat "$base/build.log" >&2; echo "clients/python: building $pkg failed" >&2; exit 1; }
done
client_whl=("$dist"/runkeep_client-*-py3-none-any.whl)
saver_whl=("$dist"/langgraph_checkpoint_runkeep-*-py3-none-any.whl)
for f in "${client_whl[0]}" "${saver_whl[0]}" "$dist"/runkeep_client-*.tar.gz "$dist"/langgraph_checkpoint_runkeep-*.tar.gz; do
    [ -f "$f" ] || { echo "clients/python: no $f after the build: $(ls "$dist")" >&2; exit 1; }
done
echo "clients/python: built $(cd "$dist" && ls | tr '\n' ' ')"

# 3. A fresh venv with the built wheels.
installed="$base/installed"
rm -rf "$installed"
"$python" -m venv "$installed"
"$installed/bin/pip" install "${pip_quiet[@]}" --no-index --find-links "$wheels" --no-deps -r "$lock"
"$installed/bin/pip" install "${pip_quiet[@]}" --no-index --no-deps "${client_whl[0]}" "${saver_whl[0]}"
"$installed/bin/pip" check
if [ -e "$installed/bin/runkeep" ]; then
    echo "clients/python: the wheels installed a 'runkeep' command, which would hide the server's" >&2
    exit 1
fi

# Nothing below may read the source tree's packages.
unset PYTHONPATH
export PYTHONDONTWRITEBYTECODE=1 RUNKEEP_TEST_INSTALLED=1
cd "$repo"
status=0

# 4. Types, as a caller's checker sees the installed packages.
"$installed/bin/python" -m mypy --strict --cache-dir=/dev/null -p runkeep -p langgraph.checkpoint.runkeep || status=1
"$installed/bin/python" -m mypy --strict --cache-dir=/dev/null "$here/tests/typing_usage.py" || status=1

# 5. The tests. A hung test fails the run instead of blocking CI.
timeout 300 "$installed/bin/python" -m pytest -p no:cacheprovider -q -rA --rootdir clients/python clients/python/tests || status=1
timeout 600 "$installed/bin/python" -m pytest -p no:cacheprovider -q -s --rootdir clients/python-langgraph clients/python-langgraph/tests || status=1
# --- the LangGraph saver bench at its small size: checks every saver stores
# what it is given (not timings); its own venv (clients/python-langgraph/bench).
timeout 180 bash "$repo/clients/python-langgraph/bench/run.sh" --small || status=1
# ---
echo "clients/python: $(( $(date +%s) - started )) s"
exit "$status"
