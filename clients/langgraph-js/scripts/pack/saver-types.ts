// Type-checked (tsc --noEmit, NodeNext) in the fresh project the tarballs are
// installed into: both packages resolve to their packed declarations, and the
// saver takes the client the user installed (one `@runkeep/client`).
import { RunkeepClient } from "@runkeep/client";
import { RunkeepSaver, StaleWriteOwnerError, type AnsweredInterrupt } from "@runkeep/langgraph-checkpoint";
import { MemorySaver } from "@langchain/langgraph-checkpoint";

const client = new RunkeepClient({ baseUrl: "http://127.0.0.1:7420", token: "t" });
export const saver = new RunkeepSaver({ client, project: "p", session: "s" });
export const base: typeof MemorySaver.prototype.getTuple = saver.getTuple.bind(saver);
export const answered: Promise<AnsweredInterrupt> = saver.answeredInterrupt("t-1");
export const isStale = (e: unknown): boolean => e instanceof StaleWriteOwnerError && e.isStaleWriteOwnerError;
