#!/usr/bin/env bash
# Packs @runkeep/client as a user gets it: `npm pack` (whose `prepack` is a
# clean `tsc` build) in a copy of the package under target/js-pack/client,
# so it never rebuilds clients/typescript/dist under a test that is running
# from it; checks the tarball's contents (scripts/pack/check-pack.mjs: built
# JS, declarations, README only; every exports/types path in it) and prints
# the tarball's path. A lock lets the client's and the saver's CI both call it.
# Usage: clients/typescript/scripts/pack.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/target/js-pack"
mkdir -p "$out"
exec 8>"$out/client.lock"
flock 8

bash "$repo/scripts/npm-ci-once.sh" "$here" >&2
stage="$out/client"
rm -rf "$stage"
mkdir -p "$stage"
cp -r "$here/package.json" "$here/README.md" "$here/tsconfig.json" "$here/src" "$stage/"
for f in "$here"/LICENSE*; do [ -e "$f" ] && cp "$f" "$stage/"; done
ln -s "$here/node_modules" "$stage/node_modules"
cd "$stage"
npm pack --json --pack-destination "$out" --loglevel=error >"$out/client-pack.json"
node "$here/scripts/pack/check-pack.mjs" "$out/client-pack.json" >&2
echo "$out/$(node -p 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))[0].filename' "$out/client-pack.json")"
