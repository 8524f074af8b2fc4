// Type-checked (tsc --noEmit, NodeNext) in the fresh project the tarball is
// installed into: `@runkeep/client` resolves to its packed declarations.
import { RunkeepClient, runWorker, type RunRef, type WorkerReport } from "@runkeep/client";

const client = new RunkeepClient({ baseUrl: "http://127.0.0.1:7420", token: "t" });
const run: RunRef = { projectId: "p", sessionId: "s", runId: "run_1" };
export const report: Promise<WorkerReport> = runWorker({ client, ttlMs: 30_000, handler: async () => undefined });
export const summary = client.summary(run);
