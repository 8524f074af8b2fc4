/**
 * The client's runtime lists (its enums, tagged unions and operations)
 * against the server's OpenAPI document. The types themselves are generated
 * from the document (src/generated/api.ts, `npm run gen`); CI checks the
 * generated file is current.
 *
 * The document is the committed `crates/runkeep-http/openapi.json`, else
 * the one a live `runkeep serve` answers at `/openapi.json`. While neither
 * exists the test is reported as skipped, saying so.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { ENUMS, OPERATIONS, RUN_PATH, TAGGED } from "../src/index.js";
import { Serve } from "./helpers/serve.js";

const REPO = resolve(fileURLToPath(new URL(".", import.meta.url)), "../../../..");
const COMMITTED = resolve(REPO, "crates/runkeep-http/openapi.json");
/** The operation table as JSON, generated from the Rust table the server is built from. */
const TABLE = resolve(REPO, "crates/runkeep-http/operations.json");

type Schema = {
  enum?: string[];
  oneOf?: Schema[];
  properties?: Record<string, unknown>;
};
type Doc = {
  components?: { schemas?: Record<string, Schema> };
  paths?: Record<string, Record<string, { operationId?: string }>>;
};

let serve: Serve;
before(async () => {
  serve = await Serve.start();
});
after(async () => {
  await serve?.close();
});

async function load(): Promise<{ doc: Doc; from: string } | undefined> {
  if (existsSync(COMMITTED)) return { doc: JSON.parse(readFileSync(COMMITTED, "utf8")) as Doc, from: COMMITTED };
  const res = await fetch(`${serve.url}/openapi.json`);
  if (res.ok) return { doc: (await res.json()) as Doc, from: `${serve.url}/openapi.json` };
  return undefined;
}

test("the client's enums, tagged unions and operations are the document's", async (t) => {
  const loaded = await load();
  if (!loaded) {
    t.skip("no OpenAPI document yet: crates/runkeep-http/openapi.json is not committed and the server answers 404 at /openapi.json");
    return;
  }
  const schemas = loaded.doc.components?.schemas ?? {};
  for (const [name, values] of Object.entries(ENUMS)) {
    assert.deepEqual([...(schemas[name]?.enum ?? [])].sort(), [...values].sort(), `enum ${name}`);
  }
  for (const [name, tags] of Object.entries(TAGGED)) {
    for (const [tag, values] of Object.entries(tags)) {
      const inDoc = (schemas[name]?.oneOf ?? []).flatMap((v) => {
        const p = v.properties?.[tag] as Schema | undefined;
        return p?.enum ?? [];
      });
      assert.deepEqual(inDoc.sort(), [...values].sort(), `${name}.${tag}`);
    }
  }
  const inDoc = new Map<string, string>();
  for (const [path, ops] of Object.entries(loaded.doc.paths ?? {})) {
    for (const [method, op] of Object.entries(ops)) {
      if (op.operationId && path.startsWith("/v1/")) inDoc.set(op.operationId, `${method.toUpperCase()} ${path}`);
    }
  }
  const ours = new Map(
    Object.entries(OPERATIONS).map(([id, [method, path]]) => [id, `${method} ${path.replace("{run}", RUN_PATH)}`]),
  );
  assert.deepEqual([...ours].sort(), [...inDoc].sort(), "every /v1 operation of the document has its client method, with its method and path");
});

test("the client's operations are the operation table's, with their methods and paths", () => {
  const table = JSON.parse(readFileSync(TABLE, "utf8")) as { name: string; method: string; path: string }[];
  const theirs = new Map(table.map((op) => [op.name, `${op.method} ${op.path}`]));
  const ours = new Map(
    Object.entries(OPERATIONS).map(([id, [method, path]]) => [id, `${method} ${path.replace(/^\{run\}/, RUN_PATH)}`]),
  );
  assert.deepEqual([...ours].sort(), [...theirs].sort(), "every operation of crates/runkeep-http/operations.json, with its method and path");
});

test("no client method spells a path or a method of its own", () => {
  const source = readFileSync(resolve(REPO, "clients/typescript/src/client.ts"), "utf8");
  const body = source.slice(source.indexOf("export class RunkeepClient"));
  assert.deepEqual(body.match(/["`]\/v1[^"`]*["`]/g) ?? [], [], "a path spelled outside OPERATIONS");
  assert.deepEqual(body.match(/this\.(call|send|runGet|runWrite)(<[^>]*>)?\("(GET|POST|PUT|DELETE)"/g) ?? [], [], "a method spelled outside OPERATIONS");
});
