/**
 * The runtime lists of the API's string enums and tagged unions, keyed by
 * their schema names. The compiler proves each list complete against the
 * types (generated from the OpenAPI document, see types.ts);
 * `test/openapi.test.ts` proves it matches the document.
 *
 * @module
 */

import type * as T from "./types.js";

/** Proves at compile time that `values` lists every member of the union `U`. */
function every<U extends string>() {
  return <const A extends readonly U[]>(values: A & ([U] extends [A[number]] ? unknown : never)): A => values;
}

/** Every string enum the client types, by its schema name: the values. */
export const ENUMS = {
  ParkStateBody: every<T.ParkState>()(["outstanding", "expired", "resolved"]),
  RunStatusBody: every<T.RunStatus>()(["active", "completed", "failed", "cancelled"]),
  FinishStatusBody: every<T.FinishStatus>()(["completed", "failed", "cancelled"]),
  OrderBody: every<T.Order>()(["runId", "createdAt"]),
  MessagesKind: every<T.MessagesKind>()(["available", "legacy-unverified", "unavailable"]),
  MissedPolicy: every<T.MissedPolicy>()(["skip", "catchUp"]),
} as const;

/** Every tagged union the client types: schema name → tag → its values. */
export const TAGGED = {
  ClaimAnswer: { outcome: every<T.ClaimAnswer["outcome"]>()(["acquired", "held", "finished", "notBefore", "atLimit"]) },
  ResolutionBody: { action: every<T.ResolutionBody["action"]>()(["answer", "expire"]) },
} as const;
