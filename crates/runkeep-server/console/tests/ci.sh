#!/usr/bin/env bash
# The console's browser tests: a real headless Chromium (Debian's
# /usr/bin/chromium) driven by playwright-core (from the committed
# lockfile; it downloads no browser) against `runkeep serve --demo`, which
# the test starts on a free port and stops. Installs chromium with apt-get
# when it is missing and this runs as root; fails, never skips, when it
# cannot run. `scripts/test.sh` calls this. Takes docs/console/*.png.
# parks.test.mjs also runs the Python LangGraph example's workers from the
# venv clients/python/scripts/ci.sh makes (scripts/test.sh runs that first).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
fail() {
    echo "console browser tests: $*" >&2
    exit 1
}

export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "console browser tests: installing Debian's chromium"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
            || fail "apt-get install chromium failed; install it (or set CHROMIUM to a Chromium binary) and run again"
    else
        fail "no Chromium at $CHROMIUM: install Debian's chromium (apt-get install chromium, as root) or set CHROMIUM to a Chromium binary"
    fi
fi
[ -x "$CHROMIUM" ] || fail "no Chromium at $CHROMIUM after installing it"
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
    || fail "node and npm are required (Node 20 or later); Debian: apt-get install nodejs npm"
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 20 ] || fail "Node $(node --version) is too old; the tests need Node 20 or later"

# The server the tests start: this repository's, built now, unless the
# caller names one in RUNKEEP_BIN (scripts/test.sh does, having built it).
if [ -z "${RUNKEEP_BIN:-}" ]; then
    (cd "$repo" && cargo build --quiet -p runkeep-cli --bin runkeep --all-features)
    export RUNKEEP_BIN="$repo/target/debug/runkeep"
fi

cd "$here"
bash "$repo/scripts/npm-ci-once.sh" .
node --test --test-concurrency=1 sse.test.mjs console.test.mjs attempts.test.mjs parks.test.mjs schedules.test.mjs
