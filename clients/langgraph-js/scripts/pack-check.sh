#!/usr/bin/env bash
# @runkeep/langgraph-checkpoint as a user installs it: packs it (`npm pack`,
# whose `prepack` is a clean build) and the client it needs
# (clients/typescript/scripts/pack.sh), checks both tarballs' contents
# (built JS, declarations, README; no tests, no source maps; every
# exports/types path packed), installs the two TARBALLS with
# @langchain/langgraph into a fresh project under target/js-pack/saver-app
# (npm's cache first: --prefer-offline), checks that `@runkeep/client`
# resolved to the packed tarball (the saver's peer dependency, never the
# registry: neither name is published) and that npm did not nest a second
# copy, type-checks a file against the installed declarations, and runs a
# real graph with an interrupt there, under the client's `runWorker`,
# against a live `runkeep serve` ($RUNKEEP_BIN).
# `scripts/ci.sh` calls this; it runs alone too (RUNKEEP_BIN set, the
# client built: clients/typescript/dist, what the dev link resolves to).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
: "${RUNKEEP_BIN:?set RUNKEEP_BIN to the runkeep binary to serve with}"
out="$repo/target/js-pack"
client_tgz="$(bash "$repo/clients/typescript/scripts/pack.sh")"

cd "$here"
bash "$repo/scripts/npm-ci-once.sh" .
npm pack --json --pack-destination "$out" --loglevel=error >"$out/saver-pack.json"
node "$repo/clients/typescript/scripts/pack/check-pack.mjs" "$out/saver-pack.json"
saver_tgz="$out/$(node -p 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))[0].filename' "$out/saver-pack.json")"

# The versions this package is tested with (its devDependencies, pinned).
dep() { node -p 'require("./package.json").devDependencies[process.argv[1]]' "$1"; }
app="$out/saver-app"
rm -rf "$app"
mkdir -p "$app"
cat >"$app/package.json" <<JSON
{ "name": "saver-app", "private": true, "type": "module",
  "dependencies": {
    "@runkeep/client": "file:$client_tgz",
    "@runkeep/langgraph-checkpoint": "file:$saver_tgz",
    "@langchain/langgraph": "$(dep @langchain/langgraph)",
    "@langchain/core": "$(dep @langchain/core)",
    "zod": "$(dep zod)" } }
JSON
cat >"$app/tsconfig.json" <<'JSON'
{ "compilerOptions": { "module": "NodeNext", "moduleResolution": "NodeNext", "target": "ES2022",
    "lib": ["ES2022", "DOM", "DOM.Iterable"], "types": [], "strict": true, "noEmit": true, "skipLibCheck": true },
  "files": ["saver-types.ts"] }
JSON
cp "$here/scripts/pack/saver-smoke.mjs" "$here/scripts/pack/saver-types.ts" "$app/"
cd "$app"
npm install --prefer-offline --no-audit --no-fund --loglevel=error
node - "$client_tgz" "$saver_tgz" <<'JS'
// Both @runkeep packages came from the tarballs, once each.
const lock = require("./package-lock.json").packages;
const [client, saver] = process.argv.slice(2);
const want = { "node_modules/@runkeep/client": client, "node_modules/@runkeep/langgraph-checkpoint": saver };
for (const [path, tgz] of Object.entries(want)) {
  const entry = lock[path];
  if (!entry || entry.link || !String(entry.resolved).endsWith(tgz.split("/").pop())) {
    console.error(`pack-check: ${path} did not install from ${tgz}: ${JSON.stringify(entry)}`);
    process.exit(1);
  }
}
const nested = Object.keys(lock).filter((k) => k.endsWith("/@runkeep/client") && k !== "node_modules/@runkeep/client");
if (nested.length > 0) {
  console.error(`pack-check: a second @runkeep/client was installed: ${nested.join(", ")}`);
  process.exit(1);
}
JS
"$here/node_modules/.bin/tsc" -p .
RUNKEEP_PACK_SERVE="$repo/clients/typescript/scripts/pack/serve.mjs" timeout 120 node saver-smoke.mjs
