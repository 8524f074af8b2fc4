/**
 * Starts a real `runkeep serve` for the tests: a fresh directory with its
 * own token file, a free port (`--listen 127.0.0.1:0`, the address read
 * from its output), a reader, a worker and an operator token made with
 * `runkeep token create` before the start (the approach of
 * clients/typescript/test/helpers/serve.ts).
 *
 * The binary is `$RUNKEEP_BIN`, else `target/debug/runkeep` of this
 * repository; a missing binary fails with the command that builds it.
 */

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (clients/langgraph-js/test → ../../..). */
const REPO = resolve(fileURLToPath(new URL(".", import.meta.url)), "../../..");

export type Role = "reader" | "worker" | "operator";

export interface Served {
  url: string;
  tenant: string;
  tokens: Record<Role, string>;
}

export function runkeepBinary(): string {
  const bin = process.env["RUNKEEP_BIN"] ?? join(REPO, "target", "debug", "runkeep");
  if (!existsSync(bin)) {
    throw new Error(`no runkeep binary at ${bin}: build it with \`cargo build -p runkeep-cli --bin runkeep\` (or set RUNKEEP_BIN)`);
  }
  return bin;
}

function cleanEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const k of ["RUNKEEP_STORE", "RUNKEEP_TENANT", "RUNKEEP_PROJECT", "RUNKEEP_SESSION", "RUNKEEP_TOKENS", "RUNKEEP_LOG"]) delete env[k];
  return env;
}

function createToken(dir: string, tenant: string, role: Role): string {
  const out = execFileSync(
    runkeepBinary(),
    ["--tenant", tenant, "--json", "token", "create", "--role", role, "--label", "langgraph-js-test", "--tokens", join(dir, "tokens.json")],
    { env: cleanEnv(), encoding: "utf8" },
  );
  const token = (JSON.parse(out) as { token?: string }).token;
  if (!token) throw new Error(`runkeep token create printed no token: ${out}`);
  return token;
}

/** A running `runkeep serve` on `memory:`. */
export class Serve {
  private constructor(
    private readonly child: ChildProcess,
    private readonly dir: string,
    private readonly exited: Promise<void>,
    readonly served: Served,
  ) {}

  static async start(tenant = "acme"): Promise<Serve> {
    const dir = mkdtempSync(join(tmpdir(), "runkeep-lgjs-"));
    const tokens = {
      reader: createToken(dir, tenant, "reader"),
      worker: createToken(dir, tenant, "worker"),
      operator: createToken(dir, tenant, "operator"),
    };
    const args = ["--store", "memory:", "--tenant", tenant, "serve", "--listen", "127.0.0.1:0", "--tokens", join(dir, "tokens.json"), "--shutdown-grace", "2s"];
    const child = spawn(runkeepBinary(), args, { env: { ...cleanEnv(), NO_COLOR: "1" }, stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (d: string) => {
      stderr += d;
    });
    const exited = new Promise<void>((r) => child.once("exit", () => r()));
    const url = await new Promise<string>((resolveUrl, reject) => {
      let out = "";
      const timer = setTimeout(() => reject(new Error(`runkeep serve printed no address within 20 s\n${out}\n${stderr}`)), 20_000);
      child.stdout!.setEncoding("utf8");
      child.stdout!.on("data", (d: string) => {
        out += d;
        const m = /listening on (http:\/\/[0-9.]+:\d+)/.exec(out);
        if (m) {
          clearTimeout(timer);
          resolveUrl(m[1]!);
        }
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`runkeep serve exited (${code}) before listening\n${out}\n${stderr}`));
      });
    });
    return new Serve(child, dir, exited, { url, tenant, tokens });
  }

  /** Stops it and removes its directory. */
  async close(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGKILL");
    await this.exited;
    rmSync(this.dir, { recursive: true, force: true });
  }
}
