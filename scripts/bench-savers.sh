#!/usr/bin/env bash
# The LangGraph saver bench at full size (T=500 chat turns, N=200
# invocations, 1 000 puts, latest reads at 10/1 000/2 000 checkpoints):
# runkeep's saver over a release `runkeep serve` on the directory store and
# on PostgreSQL, beside PostgresSaver, SqliteSaver and InMemorySaver, in one
# alternated run. Rewrites the "LangGraph savers" section of BENCHMARKS.md
# (between its saver-bench markers) and docs/bench/saver-turns.png, and
# keeps the samples in target/saver-bench/. Needs PostgreSQL at
# $RUNKEEP_BENCH_PG_URL (default postgres://postgres@127.0.0.1:5432/postgres;
# it creates and drops the databases runkeep_saver_bench and
# runkeep_saver_bench_pgsaver) and CPython 3.11. RUNKEEP_BIN names another
# server binary instead of building one; extra arguments go to the bench
# (e.g. --label "…").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${RUNKEEP_BIN:-}" ]; then
    cargo build --release --quiet -p runkeep-cli --bin runkeep
    export RUNKEEP_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/runkeep"
fi
mkdir -p target/saver-bench
exec bash clients/python-langgraph/bench/run.sh \
    --out target/saver-bench/saver-bench.md --json-out target/saver-bench/saver-bench.json \
    --plot docs/bench/saver-turns.png --update-doc BENCHMARKS.md \
    --command "bash scripts/bench-savers.sh" "$@"
