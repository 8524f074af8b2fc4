/**
 * Starts a real `runkeep serve` for a test: a fresh directory with its own
 * token file (and store, for `fs:`), a free port, tokens made with
 * `runkeep token create`.
 *
 * The binary is `$RUNKEEP_BIN`, else `target/debug/runkeep` of this
 * repository (`cargo build -p runkeep-cli`); a missing binary fails the test
 * with that instruction.
 */

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { RunkeepClient } from "../../src/index.js";

/** The repository root (dist/test/helpers → ../../../../..). */
const REPO = resolve(fileURLToPath(new URL(".", import.meta.url)), "../../../../..");

export function runkeepBinary(): string {
  const bin = process.env["RUNKEEP_BIN"] ?? join(REPO, "target", "debug", "runkeep");
  if (!existsSync(bin)) {
    throw new Error(`no runkeep binary at ${bin}: build it with \`cargo build -p runkeep-cli\` (or set RUNKEEP_BIN)`);
  }
  return bin;
}

export type Role = "reader" | "worker" | "operator";

export interface ServeOptions {
  /** `memory:` (default) or `fs` for a directory store in the test's directory. */
  store?: "memory" | "fs";
  tenant?: string;
  project?: string;
  session?: string;
  /** Reuse this directory (a restart); default a fresh one. */
  dir?: string;
  /** Listen on this port (a restart); default a free one. */
  port?: number;
}

/** A running `runkeep serve`. */
export class Serve {
  private constructor(
    readonly child: ChildProcess,
    readonly dir: string,
    readonly url: string,
    readonly port: number,
    readonly options: Required<Omit<ServeOptions, "dir" | "port">>,
    private readonly exited: Promise<void>,
    private readonly tokens: Record<Role, string>,
  ) {}

  static async start(options: ServeOptions = {}): Promise<Serve> {
    const opts = {
      store: options.store ?? "memory",
      tenant: options.tenant ?? "acme",
      project: options.project ?? "proj",
      session: options.session ?? "sess",
    } as const;
    const dir = options.dir ?? mkdtempSync(join(tmpdir(), "runkeep-ts-"));
    // Made before the server starts, so it knows them from its first request.
    const tokens = {
      reader: createToken(dir, opts.tenant, "reader"),
      worker: createToken(dir, opts.tenant, "worker"),
      operator: createToken(dir, opts.tenant, "operator"),
    };
    const store = opts.store === "fs" ? `fs:${join(dir, "data")}` : "memory:";
    const args = [
      "--store",
      store,
      "--tenant",
      opts.tenant,
      "--project",
      opts.project,
      "--session",
      opts.session,
      "serve",
      "--listen",
      `127.0.0.1:${options.port ?? 0}`,
      "--tokens",
      join(dir, "tokens.json"),
      "--shutdown-grace",
      "2s",
    ];
    const child = spawn(runkeepBinary(), args, {
      env: { ...cleanEnv(), NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
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
    const port = Number(new URL(url).port);
    return new Serve(child, dir, url, port, opts, exited, tokens);
  }

  /** A token of `role` for the server's tenant (made with `runkeep token create` before the start). */
  token(role: Role): string {
    return this.tokens[role];
  }

  /** A client with a new token of `role`. */
  client(role: Role): RunkeepClient {
    return new RunkeepClient({ baseUrl: this.url, token: this.token(role), tenant: this.options.tenant });
  }

  /** The scope's run address for `runId`. */
  run(runId: string): { tenantId: string; projectId: string; sessionId: string; runId: string } {
    return { tenantId: this.options.tenant, projectId: this.options.project, sessionId: this.options.session, runId };
  }

  /** SIGKILL: connections drop mid-answer, nothing is shut down gracefully. */
  async kill(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGKILL");
    await this.exited;
  }

  /** The same server again: same directory (store and tokens), same port. */
  restart(): Promise<Serve> {
    return Serve.start({ ...this.options, dir: this.dir, port: this.port });
  }

  /** Stops it and removes its directory. */
  async close(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** `runkeep token create` into `dir`'s token file; answers the secret. */
export function createToken(dir: string, tenant: string, role: Role): string {
  const out = execFileSync(
    runkeepBinary(),
    ["--tenant", tenant, "--json", "token", "create", "--role", role, "--label", "ts-test", "--tokens", join(dir, "tokens.json")],
    { env: cleanEnv(), encoding: "utf8" },
  );
  const token = (JSON.parse(out) as { token?: string }).token;
  if (!token) throw new Error(`runkeep token create printed no token: ${out}`);
  return token;
}

function cleanEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const k of ["RUNKEEP_STORE", "RUNKEEP_TENANT", "RUNKEEP_PROJECT", "RUNKEEP_SESSION", "RUNKEEP_TOKENS", "RUNKEEP_LOG"]) {
    delete env[k];
  }
  return env;
}

/** A checkpoint body for enqueue. */
export function firstCheckpoint(input: unknown, id = "cp_input"): { id: string; createdAt: number; state: { input: never } } {
  return { id, createdAt: Date.now(), state: { input: input as never } };
}

/** Rejects when `p` does not settle within `ms` (a bound on a wait, not a timing assertion). */
export function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  let t: ReturnType<typeof setTimeout>;
  return Promise.race([
    p.finally(() => clearTimeout(t)),
    new Promise<never>((_, reject) => {
      t = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
    }),
  ]);
}
