/** One `runkeep serve` for every spec file; each spec isolates itself by session. */

import type { TestProject } from "vitest/node";

import { Serve, type Served } from "./serve.js";

declare module "vitest" {
  export interface ProvidedContext {
    runkeep: Served;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const serve = await Serve.start();
  project.provide("runkeep", serve.served);
  return () => serve.close();
}
