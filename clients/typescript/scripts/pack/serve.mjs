// A live `runkeep serve` for the packed-package checks (plain JavaScript:
// it runs beside packages installed from their tarballs, with nothing
// compiled). `$RUNKEEP_BIN` is the binary. A fresh directory with its own
// token file, a free port (`--listen 127.0.0.1:0`, the address read from its
// output), reader, worker and operator tokens made before the start.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

function env() {
  const e = { ...process.env, NO_COLOR: "1" };
  for (const k of ["RUNKEEP_STORE", "RUNKEEP_TENANT", "RUNKEEP_PROJECT", "RUNKEEP_SESSION", "RUNKEEP_TOKENS", "RUNKEEP_LOG"]) delete e[k];
  return e;
}

/** Starts one; answers `{ url, tenant, tokens: { reader, worker, operator }, close() }`. */
export async function serve(tenant = "acme") {
  const bin = process.env.RUNKEEP_BIN;
  if (!bin) throw new Error("RUNKEEP_BIN is not set: the runkeep binary to serve with");
  const dir = mkdtempSync(join(tmpdir(), "runkeep-pack-"));
  const tokensFile = join(dir, "tokens.json");
  const token = (role) => {
    const out = execFileSync(bin, ["--tenant", tenant, "--json", "token", "create", "--role", role, "--label", "pack-check", "--tokens", tokensFile], { env: env(), encoding: "utf8" });
    const t = JSON.parse(out).token;
    if (!t) throw new Error(`runkeep token create printed no token: ${out}`);
    return t;
  };
  const tokens = { reader: token("reader"), worker: token("worker"), operator: token("operator") };
  const child = spawn(bin, ["--store", "memory:", "--tenant", tenant, "serve", "--listen", "127.0.0.1:0", "--tokens", tokensFile, "--shutdown-grace", "2s"], {
    env: env(),
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.setEncoding("utf8").on("data", (d) => (stderr += d));
  const exited = new Promise((r) => child.once("exit", r));
  const url = await new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`runkeep serve printed no address within 20 s\n${out}\n${stderr}`)), 20_000);
    child.stdout.setEncoding("utf8").on("data", (d) => {
      out += d;
      const m = /listening on (http:\/\/[0-9.]+:\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`runkeep serve exited (${code}) before listening\n${out}\n${stderr}`));
    });
  });
  return {
    url,
    tenant,
    tokens,
    async close() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
