#!/usr/bin/env node
// Checks what `npm pack --json` says a tarball holds, the way a user gets it:
// only built JavaScript, its declarations, the README, package.json and
// license files (no sources, no tests, no source maps), and every path
// package.json names (main, types, every `exports` target) is in it.
// Usage: node check-pack.mjs PACK_JSON  (the output of `npm pack --json`)
import { readFileSync } from "node:fs";

const [file] = process.argv.slice(2);
if (!file) {
  console.error("usage: check-pack.mjs PACK_JSON");
  process.exit(2);
}
const packs = JSON.parse(readFileSync(file, "utf8"));
if (!Array.isArray(packs) || packs.length !== 1) throw new Error(`${file}: expected one packed package, got ${JSON.stringify(packs).slice(0, 200)}`);
const [pack] = packs;
const files = new Set(pack.files.map((f) => f.path));

const allowed = [
  /^package\.json$/,
  /^README\.md$/,
  /^LICEN[CS]E(-[A-Z0-9.]+)?(\.md|\.txt)?$/,
  /^dist\/.+\.js$/,
  /^dist\/.+\.d\.ts$/,
];
const problems = [];
for (const f of files) {
  if (!allowed.some((re) => re.test(f))) problems.push(`unexpected file in the tarball: ${f}`);
  if (/(^|\/)test(s)?\//.test(f) || /\.(spec|test)\.(js|d\.ts)$/.test(f)) problems.push(`a test in the tarball: ${f}`);
}
if (!files.has("README.md")) problems.push("no README.md in the tarball");

// Every path package.json points at must be packed.
const manifest = JSON.parse(readFileSync(new URL(`file://${process.cwd()}/package.json`), "utf8"));
const targets = [];
const walk = (v) => {
  if (typeof v === "string") targets.push(v);
  else if (v && typeof v === "object") for (const x of Object.values(v)) walk(x);
};
walk(manifest.exports);
for (const k of ["main", "types", "module"]) if (manifest[k] !== undefined) targets.push(manifest[k]);
if (targets.length === 0) problems.push("package.json names no main, types or exports");
for (const t of targets) {
  const p = t.replace(/^\.\//, "");
  if (!files.has(p)) problems.push(`package.json points at ${t}, which is not in the tarball`);
}
for (const kind of [".js", ".d.ts"]) {
  if (![...files].some((f) => f.endsWith(kind))) problems.push(`no ${kind} file in the tarball`);
}

if (problems.length > 0) {
  console.error(`${pack.filename}:\n  ${problems.join("\n  ")}`);
  process.exit(1);
}
console.log(`${pack.filename}: ${files.size} files, ${pack.size} bytes packed; every exports/main/types path is in it`);
