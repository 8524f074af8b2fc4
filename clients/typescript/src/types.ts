/**
 * The JSON shapes of the runkeep HTTP API, version 1.
 *
 * Every wire type here is an alias of the type generated from the server's
 * OpenAPI document (`crates/runkeep-http/openapi.json`) into
 * `src/generated/api.ts` by `npm run gen` (openapi-typescript); CI fails
 * while that file is stale. Only the client's own shapes (a run reference
 * whose tenant defaults, the query objects) are written by hand.
 *
 * Instants are epoch milliseconds (store clock). Fences are positive
 * integers. Ids follow the core's id rule (ASCII letters, digits, `_` and
 * `-`, starting with a letter or digit).
 *
 * @module
 */

import type { components } from "./generated/api.js";

type S = components["schemas"];

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A JSON object. */
export type JsonObject = { [key: string]: Json };

/**
 * A generated schema type with its open JSON values typed as {@link Json}:
 * the generator types a value of any shape as `unknown`, an object of any
 * members as `Record<string, never>`, and a park's request (an open object
 * that must carry a string `type`) as `{ type: string }` alone.
 */
export type Wire<T> = unknown extends T
  ? Json
  : T extends readonly (infer E)[]
    ? Wire<E>[]
    : T extends object
      ? [keyof T] extends ["type"]
        ? { [K in keyof T]: Wire<T[K]> } & JsonObject
        : string extends keyof T
        ? [T[string]] extends [never]
          ? JsonObject
          : { [key: string]: Wire<T[string]> }
        : { [K in keyof T]: Wire<T[K]> }
      : T;

/** The address of one run. */
export type RunAddress = Wire<S["RunAddress"]>;

/**
 * The address of one run as the client methods take it: the tenant defaults
 * to the client's (`RunkeepClientOptions.tenant`, or the token's).
 */
export interface RunRef {
  tenantId?: string;
  projectId: string;
  sessionId: string;
  runId: string;
  parentRunId?: string;
}

/** A lease handed to its taker. */
export type LeaseBody = Wire<S["LeaseBody"]>;

/** A run's top holding as a listing shows it. */
export type LeaseSummaryBody = Wire<S["LeaseSummaryBody"]>;

/** The state of a park. */
export type ParkState = Wire<S["ParkStateBody"]>;

/** A run's lifecycle status. */
export type RunStatus = Wire<S["RunStatusBody"]>;

/** How a holder ends a run. */
export type FinishStatus = Wire<S["FinishStatusBody"]>;

/** A listing order. */
export type Order = Wire<S["OrderBody"]>;

/** The park a listing row shows. */
export type ParkSummaryBody = Wire<S["ParkSummaryBody"]>;

/** One row of the listing. */
export type RunRowBody = Wire<S["RunRowBody"]>;

/** A page of the listing. */
export type RunPageBody = Wire<S["RunPageBody"]>;

/** A finish: status, result, reason. */
export type OutcomeBody = Wire<S["OutcomeBody"]>;

/** A run's lifecycle. */
export type LifecycleBody = Wire<S["LifecycleBody"]>;

/** A park: the human decision a run waits on. */
export type PendingBody = Wire<S["PendingBody"]>;

/** A checkpoint: its header and the host's state, apart. */
export type CheckpointBody = Wire<S["CheckpointBody"]>;

/** An event to append. */
export type NewEventBody = Wire<S["NewEventBody"]>;

/** An event as recorded. */
export type EventBody = Wire<S["EventBody"]>;

/** A record a tolerant read skipped. */
export type SkippedBody = Wire<S["SkippedBody"]>;

/** An event read. */
export type EventBatchBody = Wire<S["EventBatchBody"]>;

/** The kind of a message snapshot. */
export type MessagesKind = Wire<S["MessagesKind"]>;

/** The message history as last published. */
export type MessagesBody = Wire<S["MessagesBody"]>;

/** An audit event to append. */
export type NewAuditBody = Wire<S["NewAuditBody"]>;

/** An audit record. */
export type AuditBody = Wire<S["AuditBody"]>;

/** A failed attempt's error: what failed, in a word, and its text. */
export type AttemptErrorBody = Wire<S["AttemptErrorBody"]>;

/** One failed attempt in a run's history (`LifecycleBody.failures`). */
export type FailedAttemptBody = Wire<S["FailedAttemptBody"]>;

/** How a run is retried after a failed attempt (`EnqueueBody.retry`, `LifecycleBody.retry`). */
export type RetryPolicyBody = Wire<S["RetryPolicyBody"]>;

/** What a claim takes. */
export type ClaimBody = Wire<S["ClaimBody"]>;

/** What a claim answered. */
export type ClaimAnswer = Wire<S["ClaimAnswer"]>;

/** `claim_next`: scope narrowing, filter, claim options, optional wait. */
export type ClaimNextBody = Wire<S["ClaimNextBody"]>;

/** A run taken by `claim_next`. */
export type Claimed = Wire<S["Claimed"]>;

/** The answer of `claim_next`. */
export type ClaimNextAnswer = Wire<S["ClaimNextAnswer"]>;

/** `claim-next-batch`: the batch size and `claim-next`'s body. */
export type ClaimNextBatchBody = Wire<S["ClaimNextBatchBody"]>;

/** The answer of `claim-next-batch`. */
export type ClaimNextBatchAnswer = Wire<S["ClaimNextBatchAnswer"]>;

/** Whether a release, snooze or write took effect. */
export type Done = Wire<S["Done"]>;

/** How a park is answered. */
export type ResolutionBody = Wire<S["ResolutionBody"]>;

/** A message update inside a step. */
export type StepMessagesBody = Wire<S["StepMessagesBody"]>;

/** One step of a run, written all or nothing. */
export type StepBody = Wire<
  // The document's rule that a step writes something (at least one of its
  // members) comes out of the generator as extra union members; the type
  // keeps the step's own shape.
  Exclude<S["StepBody"], { events: unknown } | { checkpoint: unknown } | { messages: unknown } | { runRecord: unknown } | { finish: unknown }>
>;

/** What a committed step wrote. */
export type StepReceiptBody = Wire<S["StepReceiptBody"]>;

/** A hand-over's next claim: `claim_next`'s body without `waitMs`. */
export type NextClaimBody = Wire<S["NextClaimBody"]>;

/**
 * What a hand-over answered on the wire: the step's receipt, the run taken
 * next (`null` when none), and `nextError`, the problem of a claim that
 * failed after the step committed.
 */
export type HandOverAnswer = Wire<S["HandOverAnswer"]>;

/** Everything the console shows of one run, in one call. */
export type RunSummary = Wire<S["RunSummary"]>;

/** The store's clock. */
export type Clock = Wire<S["Clock"]>;

/** Who a token is. */
export type WhoAmI = Wire<S["WhoAmI"]>;

/** The answer of a long-poll wait. */
export type Waited = Wire<S["Waited"]>;

/** The ids a prune deleted. */
export type Pruned = Wire<S["Pruned"]>;

/** An RFC 9457 problem, with runkeep's extension members. */
export type ProblemBody = Wire<S["Problem"]>;

/** The listing's filters (query parameters of `GET /v1/tenants/{t}/runs`). */
export interface ListRunsQuery {
  project?: string;
  session?: string;
  /** `runId` (default), `createdAt` or `priority` (highest first, then run id). */
  order?: Order | "priority";
  /** Only runs whose priority is at least this. */
  minPriority?: number;
  /** Only runs whose park is in this set. */
  park?: ParkState[];
  /** `true`: only runs held live; `false`: only runs nobody holds. */
  claimed?: boolean;
  status?: RunStatus[];
  /** Page size (default 100, at most 1000). */
  limit?: number;
  cursor?: string;
  /** Judge expiry at this instant instead of the store's clock. */
  now?: number;
}

// ---- request and answer envelopes -------------------------------------------
//
// The `Maybe…` answers and `ClaimNextAnswer.claimed` are typed as the
// OpenAPI document has them (optional and nullable); the server sends the
// key with `null` when there is nothing. The client's methods answer `null`.

/** `POST …/release`. */
export type ReleaseBody = Wire<S["ReleaseBody"]>;

/** `POST …/snooze`. */
export type SnoozeBody = Wire<S["SnoozeBody"]>;

/** `POST …/finish`. */
export type FinishBody = Wire<S["FinishBody"]>;

/** `POST …/attempts/failed`. */
export type FailAttemptBody = Wire<S["FailAttemptBody"]>;

/** `POST …/cancel`. */
export type CancelBody = Wire<S["CancelBody"]>;

/** `POST …/enqueue`. */
export type EnqueueBody = Wire<S["EnqueueBody"]>;

/** An enqueue's idempotency key and window (`EnqueueBody.dedupe`). */
export type DedupeBody = Wire<S["DedupeBody"]>;

/** A run's concurrency key and limit (`EnqueueBody.concurrency`). */
export type ConcurrencyBody = Wire<S["ConcurrencyBody"]>;

/**
 * What an enqueue with `dedupe` answers: the run, whether this enqueue
 * created it (`false`: the key's window belongs to `run`; nothing changed),
 * and its checkpoint.
 */
export type EnqueuedBody = Wire<S["EnqueuedBody"]>;

/** `POST …/priority`. */
export type SetPriorityBody = Wire<S["SetPriorityBody"]>;

/** One holding of a run carrying a concurrency key. */
export type KeyHoldingBody = Wire<S["KeyHoldingBody"]>;

/** A concurrency key's holdings history, oldest first. */
export type KeyHoldingsBody = Wire<S["KeyHoldingsBody"]>;

/** `POST …/checkpoints`. */
export type WriteCheckpointBody = Wire<S["WriteCheckpointBody"]>;

/** `POST …/checkpoints/by-id/{id}/answer`. */
export type ResolveBody = Wire<S["ResolveBody"]>;

/** `POST …/prune`. */
export type PruneBody = Wire<S["PruneBody"]>;

/** `POST …/events`. */
export type AppendEventsBody = Wire<S["AppendEventsBody"]>;

/** `PUT …/record`. */
export type RecordBody = Wire<S["RecordBody"]>;

/** `PUT …/messages`. */
export type WriteMessagesBody = Wire<S["WriteMessagesBody"]>;

/** `PUT …/report`. */
export type ReportBody = Wire<S["ReportBody"]>;

/** `POST …/audit`. */
export type AppendAuditBody = Wire<S["AppendAuditBody"]>;

/** `POST …/steps`. */
export type CommitStepBody = Wire<S["CommitStepBody"]>;

/** `POST …/steps/hand-over`. */
export type HandOverBody = Wire<S["HandOverBody"]>;

/** `POST /v1/tenants/{tenant}/steps`: a group commit. */
export type CommitStepsBody = Wire<S["CommitStepsBody"]>;

/** One run's step in a group commit. */
export type StepCommitBody = Wire<S["StepCommitBody"]>;

/** The answer of a group commit: one outcome per step. */
export type CommitStepsAnswer = Wire<S["CommitStepsAnswer"]>;

/** A checkpoint read (`null` when there is none). */
export type MaybeCheckpoint = Wire<S["MaybeCheckpoint"]>;

/** A lease read. */
export type MaybeLease = Wire<S["MaybeLease"]>;

/** A run record read. */
export type MaybeRecord = Wire<S["MaybeRecord"]>;

/** A report read. */
export type MaybeReport = Wire<S["MaybeReport"]>;

/** Events as recorded by an append. */
export type Appended = Wire<S["Appended"]>;

/** Audit records. */
export type AuditList = Wire<S["AuditList"]>;

// ---- threads (checkpoint savers: `…/thread…`, `…/thread-checkpoints`) ----

/** One channel value at one version (a "blob"). */
export type ThreadBlobBody = Wire<S["ThreadBlobBody"]>;

/** `PUT …/thread/checkpoints`: a thread checkpoint and the values it changed. */
export type PutThreadCheckpointBody = Wire<S["PutThreadCheckpointBody"]>;

/** One pending write of a task. */
export type ThreadWriteBody = Wire<S["ThreadWriteBody"]>;

/** The park a batch of writes opens on its checkpoint (an interrupt). */
export type ThreadParkBody = Wire<S["ThreadParkBody"]>;

/** `POST …/thread/writes`: a task's pending writes on a thread checkpoint. */
export type PutThreadWritesBody = Wire<S["PutThreadWritesBody"]>;

/** A stored pending write. */
export type StoredThreadWrite = Wire<S["StoredThreadWrite"]>;

/** The park opened on a thread checkpoint by its writes. */
export type ThreadParkState = Wire<S["ThreadParkState"]>;

/** A thread checkpoint as read back. */
export type ThreadCheckpointBody = Wire<S["ThreadCheckpointBody"]>;

/** A thread checkpoint read (`null` when there is none). */
export type MaybeThreadCheckpoint = Wire<S["MaybeThreadCheckpoint"]>;

/** Thread checkpoints, newest first. */
export type ThreadCheckpointList = Wire<S["ThreadCheckpointList"]>;

/** A thread deleted. */
export type ThreadDeleted = Wire<S["ThreadDeleted"]>;
export type ThreadCheckpointRef = Wire<S["ThreadCheckpointRef"]>;
export type ThreadCheckpointsDeleted = Wire<S["ThreadCheckpointsDeleted"]>;

/** What a thread listing keeps (`GET …/thread/checkpoints`). */
export interface ThreadListQuery {
  /** Only this namespace (absent: every namespace; `""`: the root graph). */
  ns?: string;
  /** Only this checkpoint id. */
  checkpointId?: string;
  /** Only ids below this one (byte order). */
  before?: string;
  /** At most this many, newest first. */
  limit?: number;
  /** Only checkpoints whose metadata has each key with an equal value (an absent key equals `null`). */
  filter?: JsonObject;
}

/** What a listing across threads keeps (`GET {tenant}/thread-checkpoints`). */
export interface ThreadsListQuery {
  project?: string;
  /** Needs `project`. */
  session?: string;
  ns?: string;
  before?: string;
  limit?: number;
  filter?: JsonObject;
}

/** A recurring schedule: a cron in a time zone that enqueues one run per tick. */
export type ScheduleBody = Wire<S["ScheduleBody"]>;
/** A schedule with its session (a listing's entry). */
export type ScheduleEntryBody = Wire<S["ScheduleEntryBody"]>;
/** The schedules under a scope. */
export type ScheduleList = Wire<S["ScheduleList"]>;
export type PruneFinishedBody = Wire<S["PruneFinishedBody"]>;
export type PruneReportBody = Wire<S["PruneReportBody"]>;
/** One schedule, or `null`. */
export type MaybeSchedule = Wire<S["MaybeSchedule"]>;
/** The missed-tick policy of a schedule. */
export type MissedBody = Wire<S["MissedBody"]>;
/** Which missed-tick policy: `skip` or `catchUp`. */
export type MissedPolicy = S["MissedPolicy"];

/** The session a schedule lives in (the tenant defaults to the client's). */
export interface SessionRef {
  tenantId?: string;
  projectId: string;
  sessionId: string;
}
