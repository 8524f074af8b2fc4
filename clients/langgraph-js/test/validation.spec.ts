/**
 * LangGraph.js's own checkpointer validation suite
 * (`@langchain/langgraph-checkpoint-validation` 1.1.1) against
 * {@link RunkeepSaver} over a live `runkeep serve`. The package's
 * `validate-checkpointer` CLI is broken in 1.1.1 (it imports a schema the
 * package no longer exports), so the suite runs through `validate()` here.
 *
 * Every `createCheckpointer()` gets a saver on a fresh runkeep session, so
 * listings across threads see only that instance's threads (the suite
 * reuses thread ids such as "thread-1" across instances).
 */

import { validate } from "@langchain/langgraph-checkpoint-validation";

import type { RunkeepSaver } from "../src/index.js";
import { saver } from "./context.js";

validate<RunkeepSaver>({
  checkpointerName: "RunkeepSaver",
  createCheckpointer: () => saver(),
});
