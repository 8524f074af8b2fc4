#!/usr/bin/env bash
# The project's test command: sets up what the tests need on a fresh machine,
# then runs the whole workspace's tests. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# PostgreSQL-backed tests read this; the test machines run a server here.
export RUNKEEP_TEST_POSTGRES_URL="${RUNKEEP_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"

include_ignored=()
if [ "$(id -u)" = "0" ]; then
    # Fault-injection tests need a link-less filesystem (exFAT over FUSE) and
    # mount rights. Install the tools when missing; the tests that need them
    # are #[ignore]d with their reason and run here, as root, on purpose.
    if ! command -v mount.exfat-fuse >/dev/null 2>&1 || ! command -v mkfs.exfat >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1; then
        if command -v apt-get >/dev/null 2>&1; then
            echo "test.sh: installing exfat-fuse exfatprogs util-linux (fault-injection tests)"
            (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq exfat-fuse exfatprogs util-linux >/dev/null) \
                || echo "test.sh: could not install exfat tools; the no-hard-link mount test will fail and say why"
        fi
    fi
    # The power-loss harness (crates/runkeep-powerloss) mounts its FUSE model
    # filesystem with mount(2) on /dev/fuse: it needs root and /dev/fuse,
    # no package (no libfuse, no fusermount).
    include_ignored=(--include-ignored)
else
    echo "test.sh: not root: tests that need mounts or a second user stay ignored (they are listed as ignored below)"
fi

cargo test --workspace --all-features --no-fail-fast -- "${include_ignored[@]}"

# The TypeScript client (clients/typescript): npm ci, tsc --noEmit, its tests
# against a live `runkeep serve`. Fails when node/npm are missing.
bash clients/typescript/scripts/ci.sh
bash clients/python/scripts/ci.sh  # Python client + LangGraph saver: conformance, two-process write ownership
bash clients/langgraph-js/scripts/ci.sh  # LangGraph.js saver: @langchain/langgraph-checkpoint-validation 1.1.1 (718 tests), write ownership, parks

# The web console's browser tests (crates/runkeep-server/console/tests):
# headless Debian chromium driven by playwright-core against
# `runkeep serve --demo`. Installs chromium as root when missing; fails when
# it cannot run.
bash crates/runkeep-server/console/tests/ci.sh

# Schemathesis (pinned, in a venv under target/schemathesis) against a live
# `runkeep serve` with a reader, a worker and an operator token: fails on any
# 5xx, any answer that breaks crates/runkeep-server/openapi.json and any
# request the document calls valid that the server refuses. About 2 minutes.
bash scripts/schemathesis.sh
