#!/usr/bin/env bash
# The LangGraph.js saver's CI: build the TypeScript client it depends on
# (a peer dependency; file:../typescript in development), install from the
# committed lockfile, type-check,
# build, and run the vitest specs against a live `runkeep serve` (one per
# run, started by test/global-setup.ts on a free port with reader, worker
# and operator tokens): LangGraph.js's own validation suite
# (@langchain/langgraph-checkpoint-validation 1.1.1, through validate()),
# write ownership, and interrupts as parks under a real graph.
# Needs Node >= 20 and npm; fails, never skips, without them.
# `scripts/test.sh` calls this.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "clients/langgraph-js: node and npm are required (Node 20 or later); install them (Debian: apt-get install nodejs npm) and run again" >&2
    exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
    echo "clients/langgraph-js: Node $(node --version) is too old; the saver needs Node 20 or later" >&2
    exit 1
fi

if [ -z "${RUNKEEP_BIN:-}" ]; then
    (cd "$repo" && cargo build --quiet -p runkeep-cli --bin runkeep --all-features)
    export RUNKEEP_BIN="$repo/target/debug/runkeep"
fi

# The client, built to dist/ (what `@runkeep/client` resolves to).
(
    cd "$repo/clients/typescript"
    bash "$repo/scripts/npm-ci-once.sh" .
    npx tsc -p .
)

cd "$here"
bash "$repo/scripts/npm-ci-once.sh" .
npx tsc --noEmit -p .
rm -rf dist
npx tsc -p tsconfig.build.json
# A hung test fails the run instead of blocking CI.
timeout 300 npx vitest run --reporter=default
# The packages as a user gets them: both packed, their tarballs' contents
# checked, installed from the tarballs into a fresh project under
# target/js-pack with @langchain/langgraph, and a graph with an interrupt
# run there under runWorker (scripts/pack-check.sh).
bash "$here/scripts/pack-check.sh"
