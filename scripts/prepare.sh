#!/usr/bin/env bash
# Installs what the test suites outside cargo need, and nothing else: the
# system packages (as root, with apt-get: exFAT over FUSE for the
# fault-injection tests, Debian's chromium for the console's browser tests,
# pgbouncer for the PostgreSQL tests behind a pooler),
# the npm packages of the TypeScript client, the LangGraph.js saver and the
# console tests, and the Python venvs of the Python clients and of
# schemathesis. Every step is skipped when already done (stamps), and a lock
# makes a second caller wait for the first, so `scripts/test.sh` can start
# this in the background while cargo builds, and each suite's own script
# still makes sure of its part when run alone.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
mkdir -p target
exec 9>target/prepare.lock
flock 9

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    packages=()
    command -v mount.exfat-fuse >/dev/null 2>&1 || packages+=(exfat-fuse)
    command -v mkfs.exfat >/dev/null 2>&1 || packages+=(exfatprogs)
    command -v setpriv >/dev/null 2>&1 || packages+=(util-linux)
    # runkeep-postgres's tests behind a pooler start a private pgbouncer.
    [ -x /usr/sbin/pgbouncer ] || packages+=(pgbouncer)
    [ -x "${CHROMIUM:-/usr/bin/chromium}" ] || packages+=(chromium)
    if [ "${#packages[@]}" -gt 0 ]; then
        echo "prepare.sh: apt-get install ${packages[*]}"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null) \
            || echo "prepare.sh: apt-get install ${packages[*]} failed; the suites that need them will fail and say why" >&2
    fi
fi

if command -v npm >/dev/null 2>&1; then
    for dir in clients/typescript clients/langgraph-js crates/runkeep-server/console/tests; do
        bash scripts/npm-ci-once.sh "$dir"
    done
fi

RUNKEEP_PREPARE_ONLY=1 bash clients/python/scripts/ci.sh
RUNKEEP_PREPARE_ONLY=1 bash scripts/schemathesis.sh
echo "prepare.sh: done"
