#!/usr/bin/env bash
# @runkeep/client as a user installs it: packs it (scripts/pack.sh: the
# tarball's contents checked), installs the TARBALL into a fresh project
# under target/js-pack/client-app (its own package.json; npm's cache first,
# --prefer-offline), type-checks a file against the installed declarations
# (tsc --noEmit, NodeNext, no skipLibCheck) and runs the README's worker
# from there against a live `runkeep serve` ($RUNKEEP_BIN).
# `scripts/ci.sh` calls this; it runs alone too (RUNKEEP_BIN set).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
: "${RUNKEEP_BIN:?set RUNKEEP_BIN to the runkeep binary to serve with}"

tarball="$(bash "$here/scripts/pack.sh")"
app="$repo/target/js-pack/client-app"
rm -rf "$app"
mkdir -p "$app"
cat >"$app/package.json" <<JSON
{ "name": "client-app", "private": true, "type": "module",
  "dependencies": { "@runkeep/client": "file:$tarball" } }
JSON
cat >"$app/tsconfig.json" <<'JSON'
{ "compilerOptions": { "module": "NodeNext", "moduleResolution": "NodeNext", "target": "ES2022",
    "lib": ["ES2022", "DOM", "DOM.Iterable"], "types": [], "strict": true, "exactOptionalPropertyTypes": true,
    "noEmit": true, "skipLibCheck": false },
  "files": ["client-types.ts"] }
JSON
cp "$here/scripts/pack/client-smoke.mjs" "$here/scripts/pack/client-types.ts" "$app/"
cd "$app"
npm install --prefer-offline --no-audit --no-fund --loglevel=error
# A link would mean npm used the sources, not the tarball.
[ ! -L node_modules/@runkeep/client ] || { echo "pack-check: node_modules/@runkeep/client is a link, not the installed tarball" >&2; exit 1; }
"$here/node_modules/.bin/tsc" -p .
RUNKEEP_PACK_SERVE="$here/scripts/pack/serve.mjs" timeout 120 node client-smoke.mjs
