#!/usr/bin/env bash
# Asserts that a runkeep binary built without features contains no test
# seam: none of the names the seams are switched on by is among its strings.
# Usage: scripts/no-test-seams.sh BINARY
#
# The names looked for, read from the sources (so a seam added later is
# looked for too):
# - the RUNKEEP_*TEST* variables in crates/*/src;
# - every kebab-case string (or first word of a string) of runkeep-fs's
#   testing_hooks.rs: the names of its typed hooks (Mutation, Pause, Delay,
#   the Trace lines, the store Switches `no-index` / `no-inotify`);
# - "(test seam)", which every message of a switched-off seam carries.
#
# Before that, the sources: a test hook named by a string at its call site
# (`delay("…")`, `pause("…")`, `trace(|| …)`) is refused. The hooks are
# typed enums whose names exist only with the `testing` feature, so a
# string-named one would be back in the product.
#
# A debug binary proves what a release one would: the seams are removed by
# `#[cfg(feature = "testing")]`, before any optimisation, and a debug build
# keeps more strings than a release one, not fewer.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$1"
hooks=crates/runkeep-fs/src/testing_hooks.rs

untyped=$(grep -rnE '\b(delay|pause|pause_once|pause_requested)\("|\btrace\(\|' crates/*/src || true)
if [ -n "$untyped" ]; then
    echo "no-test-seams.sh: test hooks named by a string (use the typed enums of testing_hooks.rs):" >&2
    echo "$untyped" >&2
    exit 1
fi

mapfile -t names < <(
    {
        grep -rhoE 'RUNKEEP_[A-Z_]*TEST[A-Z_]*' crates/*/src | grep -v '^RUNKEEP_TEST_POSTGRES_URL$'
        grep -oE '"[a-z]+(-[a-z]+)+[" ]' "$hooks" | tr -d '" '
    } | grep -E '[-_]' | sort -u
    echo '(test seam)'
)
if [ "${#names[@]}" -lt 40 ]; then
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
