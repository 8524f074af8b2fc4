// Emits the client's SSE parser (src/sse.ts) as a plain ES module for the
// web console, crates/runkeep-server/console/sse-parser.js, so the console
// and the client parse the event stream with one parser.
//
//   node scripts/console-sse.mjs          write it (`npm run console-sse`)
//   node scripts/console-sse.mjs --check  exit 1 when the committed file is stale
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const here = dirname(fileURLToPath(import.meta.url));
const input = resolve(here, "../src/sse.ts");
const output = resolve(here, "../../../crates/runkeep-server/console/sse-parser.js");

const HEADER = `// Generated from clients/typescript/src/sse.ts by \`npm run console-sse\`
// (clients/typescript/scripts/console-sse.mjs). Do not edit: change the
// client's parser and regenerate. The console serves it as it is.

`;

const { outputText } = ts.transpileModule(readFileSync(input, "utf8"), {
  compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022, removeComments: false },
  fileName: "sse.ts",
});
const text = HEADER + outputText;

if (process.argv.includes("--check")) {
  let committed = "";
  try {
    committed = readFileSync(output, "utf8");
  } catch {
    // missing: stale
  }
  if (committed !== text) {
    console.error(
      "crates/runkeep-server/console/sse-parser.js is stale: it no longer matches clients/typescript/src/sse.ts; run `npm run console-sse` in clients/typescript and commit the result",
    );
    process.exit(1);
  }
} else {
  writeFileSync(output, text);
  console.log(`wrote ${output}`);
}
