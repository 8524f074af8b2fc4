/**
 * The JSON shapes of the runkeep HTTP API, version 1.
 *
 * Written by hand from `crates/runkeep-server/src/wire.rs` (the server's
 * wire types, which its OpenAPI document is generated from). The test
 * `test/openapi.test.ts` checks every interface named in {@link SCHEMA_KEYS}
 * (src/schema-keys.ts) against the committed OpenAPI document
 * `crates/runkeep-server/openapi.json`: the same property names and the same
 * required set.
 *
 * Instants are epoch milliseconds (store clock). Fences are positive
 * integers. Ids follow the core's id rule (ASCII letters, digits, `_` and
 * `-`, starting with a letter or digit).
 *
 * @module
 */

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A JSON object. */
export type JsonObject = { [key: string]: Json };

/** The address of one run. */
export interface RunAddress {
  tenantId: string;
  projectId: string;
  sessionId: string;
  runId: string;
  /** The parent run, for a sub-run. */
  parentRunId?: string;
}

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
export interface LeaseBody {
  /** Who took it. */
  holder: string;
  /** The fence every write under it presents. */
  fence: number;
  /** Expiry, epoch ms (store clock). */
  expiresAt: number;
}

/** A run's top holding as a listing shows it. */
export interface LeaseSummaryBody {
  /** Holder; empty for a released or unreadable holding. */
  holder: string;
  /** The top fence. */
  fence: number;
  /** Expiry, epoch ms; 0 for a released or unreadable holding. */
  expiresAt: number;
  /** Expired at the answer's instant. */
  expired: boolean;
}

/** The state of a park. */
export type ParkState = "outstanding" | "expired" | "resolved";

/** A run's lifecycle status. */
export type RunStatus = "active" | "completed" | "failed" | "cancelled";

/** How a holder ends a run. */
export type FinishStatus = "completed" | "failed" | "cancelled";

/** A listing order. */
export type Order = "runId" | "createdAt";

/** The park a listing row shows. */
export interface ParkSummaryBody {
  state: ParkState;
  checkpointId: string;
  /** `request.type`. */
  requestType: string;
  parkedAt: number;
  deadlineAt?: number;
  resolvedAt?: number;
}

/** One row of the listing. */
export interface RunRowBody {
  run: RunAddress;
  runCreatedAt?: number;
  checkpointCount: number;
  latestCheckpointId?: string;
  latestCheckpointAt?: number;
  park?: ParkSummaryBody;
  /** The top holding; absent when never claimed. */
  claim?: LeaseSummaryBody;
  /** Set when the run's records could not be read. */
  damaged?: string;
  status: RunStatus;
  finishedAt?: number;
  /** Takeovers from expired leases so far. */
  attempts: number;
  availableAt?: number;
}

/** A page of the listing. */
export interface RunPageBody {
  entries: RunRowBody[];
  /** Present iff more rows remain: pass it back as `cursor`. */
  cursor?: string;
}

/** A finish: status, result, reason. */
export interface OutcomeBody {
  status: FinishStatus;
  result?: Json;
  reason?: string;
}

/** A run's lifecycle. */
export interface LifecycleBody {
  status: RunStatus;
  finishedAt?: number;
  /** The fence the finish spent. */
  finishedFence?: number;
  result?: Json;
  reason?: string;
  attempts: number;
  maxAttempts?: number;
  availableAt?: number;
}

/** A park: the human decision a run waits on. */
export interface PendingBody {
  /** The human-facing request; carries a string `type`. */
  request: JsonObject;
  parkedAt: number;
  deadlineAt?: number;
  resolvedAt?: number;
  /** The answer. */
  decision?: Json;
  /** Any other fields, preserved. */
  extra?: JsonObject;
}

/** A checkpoint: its header and the host's state, apart. */
export interface CheckpointBody {
  /** Id; writing an existing id replaces it. */
  id: string;
  createdAt: number;
  runCreatedAt?: number;
  /** The park, when the run parks here. */
  pending?: PendingBody;
  /** The fence it was written under (set by the store; ignored on input). */
  fence?: number;
  /** The host's state, kept as given. */
  state?: JsonObject;
}

/** An event to append. */
export interface NewEventBody {
  /** The `type` discriminator. */
  type: string;
  /** Every other field (`type`, `seq`, `timestamp`, `generation` are the store's). */
  payload?: JsonObject;
}

/** An event as recorded. */
export interface EventBody {
  /** 1-based position in the run's log (the SSE event id). */
  seq: number;
  /** Recorded at, epoch ms (store clock). */
  timestamp: number;
  type: string;
  /** The fence it was appended under. */
  generation?: number;
  payload: JsonObject;
}

/** A record a tolerant read skipped. */
export interface SkippedBody {
  position: number;
  reason: string;
}

/** An event read. */
export interface EventBatchBody {
  events: EventBody[];
  skipped?: SkippedBody[];
  /** The log's last `seq` (0 when empty). */
  lastSeq: number;
}

/** The kind of a message snapshot. */
export type MessagesKind = "available" | "legacy-unverified" | "unavailable";

/** The message history as last published. */
export interface MessagesBody {
  kind: MessagesKind;
  throughEventSeq?: number;
  messages?: Json[];
}

/** An audit event to append. */
export interface NewAuditBody {
  who: string;
  what: string;
  outcome: string;
  extra?: JsonObject;
}

/** An audit record. */
export interface AuditBody {
  id: string;
  runId: string;
  seq: number;
  timestamp: number;
  who: string;
  what: string;
  outcome: string;
  generation?: number;
  extra?: JsonObject;
}

/** What a claim takes. */
export interface ClaimBody {
  /** The claiming worker (unique per process). The same holder renews. */
  holder: string;
  /** Lease length, ms. */
  ttlMs: number;
  /** Attempt limit for this claim. */
  maxAttempts?: number;
}

/** What a claim answered. */
export type ClaimAnswer =
  | { outcome: "acquired"; lease: LeaseBody }
  | { outcome: "held"; lease: LeaseSummaryBody }
  | { outcome: "finished"; status: RunStatus }
  | { outcome: "notBefore"; availableAt: number };

/** `claim_next`: scope narrowing, filter, claim options, optional wait. */
export interface ClaimNextBody extends ClaimBody {
  /** Only this project. */
  project?: string;
  /** Only this session (needs `project`). */
  session?: string;
  /** Only runs whose park is in this set. */
  park?: ParkState[];
  order?: Order;
  /** Wait up to this many ms (at most 30 000) for a run to become runnable. */
  waitMs?: number;
}

/** A run taken by `claim_next`. */
export interface Claimed {
  run: RunAddress;
  lease: LeaseBody;
}

/** The answer of `claim_next`. */
export interface ClaimNextAnswer {
  /** The run taken, or `null` when none was runnable (within the wait). */
  claimed?: Claimed | null;
}

/** Whether a release, snooze or write took effect. */
export interface Done {
  done: boolean;
}

/** How a park is answered. */
export type ResolutionBody = { action: "answer"; decision: Json } | { action: "expire" };

/** A message update inside a step. */
export interface StepMessagesBody {
  messages: Json[];
  /** The last event it accounts for; absent: the step's last event. */
  throughEventSeq?: number;
}

/** One step of a run, written all or nothing. */
export interface StepBody {
  events?: NewEventBody[];
  /** A checkpoint (with `pending` to park here). */
  checkpoint?: CheckpointBody;
  messages?: StepMessagesBody;
  runRecord?: JsonObject;
  /** Finish the run with this step. */
  finish?: OutcomeBody;
}

/** What a committed step wrote. */
export interface StepReceiptBody {
  events: EventBody[];
  checkpoint?: CheckpointBody;
  /** The lifecycle, when the step finished the run. */
  lifecycle?: LifecycleBody;
}

/** Everything the console shows of one run, in one call. */
export interface RunSummary {
  run: RunAddress;
  lease?: LeaseSummaryBody;
  lifecycle: LifecycleBody;
  latestCheckpoint?: CheckpointBody;
  pending?: CheckpointBody;
  lastSeq: number;
  /** The store's clock when this was read, epoch ms. */
  now: number;
}

/** The store's clock. */
export interface Clock {
  now: number;
}

/** Who a token is. */
export interface WhoAmI {
  tenant: string;
  role: "reader" | "worker" | "operator";
  tokenId: string;
}

/** The answer of a long-poll wait. */
export interface Waited {
  /** True when the store signalled a change before the timeout (re-read). */
  changed: boolean;
  /** For an events wait: the log's last `seq` at the answer. */
  lastSeq?: number;
}

/** The ids a prune deleted. */
export interface Pruned {
  deleted: string[];
}

/** An RFC 9457 problem, with runkeep's extension members. */
export interface ProblemBody {
  /** `urn:runkeep:problem:<slug>`. */
  type: string;
  title: string;
  status: number;
  detail?: string;
  instance?: string;
  /** The input field at fault (`invalid-input`, `malformed-body`). */
  field?: string;
  /** The run the problem is about (`fenced-out`, `contended`). */
  run?: string;
  /** The refused operation (`fenced-out`). */
  operation?: string;
  /** The fence the caller presented (`fenced-out`). */
  presented?: number;
  /** The run's current fence (`fenced-out`). */
  current?: number;
  /** Claim attempts lost (`contended`). */
  attempts?: number;
  /** The write may or may not have been stored (`unavailable`). */
  outcomeUnknown?: boolean;
  /** For a park answered twice (`conflict`): the first answer, as stored. */
  firstAnswer?: Json;
  /** When the first answer was recorded (`conflict` on a park). */
  resolvedAt?: number;
  /** The role the operation needs (`forbidden`). */
  requiredRole?: string;
}

/** The listing's filters (query parameters of `GET /v1/tenants/{t}/runs`). */
export interface ListRunsQuery {
  project?: string;
  session?: string;
  order?: Order;
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
export interface ReleaseBody {
  /** The holding to release; absent: the current holding (operator only). */
  fence?: number;
}

/** `POST …/snooze`. */
export interface SnoozeBody {
  fence: number;
  /** Not claimable before, epoch ms. */
  until: number;
}

/** `POST …/finish`. */
export interface FinishBody {
  /** The holding (spent by the finish). */
  fence: number;
  outcome: OutcomeBody;
}

/** `POST …/enqueue`. */
export interface EnqueueBody {
  /** The run's first checkpoint. */
  checkpoint: CheckpointBody;
  /** Not claimable before, epoch ms. */
  availableAt?: number;
  /** The run's own attempt limit. */
  maxAttempts?: number;
}

/** `POST …/checkpoints`. */
export interface WriteCheckpointBody {
  checkpoint: CheckpointBody;
  fence?: number;
}

/** `POST …/checkpoints/by-id/{id}/answer`. */
export interface ResolveBody {
  resolution: ResolutionBody;
  /** The holding it is written under; absent: an operator's answer. */
  fence?: number;
}

/** `POST …/prune`. */
export interface PruneBody {
  /** How many to keep (unanswered parks are always kept). */
  keepLast: number;
  fence?: number;
}

/** `POST …/events`. */
export interface AppendEventsBody {
  events: NewEventBody[];
  fence?: number;
}

/** `PUT …/record`. */
export interface RecordBody {
  record: JsonObject;
  fence?: number;
}

/** `PUT …/messages`. */
export interface WriteMessagesBody {
  messages: Json[];
  /** The last event it accounts for. */
  throughEventSeq: number;
  fence?: number;
}

/** `PUT …/report`. */
export interface ReportBody {
  report: string;
  fence?: number;
}

/** `POST …/audit`. */
export interface AppendAuditBody {
  events: NewAuditBody[];
  fence?: number;
}

/** `POST …/steps`. */
export interface CommitStepBody {
  /** The holding; checked by the store with the whole step. */
  fence: number;
  step: StepBody;
}

/** A checkpoint read (`null` when there is none). */
export interface MaybeCheckpoint {
  checkpoint?: CheckpointBody | null;
}

/** A lease read. */
export interface MaybeLease {
  lease?: LeaseSummaryBody | null;
}

/** A run record read. */
export interface MaybeRecord {
  record?: JsonObject | null;
}

/** A report read. */
export interface MaybeReport {
  report?: string | null;
}

/** Events as recorded by an append. */
export interface Appended {
  events: EventBody[];
}

/** Audit records. */
export interface AuditList {
  records: AuditBody[];
}

// ---- threads (checkpoint savers: `…/thread…`, `…/thread-checkpoints`) ----

/** One channel value at one version (a "blob"). */
export interface ThreadBlobBody {
  channel: string;
  /**
   * The version as text (an integer version as its decimal digits): matched
   * against the checkpoint's `channel_versions` entry for the channel, a
   * string as itself and a number as its JSON text.
   */
  version: string;
  /** The client's serialization tag (`json`, `bytes`, `empty`, …). */
  type: string;
  /** Base64 of the serialized value; `null` for a value without bytes. */
  data?: string | null;
}

/** `PUT …/thread/checkpoints`: a thread checkpoint and the values it changed. */
export interface PutThreadCheckpointBody {
  /** The thread's own id as the client names it (cross-thread listings return it). */
  thread: string;
  /** The namespace (`""`: the root graph). */
  ns?: string;
  /** Its id; the latest of a namespace is the greatest id (byte order). */
  checkpointId: string;
  /** The parent's id (same namespace). */
  parentId?: string;
  /** The checkpoint document without its channel values (kept as given; its `channel_versions` says which blob each channel reads back). */
  checkpoint: JsonObject;
  /** The metadata (kept as given; what `filter` matches). */
  metadata?: JsonObject;
  /** The channel values this checkpoint changed. */
  blobs?: ThreadBlobBody[];
  fence?: number;
}

/** One pending write of a task. */
export interface ThreadWriteBody {
  /** `>= 0`: an ordinary write (a repeat of `(taskId, idx)` is ignored); `< 0`: a special channel's slot (a repeat replaces it). */
  idx: number;
  channel: string;
  type: string;
  data?: string | null;
}

/** The park a batch of writes opens on its checkpoint (an interrupt). */
export interface ThreadParkBody {
  /** The human-facing request; carries a string `type`. */
  request: JsonObject;
  /** Deadline, epoch ms. */
  deadlineAt?: number;
}

/** `POST …/thread/writes`: a task's pending writes on a thread checkpoint. */
export interface PutThreadWritesBody {
  thread: string;
  ns?: string;
  checkpointId: string;
  taskId: string;
  /** The task's path (sorts writes). */
  taskPath?: string;
  writes: ThreadWriteBody[];
  /** Parks the run on this checkpoint (an interrupt). */
  park?: ThreadParkBody;
  fence?: number;
}

/** A stored pending write. */
export interface StoredThreadWrite {
  taskId: string;
  taskPath: string;
  idx: number;
  channel: string;
  type: string;
  data?: string | null;
}

/** The park opened on a thread checkpoint by its writes. */
export interface ThreadParkState {
  /** The runkeep checkpoint holding the park (what the console and `resolvePark` name). */
  checkpoint: string;
  pending: PendingBody;
}

/** A thread checkpoint as read back. */
export interface ThreadCheckpointBody {
  /** The thread's own id (as the writer named it). */
  thread: string;
  /** The run that keeps the thread. */
  run: string;
  ns: string;
  checkpointId: string;
  parentId?: string | null;
  /** The checkpoint document as written. */
  checkpoint: JsonObject;
  /** The metadata as written. */
  metadata: JsonObject;
  /** The channel values rebuilt from `channel_versions` (a channel whose blob was never written is absent). */
  values: ThreadBlobBody[];
  /** The pending writes, in `(taskPath, taskId, idx)` order. */
  writes: StoredThreadWrite[];
  fence?: number;
  createdAt: number;
  /** The park its writes opened, with the answer once given. */
  park?: ThreadParkState;
}

/** A thread checkpoint read (`null` when there is none). */
export interface MaybeThreadCheckpoint {
  checkpoint?: ThreadCheckpointBody | null;
}

/** Thread checkpoints, newest first. */
export interface ThreadCheckpointList {
  checkpoints: ThreadCheckpointBody[];
}

/** A thread deleted. */
export interface ThreadDeleted {
  /** Runkeep checkpoints (thread checkpoints and write records) deleted. */
  checkpointCount: number;
}

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
