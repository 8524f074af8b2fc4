/**
 * The property names of every object type in types.ts, with whether each is
 * required, keyed by the schema name the server's OpenAPI document gives
 * it (the Rust wire type's name).
 *
 * The compiler proves this table matches the TypeScript types (each entry
 * `satisfies Shape<T>`: every property listed, none extra, `true` exactly
 * for the required ones); `test/openapi.test.ts` proves it matches the
 * OpenAPI document. Together: the hand-written types are the document's.
 *
 * @module
 */

import type * as T from "./types.js";

/** For each property of `X`: `true` when required, `false` when optional. */
export type Shape<X> = { [K in keyof X]-?: {} extends Pick<X, K> ? false : true };

/** Every checked schema: name → property → required. */
export const SCHEMA_KEYS = {
  RunAddress: { tenantId: true, projectId: true, sessionId: true, runId: true, parentRunId: false } satisfies Shape<T.RunAddress>,
  LeaseBody: { holder: true, fence: true, expiresAt: true } satisfies Shape<T.LeaseBody>,
  LeaseSummaryBody: { holder: true, fence: true, expiresAt: true, expired: true } satisfies Shape<T.LeaseSummaryBody>,
  ParkSummaryBody: {
    state: true,
    checkpointId: true,
    requestType: true,
    parkedAt: true,
    deadlineAt: false,
    resolvedAt: false,
  } satisfies Shape<T.ParkSummaryBody>,
  RunRowBody: {
    run: true,
    runCreatedAt: false,
    checkpointCount: true,
    latestCheckpointId: false,
    latestCheckpointAt: false,
    park: false,
    claim: false,
    damaged: false,
    status: true,
    finishedAt: false,
    attempts: true,
    availableAt: false,
  } satisfies Shape<T.RunRowBody>,
  RunPageBody: { entries: true, cursor: false } satisfies Shape<T.RunPageBody>,
  OutcomeBody: { status: true, result: false, reason: false } satisfies Shape<T.OutcomeBody>,
  LifecycleBody: {
    status: true,
    finishedAt: false,
    finishedFence: false,
    result: false,
    reason: false,
    attempts: true,
    maxAttempts: false,
    availableAt: false,
  } satisfies Shape<T.LifecycleBody>,
  PendingBody: {
    request: true,
    parkedAt: true,
    deadlineAt: false,
    resolvedAt: false,
    decision: false,
    extra: false,
  } satisfies Shape<T.PendingBody>,
  CheckpointBody: {
    id: true,
    createdAt: true,
    runCreatedAt: false,
    pending: false,
    fence: false,
    state: false,
  } satisfies Shape<T.CheckpointBody>,
  NewEventBody: { type: true, payload: false } satisfies Shape<T.NewEventBody>,
  EventBody: { seq: true, timestamp: true, type: true, generation: false, payload: true } satisfies Shape<T.EventBody>,
  SkippedBody: { position: true, reason: true } satisfies Shape<T.SkippedBody>,
  EventBatchBody: { events: true, skipped: false, lastSeq: true } satisfies Shape<T.EventBatchBody>,
  MessagesBody: { kind: true, throughEventSeq: false, messages: false } satisfies Shape<T.MessagesBody>,
  NewAuditBody: { who: true, what: true, outcome: true, extra: false } satisfies Shape<T.NewAuditBody>,
  AuditBody: {
    id: true,
    runId: true,
    seq: true,
    timestamp: true,
    who: true,
    what: true,
    outcome: true,
    generation: false,
    extra: false,
  } satisfies Shape<T.AuditBody>,
  ClaimBody: { holder: true, ttlMs: true, maxAttempts: false } satisfies Shape<T.ClaimBody>,
  ClaimNextBody: {
    holder: true,
    ttlMs: true,
    maxAttempts: false,
    project: false,
    session: false,
    park: false,
    order: false,
    waitMs: false,
  } satisfies Shape<T.ClaimNextBody>,
  Claimed: { run: true, lease: true } satisfies Shape<T.Claimed>,
  ClaimNextAnswer: { claimed: false } satisfies Shape<T.ClaimNextAnswer>,
  Done: { done: true } satisfies Shape<T.Done>,
  StepMessagesBody: { messages: true, throughEventSeq: false } satisfies Shape<T.StepMessagesBody>,
  StepBody: {
    events: false,
    checkpoint: false,
    messages: false,
    runRecord: false,
    finish: false,
  } satisfies Shape<T.StepBody>,
  StepReceiptBody: { events: true, checkpoint: false, lifecycle: false } satisfies Shape<T.StepReceiptBody>,
  RunSummary: {
    run: true,
    lease: false,
    lifecycle: true,
    latestCheckpoint: false,
    pending: false,
    lastSeq: true,
    now: true,
  } satisfies Shape<T.RunSummary>,
  Clock: { now: true } satisfies Shape<T.Clock>,
  WhoAmI: { tenant: true, role: true, tokenId: true } satisfies Shape<T.WhoAmI>,
  Waited: { changed: true, lastSeq: false } satisfies Shape<T.Waited>,
  Pruned: { deleted: true } satisfies Shape<T.Pruned>,
  Problem: {
    type: true,
    title: true,
    status: true,
    detail: false,
    instance: false,
    field: false,
    run: false,
    operation: false,
    presented: false,
    current: false,
    attempts: false,
    outcomeUnknown: false,
    firstAnswer: false,
    resolvedAt: false,
    requiredRole: false,
  } satisfies Shape<T.ProblemBody>,
  ReleaseBody: { fence: false } satisfies Shape<T.ReleaseBody>,
  SnoozeBody: { fence: true, until: true } satisfies Shape<T.SnoozeBody>,
  FinishBody: { fence: true, outcome: true } satisfies Shape<T.FinishBody>,
  EnqueueBody: { checkpoint: true, availableAt: false, maxAttempts: false } satisfies Shape<T.EnqueueBody>,
  WriteCheckpointBody: { checkpoint: true, fence: false } satisfies Shape<T.WriteCheckpointBody>,
  ResolveBody: { resolution: true, fence: false } satisfies Shape<T.ResolveBody>,
  PruneBody: { keepLast: true, fence: false } satisfies Shape<T.PruneBody>,
  AppendEventsBody: { events: true, fence: false } satisfies Shape<T.AppendEventsBody>,
  RecordBody: { record: true, fence: false } satisfies Shape<T.RecordBody>,
  WriteMessagesBody: { messages: true, throughEventSeq: true, fence: false } satisfies Shape<T.WriteMessagesBody>,
  ReportBody: { report: true, fence: false } satisfies Shape<T.ReportBody>,
  AppendAuditBody: { events: true, fence: false } satisfies Shape<T.AppendAuditBody>,
  CommitStepBody: { fence: true, step: true } satisfies Shape<T.CommitStepBody>,
  MaybeCheckpoint: { checkpoint: false } satisfies Shape<T.MaybeCheckpoint>,
  MaybeLease: { lease: false } satisfies Shape<T.MaybeLease>,
  MaybeRecord: { record: false } satisfies Shape<T.MaybeRecord>,
  MaybeReport: { report: false } satisfies Shape<T.MaybeReport>,
  Appended: { events: true } satisfies Shape<T.Appended>,
  AuditList: { records: true } satisfies Shape<T.AuditList>,
  ThreadBlobBody: { channel: true, version: true, type: true, data: false } satisfies Shape<T.ThreadBlobBody>,
  PutThreadCheckpointBody: {
    thread: true,
    ns: false,
    checkpointId: true,
    parentId: false,
    checkpoint: true,
    metadata: false,
    blobs: false,
    fence: false,
  } satisfies Shape<T.PutThreadCheckpointBody>,
  ThreadWriteBody: { idx: true, channel: true, type: true, data: false } satisfies Shape<T.ThreadWriteBody>,
  ThreadParkBody: { request: true, deadlineAt: false } satisfies Shape<T.ThreadParkBody>,
  PutThreadWritesBody: {
    thread: true,
    ns: false,
    checkpointId: true,
    taskId: true,
    taskPath: false,
    writes: true,
    park: false,
    fence: false,
  } satisfies Shape<T.PutThreadWritesBody>,
  StoredThreadWrite: {
    taskId: true,
    taskPath: true,
    idx: true,
    channel: true,
    type: true,
    data: false,
  } satisfies Shape<T.StoredThreadWrite>,
  ThreadParkState: { checkpoint: true, pending: true } satisfies Shape<T.ThreadParkState>,
  ThreadCheckpointBody: {
    thread: true,
    run: true,
    ns: true,
    checkpointId: true,
    parentId: false,
    checkpoint: true,
    metadata: true,
    values: true,
    writes: true,
    fence: false,
    createdAt: true,
    park: false,
  } satisfies Shape<T.ThreadCheckpointBody>,
  MaybeThreadCheckpoint: { checkpoint: false } satisfies Shape<T.MaybeThreadCheckpoint>,
  ThreadCheckpointList: { checkpoints: true } satisfies Shape<T.ThreadCheckpointList>,
  ThreadDeleted: { checkpointCount: true } satisfies Shape<T.ThreadDeleted>,
} as const;

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
} as const;

/** Every tagged union the client types: schema name → tag → its values. */
export const TAGGED = {
  ClaimAnswer: { outcome: every<T.ClaimAnswer["outcome"]>()(["acquired", "held", "finished", "notBefore"]) },
  ResolutionBody: { action: every<T.ResolutionBody["action"]>()(["answer", "expire"]) },
} as const;
