#!/usr/bin/env bash
# Asserts that a runkeep binary built without features contains no test
# seam: none of the names the seams are switched on by (the RUNKEEP_*TEST*
# variables in crates/*/src, runkeep-fs's pause points and mutations, the
# delay points) is among its strings. Usage: scripts/no-test-seams.sh BINARY
#
# A debug binary proves what a release one would: the seams are removed by
# `#[cfg(feature = "testing")]`, before any optimisation, and a debug build
# keeps more strings than a release one, not fewer.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$1"
hooks=crates/runkeep-fs/src/testing_hooks.rs
mapfile -t names < <(
    {
        grep -rhoE 'RUNKEEP_[A-Z_]*TEST[A-Z_]*' crates/*/src | grep -v '^RUNKEEP_TEST_POSTGRES_URL$'
        grep -oE '"[a-z]+(-[a-z]+)+"' "$hooks" | tr -d '"'
        grep -rhoE 'delay\("[a-z-]+"\)' crates/runkeep-fs/src | sed -E 's/delay\("(.*)"\)/\1/'
    } | grep -E '[-_]' | sort -u
)
if [ "${#names[@]}" -lt 20 ]; then
    echo "no-test-seams.sh: found only ${#names[@]} seam names to look for; the extraction is broken" >&2
    exit 1
fi
found=$(strings -a "$bin" | grep -oFf <(printf '%s\n' "${names[@]}") | sort | uniq -c || true)
if [ -n "$found" ]; then
    echo "no-test-seams.sh: $bin (built without features) contains test seams:" >&2
    echo "$found" >&2
    exit 1
fi
echo "no-test-seams.sh: none of ${#names[@]} seam names in $bin"
