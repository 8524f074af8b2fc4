#!/usr/bin/env bash
# Runs the saver bench (bench_savers.py) in its own venv: CPython 3.11 with
# clients/python/requirements.lock, then this folder's requirements.lock
# (--require-hashes) on top, under target/python-clients/bench-venv (reused
# while both locks and the interpreter are unchanged). The server is
# $RUNKEEP_BIN (required). Arguments go to bench_savers.py.
#   --small: the CI size (T=20, N=20, lengths 10/100): checks that every
#   saver stores what it is given, not how fast; about 15 s with a release
#   server. Needs PostgreSQL at $RUNKEEP_BENCH_PG_URL (default
#   postgres://postgres@127.0.0.1:5432/postgres) with CREATE DATABASE rights.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
python="${RUNKEEP_PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || { echo "saver bench: $python is required (CPython 3.11)" >&2; exit 1; }
[ -n "${RUNKEEP_BIN:-}" ] || { echo "saver bench: set RUNKEEP_BIN to a runkeep binary (scripts/bench-savers.sh builds one)" >&2; exit 1; }
base="$repo/target/python-clients"
venv="$base/bench-venv"
stamp="$( (cat "$repo/clients/python/requirements.lock" "$here/requirements.lock" | sha256sum; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$base/bench-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "saver bench: creating $venv"
    rm -rf "$venv"
    mkdir -p "$base"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$repo/clients/python/requirements.lock"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes -r "$here/requirements.lock"
    echo "$stamp" >"$base/bench-stamp"
fi
export PYTHONPATH="$repo/clients/python/src:$repo/clients/python-langgraph/src"
export PYTHONDONTWRITEBYTECODE=1
cd "$repo"
args=()
if [ "${1:-}" = "--small" ]; then
    shift
    args=(--turns 20 --invocations 20 --puts 40 --lengths 10,100 --reads 10 --db runkeep_saver_bench_ci)
    # The bench's own honesty: its read-back checks catch a saver that drops
    # writes (a test that fails if the checks are removed).
    "$venv/bin/python" -m pytest -p no:cacheprovider -q --rootdir "$here" "$here/test_bench_checks.py"
fi
exec "$venv/bin/python" "$here/bench_savers.py" --dir "$repo/target/saver-bench" "${args[@]}" "$@"
