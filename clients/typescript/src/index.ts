/**
 * `@runkeep/client`: a typed client and a worker helper for the runkeep
 * HTTP API (`runkeep serve`).
 *
 * - {@link RunkeepClient}: every API operation over `fetch`, an
 *   `AbortSignal` on each, the event tail as an async iterator.
 * - {@link runWorker}: claim through `claim_next`, renew at a third of the
 *   TTL, stop the handler the moment the lease is lost, write through the
 *   atomic step, finish.
 * - Errors typed from the problem details ({@link RunkeepError} and its
 *   subclasses).
 *
 * @module
 */

export * from "./client.js";
export * from "./errors.js";
export * from "./sse.js";
export * from "./types.js";
export * from "./worker.js";
export { ENUMS, TAGGED } from "./enums.js";
