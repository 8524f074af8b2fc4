/**
 * The hand-written types (src/types.ts, through src/schema-keys.ts) against
 * the server's OpenAPI document: for every schema the client types, the
 * same property names and the same required set.
 *
 * The document is the committed `crates/runkeep-server/openapi.json`, else
 * the one a live `runkeep serve` answers at `/openapi.json`. While neither
 * exists the test is reported as skipped, saying so.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { ENUMS, OPERATIONS, RUN_PATH, SCHEMA_KEYS, TAGGED } from "../src/index.js";
import { Serve } from "./helpers/serve.js";

const COMMITTED = resolve(fileURLToPath(new URL(".", import.meta.url)), "../../../../crates/runkeep-server/openapi.json");

type Schema = {
  $ref?: string;
  enum?: string[];
  allOf?: Schema[];
  oneOf?: Schema[];
  properties?: Record<string, unknown>;
  required?: string[];
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

/** Properties and required names of a schema, following `$ref` and `allOf`. */
export function flatten(doc: Doc, s: Schema, seen = new Set<string>()): { props: Set<string>; required: Set<string> } {
  const props = new Set<string>();
  const required = new Set<string>();
  if (s.$ref) {
    const name = s.$ref.replace("#/components/schemas/", "");
    if (seen.has(name)) return { props, required };
    seen.add(name);
    const target = doc.components?.schemas?.[name];
    assert.ok(target, `the document's ${s.$ref} resolves`);
    return flatten(doc, target, seen);
  }
  for (const part of s.allOf ?? []) {
    const f = flatten(doc, part, seen);
    f.props.forEach((p) => props.add(p));
    f.required.forEach((p) => required.add(p));
  }
  for (const p of Object.keys(s.properties ?? {})) props.add(p);
  for (const p of s.required ?? []) required.add(p);
  return { props, required };
}

test("the hand-written types have the OpenAPI document's properties and required sets", async (t) => {
  const loaded = await load();
  if (!loaded) {
    t.skip("no OpenAPI document yet: crates/runkeep-server/openapi.json is not committed and the server answers 404 at /openapi.json");
    return;
  }
  const schemas = loaded.doc.components?.schemas ?? {};
  const problems: string[] = [];
  for (const [name, keys] of Object.entries(SCHEMA_KEYS)) {
    const s = schemas[name];
    if (!s) {
      problems.push(`${name}: not in the document`);
      continue;
    }
    const { props, required } = flatten(loaded.doc, s);
    const ours = new Set(Object.keys(keys));
    const oursRequired = new Set(Object.entries(keys).filter(([, r]) => r).map(([k]) => k));
    for (const p of props) if (!ours.has(p)) problems.push(`${name}.${p}: in the document, not in the client's type`);
    for (const p of ours) if (!props.has(p)) problems.push(`${name}.${p}: in the client's type, not in the document`);
    for (const p of required) if (!oursRequired.has(p)) problems.push(`${name}.${p}: required by the document, optional in the client`);
    for (const p of oursRequired) if (!required.has(p)) problems.push(`${name}.${p}: required in the client, optional in the document`);
  }
  assert.deepEqual(problems, [], `against ${loaded.from}`);
});

test("the client's enums, tagged unions and operations are the document's", async (t) => {
  const loaded = await load();
  if (!loaded) {
    t.skip("no OpenAPI document yet (see above)");
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

test("the comparison catches a difference (a document with one property renamed)", () => {
  const doc: Doc = {
    components: {
      schemas: {
        ClaimBody: { properties: { holder: {}, ttl: {}, now: {}, maxAttempts: {} }, required: ["holder", "ttl"] },
        ClaimNextBody: { allOf: [{ $ref: "#/components/schemas/ClaimBody" }, { properties: { waitMs: {} } }] },
      },
    },
  };
  const f = flatten(doc, doc.components!.schemas!["ClaimNextBody"]!);
  assert.deepEqual([...f.props].sort(), ["holder", "maxAttempts", "now", "ttl", "waitMs"]);
  assert.deepEqual([...f.required].sort(), ["holder", "ttl"]);
  assert.ok(!f.props.has("ttlMs") && "ttlMs" in SCHEMA_KEYS.ClaimNextBody, "a renamed property shows up as a difference");
});
