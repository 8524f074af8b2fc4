#!/usr/bin/env bash
# The TypeScript client's CI: install from the committed lockfile, check the
# types generated from the OpenAPI document are current, type-check
# (tsc --noEmit), build, and run the tests against a live `runkeep serve`
# (each test file starts its own on a free port). Needs Node >= 20 and npm;
# fails, never skips, without them. `scripts/test.sh` calls this.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "clients/typescript: node and npm are required (Node 20 or later) to test the TypeScript client; install them (Debian: apt-get install nodejs npm) and run again" >&2
    exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
    echo "clients/typescript: Node $(node --version) is too old; the client needs Node 20 or later" >&2
    exit 1
fi

# The server the tests start: this repository's, built now, unless the
# caller names one in RUNKEEP_BIN.
if [ -z "${RUNKEEP_BIN:-}" ]; then
    (cd "$repo" && cargo build --quiet -p runkeep-cli --bin runkeep --all-features)
    export RUNKEEP_BIN="$repo/target/debug/runkeep"
fi

cd "$here"
bash "$repo/scripts/npm-ci-once.sh" .
# The wire types are generated from the committed OpenAPI document: a stale
# src/generated/api.ts fails here (fix: `npm run gen`, commit the result).
if ! npm run --silent gen:check; then
    echo "clients/typescript: src/generated/api.ts does not match crates/runkeep-http/openapi.json; run \`npm run gen\` in clients/typescript and commit it" >&2
    exit 1
fi
# The console serves this client's SSE parser and backoff, emitted as ES modules.
if ! npm run --silent console-sse:check; then
    echo "clients/typescript: crates/runkeep-server/console/sse-parser.js or backoff.js does not match src/sse.ts or src/backoff.ts; run \`npm run console-sse\` in clients/typescript and commit them" >&2
    exit 1
fi
npx tsc --noEmit -p .
rm -rf dist
npx tsc -p .
# A hung test fails the run instead of blocking CI.
timeout 300 node --test --test-concurrency=1 --test-timeout=60000 dist/test/*.test.js
# The package as a user gets it: `npm pack`, the tarball's contents checked,
# installed from the tarball into a fresh project under target/js-pack,
# type-checked against and run there (scripts/pack-check.sh).
bash "$here/scripts/pack-check.sh"
