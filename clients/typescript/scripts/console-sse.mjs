// Emits the client's modules the web console shares as plain ES modules
// under crates/runkeep-server/console/, so the console and the client run
// one copy of each:
//
//   src/sse.ts     -> console/sse-parser.js  (the SSE parser)
//   src/backoff.ts -> console/backoff.js     (the reconnect backoff)
//
//   node scripts/console-sse.mjs          write them (`npm run console-sse`)
//   node scripts/console-sse.mjs --check  exit 1 when a committed one is stale
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const here = dirname(fileURLToPath(import.meta.url));
const console_ = resolve(here, "../../../crates/runkeep-server/console");
const MODULES = [
  { source: "sse.ts", output: "sse-parser.js", what: "parser" },
  { source: "backoff.ts", output: "backoff.js", what: "backoff" },
];

let stale = false;
for (const { source, output, what } of MODULES) {
  const input = resolve(here, "../src", source);
  const target = resolve(console_, output);
  const header = `// Generated from clients/typescript/src/${source} by \`npm run console-sse\`
// (clients/typescript/scripts/console-sse.mjs). Do not edit: change the
// client's ${what} and regenerate. The console serves it as it is.

`;
  const { outputText } = ts.transpileModule(readFileSync(input, "utf8"), {
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022, removeComments: false },
    fileName: source,
  });
  const text = header + outputText;
  if (process.argv.includes("--check")) {
    let committed = "";
    try {
      committed = readFileSync(target, "utf8");
    } catch {
      // missing: stale
    }
    if (committed !== text) {
      console.error(
        `crates/runkeep-server/console/${output} is stale: it no longer matches clients/typescript/src/${source}; run \`npm run console-sse\` in clients/typescript and commit the result`,
      );
      stale = true;
    }
  } else {
    writeFileSync(target, text);
    console.log(`wrote ${target}`);
  }
}
if (stale) process.exit(1);
