/** Clients and savers against the tests' `runkeep serve`. */

import { inject } from "vitest";
import { RunkeepClient } from "@runkeep/client";

import { RunkeepSaver, type RunkeepSaverOptions } from "../src/index.js";
import type { Role } from "./serve.js";

let sessions = 0;

export function client(role: Role = "worker"): RunkeepClient {
  const s = inject("runkeep");
  return new RunkeepClient({ baseUrl: s.url, token: s.tokens[role], tenant: s.tenant });
}

/** A fresh session name: a saver on it sees no other test's threads. */
export function freshSession(prefix = "s"): string {
  sessions += 1;
  return `${prefix}${process.pid}-${sessions}-${Math.random().toString(36).slice(2, 8)}`;
}

/** A saver on a fresh session (worker token unless said otherwise). */
export function saver(options: Partial<RunkeepSaverOptions> = {}): RunkeepSaver {
  return new RunkeepSaver({ client: client(), project: "langgraph-js", session: freshSession(), ...options });
}
