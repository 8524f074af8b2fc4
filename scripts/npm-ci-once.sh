#!/usr/bin/env bash
# `npm ci` in a package directory, skipped when its node_modules already holds
# exactly what its package-lock.json names (a stamp written after a successful
# install), so the test scripts can each make sure of their packages without
# reinstalling what scripts/prepare.sh installed a minute earlier.
# Usage: scripts/npm-ci-once.sh DIR
set -euo pipefail
dir="$1"
cd "$dir"
[ -f package-lock.json ] || { echo "npm-ci-once: $dir has no package-lock.json" >&2; exit 1; }
want="$( (sha256sum package-lock.json | cut -d' ' -f1; node --version) | sha256sum | cut -d' ' -f1)"
stamp=node_modules/.runkeep-installed
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" >"$stamp"
