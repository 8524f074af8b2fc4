/**
 * {@link RunkeepClient}: one method per operation of the runkeep HTTP API
 * (`runkeep serve`, `/v1`), over the platform's `fetch`.
 *
 * Every method takes an `AbortSignal` (`{ signal }`); an aborted call
 * rejects with the signal's reason, as `fetch` does. Every non-2xx answer
 * rejects with the typed error of its problem details (errors.ts); a
 * failure below HTTP rejects with a `ConnectionError`. Writes that a fence
 * guards take it as `fence`; the server passes it to the store, which
 * checks it (a stale one is `FencedOut`, with `presented` and `current`).
 *
 * @module
 */

import { Doubling } from "./backoff.js";
import { ConnectionError, problemError, responseError, RunkeepError } from "./errors.js";
import { SseParser, sseMessages } from "./sse.js";
import type {
  AppendAuditBody,
  AppendEventsBody,
  Appended,
  AttemptErrorBody,
  CancelBody,
  FailAttemptBody,
  AuditBody,
  AuditList,
  CommitStepBody,
  DedupeBody,
  EnqueueBody,
  EnqueuedBody,
  KeyHoldingsBody,
  SetPriorityBody,
  HandOverAnswer,
  HandOverBody,
  ClaimNextBatchAnswer,
  ClaimNextBatchBody,
  CommitStepsAnswer,
  CommitStepsBody,
  NextClaimBody,
  FinishBody,
  MaybeCheckpoint,
  MaybeLease,
  MaybeRecord,
  MaybeReport,
  PruneBody,
  RecordBody,
  ReleaseBody,
  ReportBody,
  ResolveBody,
  SnoozeBody,
  WriteCheckpointBody,
  WriteMessagesBody,
  CheckpointBody,
  ClaimAnswer,
  ClaimBody,
  ClaimNextAnswer,
  ClaimNextBody,
  Claimed,
  Clock,
  Done,
  EventBatchBody,
  EventBody,
  JsonObject,
  Json,
  LeaseSummaryBody,
  LifecycleBody,
  ListRunsQuery,
  MessagesBody,
  NewAuditBody,
  NewEventBody,
  OutcomeBody,
  MaybeThreadCheckpoint,
  ProblemBody,
  Pruned,
  PutThreadCheckpointBody,
  PutThreadWritesBody,
  ThreadCheckpointBody,
  ThreadCheckpointList,
  ThreadDeleted,
  ThreadCheckpointRef,
  ThreadCheckpointsDeleted,
  ThreadListQuery,
  ScheduleBody,
  ScheduleList,
  PruneFinishedBody,
  PruneReportBody,
  MaybeSchedule,
  SessionRef,
  ThreadsListQuery,
  ResolutionBody,
  RunAddress,
  RunPageBody,
  RunRef,
  RunRowBody,
  RunSummary,
  StepBody,
  StepReceiptBody,
  Waited,
  WhoAmI,
} from "./types.js";

/** How a {@link RunkeepClient} reaches its server. */
export interface RunkeepClientOptions {
  /** The server's address, e.g. `http://127.0.0.1:8080` (a path prefix is kept). */
  baseUrl: string | URL;
  /** A bearer token (`runkeep token create`). */
  token: string;
  /**
   * The tenant a {@link RunRef} without `tenantId` belongs to. Default: the
   * token's own tenant, asked once from `/v1/whoami`.
   */
  tenant?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
}

/** What every call takes. */
export interface CallOptions {
  /** Aborts the call. */
  signal?: AbortSignal | undefined;
}

/** A write a fence may guard. */
export interface FencedOptions extends CallOptions {
  /** The holding the write is made under; absent: unfenced. */
  fence?: number | undefined;
}

/** Options of {@link RunkeepClient.tail}. */
export interface TailOptions extends CallOptions {
  /** Start after this `seq` (default 0: from the first event). */
  sinceSeq?: number;
  /**
   * Reconnect after a dropped connection or a server restart, asking for
   * the events after the last one delivered (`Last-Event-ID`), so none is
   * lost or repeated. Default true. Refusals (401, 403, 404, 400) are never
   * retried: they reject the iteration.
   */
  reconnect?: boolean;
  /** First pause before reconnecting, ms (doubles up to {@link maxRetryDelayMs}). Default 200. */
  retryDelayMs?: number;
  /** Longest pause between reconnections, ms. Default 5000. */
  maxRetryDelayMs?: number;
  /** Called before each reconnection (for logs and tests). */
  onReconnect?: (info: TailReconnect) => void;
}

/** What {@link TailOptions.onReconnect} is told. */
export interface TailReconnect {
  /** Reconnections since the last delivered event (1 for the first). */
  attempt: number;
  /** The last `seq` delivered: the tail resumes after it. */
  lastSeq: number;
  /** Why the previous connection ended. */
  error: unknown;
}

type Query = Record<string, string | number | boolean | undefined>;

/**
 * Every operation of the API (its OpenAPI `operationId`) with its method,
 * path (`{run}` stands for {@link RUN_PATH}) and the {@link RunkeepClient}
 * method that calls it. The one place the client spells a method or a
 * path: every request names its operation and takes both from here.
 * `test/openapi.test.ts` checks it both ways against the document and
 * against `crates/runkeep-http/operations.json`, the table the server is
 * built from.
 */
export const OPERATIONS = {
  clock: ["GET", "/v1/clock", "clockNow"],
  whoami: ["GET", "/v1/whoami", "whoami"],
  list_runs: ["GET", "/v1/tenants/{tenant}/runs", "listRuns"],
  claim_next: ["POST", "/v1/tenants/{tenant}/claim-next", "claimNext"],
  claim_next_batch: ["POST", "/v1/tenants/{tenant}/claim-next-batch", "claimNextBatch"],
  wait_runnable: ["GET", "/v1/tenants/{tenant}/runnable/wait", "waitRunnable"],
  run_summary: ["GET", "{run}", "summary"],
  claim: ["POST", "{run}/claim", "claim"],
  release: ["POST", "{run}/release", "release"],
  finish: ["POST", "{run}/finish", "finish"],
  snooze: ["POST", "{run}/snooze", "snooze"],
  enqueue: ["POST", "{run}/enqueue", "enqueue"],
  reopen: ["POST", "{run}/reopen", "reopen"],
  set_priority: ["POST", "{run}/priority", "setPriority"],
  key_holdings: ["GET", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/key-holdings", "keyHoldings"],
  fail_attempt: ["POST", "{run}/attempts/failed", "failAttempt"],
  cancel: ["POST", "{run}/cancel", "cancel"],
  lease: ["GET", "{run}/lease", "lease"],
  lifecycle: ["GET", "{run}/lifecycle", "lifecycle"],
  commit_step: ["POST", "{run}/steps", "commitStep"],
  commit_step_and_claim_next: ["POST", "{run}/steps/hand-over", "commitStepAndClaimNext"],
  commit_steps: ["POST", "/v1/tenants/{tenant}/steps", "commitSteps"],
  list_checkpoints: ["GET", "{run}/checkpoints", "listCheckpoints"],
  write_checkpoint: ["POST", "{run}/checkpoints", "writeCheckpoint"],
  latest_checkpoint: ["GET", "{run}/checkpoints/latest", "latestCheckpoint"],
  find_pending: ["GET", "{run}/checkpoints/pending", "findPending"],
  resume_point: ["GET", "{run}/checkpoints/resume-point", "resumePoint"],
  read_checkpoint: ["GET", "{run}/checkpoints/by-id/{checkpoint}", "readCheckpoint"],
  delete_checkpoint: ["DELETE", "{run}/checkpoints/by-id/{checkpoint}", "deleteCheckpoint"],
  resolve_park: ["POST", "{run}/checkpoints/by-id/{checkpoint}/answer", "resolvePark"],
  prune_checkpoints: ["POST", "{run}/prune", "prune"],
  read_events: ["GET", "{run}/events", "readEvents"],
  append_events: ["POST", "{run}/events", "appendEvents"],
  tail_events: ["GET", "{run}/events/stream", "tail"],
  wait_events: ["GET", "{run}/events/wait", "waitEvents"],
  read_run_record: ["GET", "{run}/record", "readRecord"],
  write_run_record: ["PUT", "{run}/record", "writeRecord"],
  read_messages: ["GET", "{run}/messages", "readMessages"],
  write_messages: ["PUT", "{run}/messages", "writeMessages"],
  read_report: ["GET", "{run}/report", "readReport"],
  write_report: ["PUT", "{run}/report", "writeReport"],
  read_audit: ["GET", "{run}/audit", "readAudit"],
  append_audit: ["POST", "{run}/audit", "appendAudit"],
  put_thread_checkpoint: ["PUT", "{run}/thread/checkpoints", "putThreadCheckpoint"],
  list_thread_checkpoints: ["GET", "{run}/thread/checkpoints", "listThreadCheckpoints"],
  get_thread_checkpoint: ["GET", "{run}/thread/checkpoint", "getThreadCheckpoint"],
  put_thread_writes: ["POST", "{run}/thread/writes", "putThreadWrites"],
  delete_thread: ["DELETE", "{run}/thread", "deleteThread"],
  delete_thread_checkpoints: ["POST", "{run}/thread/checkpoints/delete", "deleteThreadCheckpoints"],
  list_threads_checkpoints: ["GET", "/v1/tenants/{tenant}/thread-checkpoints", "listThreadsCheckpoints"],
  prune_finished: ["POST", "/v1/tenants/{tenant}/prune-finished", "pruneFinished"],
  list_schedules: ["GET", "/v1/tenants/{tenant}/schedules", "listSchedules"],
  put_schedule: ["PUT", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/schedules/{schedule}", "putSchedule"],
  get_schedule: ["GET", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/schedules/{schedule}", "getSchedule"],
  delete_schedule: ["DELETE", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/schedules/{schedule}", "deleteSchedule"],
  advance_schedule: ["POST", "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/schedules/{schedule}/advance", "advanceSchedule"],
} as const satisfies Record<string, readonly [string, string, keyof RunkeepClient]>;

/** The name of an operation ({@link OPERATIONS}). */
export type Operation = keyof typeof OPERATIONS;

/**
 * What {@link RunkeepClient.commitStepAndClaimNext} did: the step committed
 * (its receipt), and the run taken next.
 */
export interface HandOver {
  /** The committed step. */
  receipt: StepReceiptBody;
  /** The run taken next with its lease; `null` when none was claimable or the claim failed. */
  next: Claimed | null;
  /**
   * The claim's error, when it failed after the step committed (a store
   * that claims after committing): the step stands, nothing was claimed,
   * and `claimNext` may be retried. `null` otherwise.
   */
  nextError: RunkeepError | null;
}

/** The path prefix `{run}` stands for in {@link OPERATIONS}. */
/** The largest `limit` of `GET …/events` (400 above it). */
export const MAX_EVENTS_PAGE = 10_000;
/** The largest `limit` of `GET …/checkpoints` (400 above it). */
export const MAX_CHECKPOINTS_PAGE = 1000;

export const RUN_PATH = "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/runs/{run}";

/** The runkeep API over `fetch`. */
export class RunkeepClient {
  readonly baseUrl: string;
  private readonly token: string;
  private readonly fetchImpl: typeof fetch;
  private readonly headers: Record<string, string>;
  private tenant: Promise<string> | undefined;
  private clock: { store: number; local: number } | undefined;

  constructor(options: RunkeepClientOptions) {
    if (!options.token) throw new TypeError("RunkeepClient: a token is required (runkeep token create)");
    this.baseUrl = String(options.baseUrl).replace(/\/+$/, "");
    if (!/^https?:\/\//.test(this.baseUrl)) {
      throw new TypeError(`RunkeepClient: baseUrl ${JSON.stringify(this.baseUrl)} is not an http(s) URL`);
    }
    this.token = options.token;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.headers = options.headers ?? {};
    if (options.tenant !== undefined) this.tenant = Promise.resolve(options.tenant);
  }

  /**
   * The store's clock as last seen (every answer carries it in
   * `runkeep-now`), advanced by the local monotonic clock since; the local
   * wall clock before the first answer.
   */
  storeNow(): number {
    if (!this.clock) return Date.now();
    return Math.round(this.clock.store + (performance.now() - this.clock.local));
  }

  /** The default tenant (option `tenant`, else the token's). */
  defaultTenant(options: CallOptions = {}): Promise<string> {
    if (!this.tenant) {
      const p = this.whoami(options).then((w) => w.tenant);
      this.tenant = p;
      p.catch(() => {
        if (this.tenant === p) this.tenant = undefined;
      });
    }
    return this.tenant;
  }

  // ---- transport -------------------------------------------------------

  private async send(
    method: string,
    path: string,
    options: { query?: Query | undefined; body?: unknown; signal?: AbortSignal | undefined; headers?: Record<string, string> },
  ): Promise<Response> {
    const url = this.baseUrl + path + queryString(options.query);
    const headers: Record<string, string> = {
      ...this.headers,
      authorization: `Bearer ${this.token}`,
      accept: "application/json",
      ...options.headers,
    };
    let body: string | undefined;
    if (options.body !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    const request = { method, path };
    let res: Response;
    try {
      const init: RequestInit = { method, headers };
      if (body !== undefined) init.body = body;
      if (options.signal) init.signal = options.signal;
      res = await this.fetchImpl(url, init);
    } catch (e) {
      if (options.signal?.aborted) throw options.signal.reason;
      const refused = connectionRefused(e);
      throw new ConnectionError(
        refused
          ? `cannot connect to ${this.baseUrl}; nothing was sent; retry`
          : `no answer from ${this.baseUrl} (${describe(e)})${method === "GET" ? "" : "; the write may or may not have landed: read it back before repeating it"}`,
        request,
        !refused && method !== "GET",
        e,
      );
    }
    const now = Number(res.headers.get("runkeep-now"));
    if (Number.isFinite(now) && now > 0) this.clock = { store: now, local: performance.now() };
    if (!res.ok) throw await responseError(res, request);
    return res;
  }

  private async call<T>(
    op: Operation,
    path: string,
    options: { query?: Query | undefined; body?: unknown; signal?: AbortSignal | undefined } = {},
  ): Promise<T> {
    const method = OPERATIONS[op][0];
    const res = await this.send(method, path, options);
    const text = await readText(res, options.signal, { method, path });
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new RunkeepError(
        {
          type: "urn:runkeep:client:unexpected-answer",
          title: "Unexpected answer",
          status: res.status,
          detail: `the server's answer is not JSON: ${text.slice(0, 200)}`,
        },
        { method, path },
      );
    }
  }

  /**
   * `op`'s path ({@link OPERATIONS}, the one place a path is spelled) in the
   * run's tenant (else the default), with the run's and checkpoint's ids;
   * a per-run path's query carries the run's `parent`.
   */
  private async path(
    op: Operation,
    options: CallOptions,
    target: {
      run?: RunRef | undefined;
      checkpoint?: string | undefined;
      session?: SessionRef | undefined;
      schedule?: string | undefined;
    } = {},
  ): Promise<{ path: string; query: Query }> {
    const { run, checkpoint, session, schedule } = target;
    const template = OPERATIONS[op][1].replace(/^\{run\}/, RUN_PATH);
    const ids: Record<string, string | undefined> = {
      project: run?.projectId ?? session?.projectId,
      session: run?.sessionId ?? session?.sessionId,
      run: run?.runId,
      checkpoint,
      schedule,
    };
    if (template.includes("{tenant}"))
      ids.tenant = run?.tenantId ?? session?.tenantId ?? (await this.defaultTenant(options));
    const path = template.replace(/\{(\w+)\}/g, (_, name: string) => {
      const id = ids[name];
      if (id === undefined) throw new TypeError(`RunkeepClient: ${op} needs {${name}}`);
      return encodeURIComponent(id);
    });
    return { path, query: run?.parentRunId !== undefined ? { parent: run.parentRunId } : {} };
  }

  private async runGet<T>(op: Operation, run: RunRef, options: CallOptions, query: Query = {}, checkpoint?: string): Promise<T> {
    const p = await this.path(op, options, { run, checkpoint });
    return this.call<T>(op, p.path, { query: { ...query, ...p.query }, signal: options.signal });
  }

  private async runWrite<T>(op: Operation, run: RunRef, body: unknown, options: CallOptions, checkpoint?: string): Promise<T> {
    const p = await this.path(op, options, { run, checkpoint });
    return this.call<T>(op, p.path, { query: p.query, body, signal: options.signal });
  }

  // ---- retention ------------------------------------------------------------

  /**
   * One batch of the retention prune (operator, `POST …/prune-finished`):
   * deletes up to `limit` finished top-level runs whose finish is older
   * than `keepFinishedForMs` (a run's own retention wins), each with all
   * its evidence and its sub-runs, never a held or reopened one. Call
   * again while the answer's `more` is true.
   */
  async pruneFinished(body: PruneFinishedBody, options: CallOptions = {}): Promise<PruneReportBody> {
    return this.call("prune_finished", (await this.path("prune_finished", options)).path, {
      body,
      signal: options.signal,
    });
  }

  // ---- recurring schedules ------------------------------------------------

  /**
   * The tenant's recurring schedules (`GET …/schedules`), narrowed to a
   * project and a session in it; each with its `nextTick` and `lastRun`.
   */
  async listSchedules(
    query: { project?: string; session?: string } = {},
    options: CallOptions = {},
  ): Promise<ScheduleList> {
    return this.call("list_schedules", (await this.path("list_schedules", options)).path, {
      query: { project: query.project, session: query.session },
      signal: options.signal,
    });
  }

  /**
   * Creates or replaces a schedule (operator, `PUT …/schedules/{name}`): its
   * cron (5 fields, or 6 with seconds first) in its time zone enqueues one
   * run per tick, `run_<name>-<YYYYMMDDTHHMMSSZ>`. A replacement keeps the
   * stored creation time and cursor.
   */
  async putSchedule(
    session: SessionRef,
    name: string,
    body: Omit<ScheduleBody, "name"> & { name?: string },
    options: CallOptions = {},
  ): Promise<ScheduleBody> {
    const p = await this.path("put_schedule", options, { session, schedule: name });
    return this.call("put_schedule", p.path, { body: { ...body, name }, signal: options.signal });
  }

  /** One schedule (`GET …/schedules/{name}`), `null` when there is none. */
  async getSchedule(session: SessionRef, name: string, options: CallOptions = {}): Promise<ScheduleBody | null> {
    const p = await this.path("get_schedule", options, { session, schedule: name });
    const r = await this.call<MaybeSchedule>("get_schedule", p.path, { signal: options.signal });
    return r.schedule ?? null;
  }

  /** Deletes a schedule (operator, `DELETE …/schedules/{name}`); its runs stay. */
  async deleteSchedule(session: SessionRef, name: string, options: CallOptions = {}): Promise<Done> {
    const p = await this.path("delete_schedule", options, { session, schedule: name });
    return this.call("delete_schedule", p.path, { signal: options.signal });
  }

  /**
   * Moves a schedule's cursor from `from` (absent: none yet) to `to`,
   * compare-and-set (`POST …/schedules/{name}/advance`): what a scheduler
   * does after enqueueing a tick's run; `done: false` when another moved it.
   */
  async advanceSchedule(
    session: SessionRef,
    name: string,
    cursor: { from?: number; to: number },
    options: CallOptions = {},
  ): Promise<Done> {
    const p = await this.path("advance_schedule", options, { session, schedule: name });
    return this.call("advance_schedule", p.path, { body: cursor, signal: options.signal });
  }

  // ---- the store and the token ------------------------------------------

  /** The store's clock (`GET /v1/clock`). */
  async clockNow(options: CallOptions = {}): Promise<Clock> {
    return this.call("clock", (await this.path("clock", options)).path, options);
  }

  /** Who the token is (`GET /v1/whoami`). */
  async whoami(options: CallOptions = {}): Promise<WhoAmI> {
    return this.call("whoami", (await this.path("whoami", options)).path, options);
  }

  // ---- the listing and the queue ------------------------------------------

  /** One page of the listing (`GET …/runs`). */
  async listRuns(query: ListRunsQuery = {}, options: CallOptions = {}): Promise<RunPageBody> {
    return this.call("list_runs", (await this.path("list_runs", options)).path, {
      query: {
        project: query.project,
        session: query.session,
        order: query.order,
        minPriority: query.minPriority,
        park: query.park?.join(","),
        claimed: query.claimed,
        status: query.status?.join(","),
        limit: query.limit,
        cursor: query.cursor,
        now: query.now,
      },
      signal: options.signal,
    });
  }

  /** Every row of the listing, page after page (following the cursor). */
  async *allRuns(query: ListRunsQuery = {}, options: CallOptions = {}): AsyncGenerator<RunRowBody> {
    let cursor = query.cursor;
    for (;;) {
      const page = await this.listRuns(cursor === undefined ? query : { ...query, cursor }, options);
      yield* page.entries;
      if (page.cursor == null) return;
      cursor = page.cursor;
    }
  }

  /**
   * Takes the next runnable run of the tenant (`POST …/claim-next`); with
   * `waitMs` (at most 30 000) the server waits that long for one before
   * answering `{ claimed: null }`.
   */
  async claimNext(body: ClaimNextBody, options: CallOptions = {}): Promise<ClaimNextAnswer> {
    return this.call("claim_next", (await this.path("claim_next", options)).path, { body, signal: options.signal });
  }

  /**
   * Takes up to `max` runs (1 to 256) in one request
   * (`POST …/claim-next-batch`), in the order {@link claimNext} would hand
   * them out, each under its own lease and fence: a worker's local queue.
   * With `claim.waitMs`, waits until at least one is runnable. Resolves to
   * the runs taken (empty: none).
   */
  async claimNextBatch(max: number, claim: ClaimNextBody, options: CallOptions = {}): Promise<Claimed[]> {
    const body: ClaimNextBatchBody = { max, claim };
    const a = await this.call<ClaimNextBatchAnswer>("claim_next_batch", (await this.path("claim_next_batch", options)).path, {
      body,
      signal: options.signal,
    });
    return a.claimed;
  }

  /** Waits until a run may have become runnable (`GET …/runnable/wait`). */
  async waitRunnable(
    query: { project?: string; session?: string; timeoutMs?: number } = {},
    options: CallOptions = {},
  ): Promise<Waited> {
    return this.call("wait_runnable", (await this.path("wait_runnable", options)).path, { query, signal: options.signal });
  }

  /** Everything about one run in one call (`GET …/runs/{run}`). */
  summary(run: RunRef, options: CallOptions = {}): Promise<RunSummary> {
    return this.runGet("run_summary", run, options);
  }

  // ---- claims and the lifecycle -----------------------------------------

  /** Claims (or, for the same holder, renews with a new fence) a run (`POST …/claim`). */
  claim(run: RunRef, body: ClaimBody, options: CallOptions = {}): Promise<ClaimAnswer> {
    return this.runWrite("claim", run, body, options);
  }

  /**
   * Releases the holding at `fence` (`POST …/release`); without a fence, an
   * operator's release of whoever holds the run.
   */
  release(run: RunRef, options: FencedOptions = {}): Promise<Done> {
    const body: ReleaseBody = withFence({}, options.fence);
    return this.runWrite("release", run, body, options);
  }

  /** Finishes the run held at `fence` (`POST …/finish`); spends the fence. */
  finish(run: RunRef, fence: number, outcome: OutcomeBody, options: CallOptions = {}): Promise<LifecycleBody> {
    const body: FinishBody = { fence, outcome };
    return this.runWrite("finish", run, body, options);
  }

  /** Releases the holding and defers the run until `until` (epoch ms, `POST …/snooze`). */
  snooze(run: RunRef, fence: number, until: number, options: CallOptions = {}): Promise<Done> {
    const body: SnoozeBody = { fence, until };
    return this.runWrite("snooze", run, body, options);
  }

  /**
   * Reports that the attempt held at `fence` failed (`POST …/attempts/failed`):
   * the handler threw, or ran past its attempt timeout. The store keeps the
   * error in the run's failure history, counts the attempt toward the limit
   * (`maxAttempts`, over the run's own, as on a claim) like a takeover,
   * ends the holding (the fence is spent), and defers the run by its retry
   * backoff — or, when this attempt reaches the limit, dead-letters it
   * (failed, `attempts exhausted`; `deadLettered` in the answer). The error
   * is cut to the store's limits with a marker first ({@link attemptError}).
   * A cancelled run answers `Cancelled`; a stale fence `FencedOut`.
   */
  failAttempt(
    run: RunRef,
    fence: number,
    error: { kind: string; message: string },
    options: CallOptions & { maxAttempts?: number } = {},
  ): Promise<LifecycleBody> {
    const body: FailAttemptBody = { fence, error: attemptError(error.kind, error.message) };
    if (options.maxAttempts !== undefined) body.maxAttempts = options.maxAttempts;
    return this.runWrite("fail_attempt", run, body, options);
  }

  /**
   * Cancels an active run, claimed or not (operator, `POST …/cancel`): it
   * is finished as cancelled with `reason` (default "cancelled by an
   * operator"), its holding ends, and its holder's next write is refused
   * as `Cancelled` (its next renewal answers `finished`, status
   * `cancelled`). No claim takes it until it is reopened. A finished run
   * answers `Conflict`.
   */
  cancel(run: RunRef, options: CallOptions & { reason?: string } = {}): Promise<LifecycleBody> {
    const body: CancelBody = options.reason !== undefined ? { reason: options.reason } : {};
    return this.runWrite("cancel", run, body, options);
  }

  /**
   * Creates a runnable run with its first checkpoint (`POST …/enqueue`).
   * `maxAttempts` is its attempt limit; `retry` (`{ baseMs, factor, capMs }`)
   * the backoff after a failed attempt (default 1 s, ×2, at most 10 min,
   * with equal jitter).
   */
  enqueue(
    run: RunRef,
    body: Omit<EnqueueBody, "dedupe">,
    options: CallOptions = {},
  ): Promise<CheckpointBody> {
    return this.runWrite("enqueue", run, body, options);
  }

  /**
   * An enqueue carrying an idempotency key (`POST …/enqueue` with
   * `dedupe: { key, windowMs }`): while the window of a first enqueue with
   * the key (in the run's session) is open and its run exists, this one
   * creates nothing and answers that run with `created: false`. Otherwise
   * it creates `run` (`created: true`) and starts the key's window.
   */
  enqueueOnce(
    run: RunRef,
    body: EnqueueBody & { dedupe: DedupeBody },
    options: CallOptions = {},
  ): Promise<EnqueuedBody> {
    return this.runWrite("enqueue", run, body, options);
  }

  /**
   * Sets an active run's priority (operator, `POST …/priority`): workers
   * take the highest first (-1 000 000 to 1 000 000, default 0); a holding
   * is not touched. A finished run answers `Conflict`.
   */
  setPriority(run: RunRef, priority: number, options: CallOptions = {}): Promise<LifecycleBody> {
    const body: SetPriorityBody = { priority };
    return this.runWrite("set_priority", run, body, options);
  }

  /**
   * Every holding of a run carrying the concurrency key `key` in the
   * session, oldest first (`GET …/sessions/{session}/key-holdings`): the
   * evidence the key's limit held.
   */
  async keyHoldings(
    session: { tenantId?: string; projectId: string; sessionId: string },
    key: string,
    options: CallOptions = {},
  ): Promise<KeyHoldingsBody> {
    const ref: RunRef = { ...session, runId: "" };
    const p = await this.path("key_holdings", options, { run: ref });
    return this.call("key_holdings", p.path, { query: { key }, signal: options.signal });
  }

  /** Makes a finished run active and claimable again (operator, `POST …/reopen`). */
  reopen(run: RunRef, options: CallOptions = {}): Promise<LifecycleBody> {
    return this.runWrite("reopen", run, {}, options);
  }

  /** The run's top holding (`GET …/lease`), `null` when never claimed. */
  async lease(run: RunRef, options: CallOptions & { now?: number } = {}): Promise<LeaseSummaryBody | null> {
    const r = await this.runGet<MaybeLease>("lease", run, options, { now: options.now });
    return r.lease ?? null;
  }

  /** The run's lifecycle (`GET …/lifecycle`). */
  lifecycle(run: RunRef, options: CallOptions = {}): Promise<LifecycleBody> {
    return this.runGet("lifecycle", run, options);
  }

  // ---- the atomic step and checkpoints ------------------------------------

  /**
   * Commits one step all or nothing under `fence` (`POST …/steps`): its
   * events, checkpoint, messages, run record and, with `finish`, the end of
   * the run.
   */
  commitStep(run: RunRef, fence: number, step: StepBody, options: CallOptions = {}): Promise<StepReceiptBody> {
    const body: CommitStepBody = { fence, step };
    return this.runWrite("commit_step", run, body, options);
  }

  /**
   * A worker's hand-over in one request (`POST …/steps/hand-over`): commits
   * `step` under `fence` as {@link commitStep} does, then takes the next
   * runnable run of the tenant as {@link claimNext} would with `next` (no
   * `waitMs`: it answers at once), never this run. A refused step rejects
   * (e.g. `FencedOut`) and claimed nothing. A claim that failed after the
   * step committed resolves with `nextError` set (the typed error of its
   * problem). A lost answer leaves both unknown: the step may have
   * committed and the next run may be held under `next.holder` until its
   * lease expires.
   */
  async commitStepAndClaimNext(
    run: RunRef,
    fence: number,
    step: StepBody,
    next: NextClaimBody,
    options: CallOptions = {},
  ): Promise<HandOver> {
    const body: HandOverBody = { fence, step, next };
    const a = await this.runWrite<HandOverAnswer>("commit_step_and_claim_next", run, body, options);
    return {
      receipt: a.receipt,
      next: a.next ?? null,
      nextError: a.nextError != null ? problemError(a.nextError) : null,
    };
  }

  /**
   * A group commit in one request (`POST /v1/tenants/{tenant}/steps`): up
   * to 256 runs' steps, one per run, every run in one tenant, each judged
   * as {@link commitStep} judges it under its own fence. Resolves to one
   * outcome per step, in the order given: `{ receipt }` when it committed,
   * `{ error }` (the typed error, e.g. `FencedOut`) when it was refused —
   * one refused step leaves the others committed. A batch bad as a whole
   * (empty, a run twice, an invalid step) rejects and writes nothing.
   */
  async commitSteps(
    steps: ReadonlyArray<{ run: RunRef; fence: number; step: StepBody }>,
    options: CallOptions = {},
  ): Promise<Array<{ receipt: StepReceiptBody; error?: undefined } | { receipt?: undefined; error: RunkeepError }>> {
    const tenant = steps[0]?.run.tenantId ?? (await this.defaultTenant(options));
    const body: CommitStepsBody = {
      steps: steps.map(({ run, fence, step }) => ({
        run: {
          tenantId: run.tenantId ?? tenant,
          projectId: run.projectId,
          sessionId: run.sessionId,
          runId: run.runId,
          ...(run.parentRunId !== undefined ? { parentRunId: run.parentRunId } : {}),
        },
        fence,
        step,
      })),
    };
    // The path names the tenant only (the first run's, or the client's).
    const path = (await this.path("commit_steps", options, { run: steps[0] && { ...steps[0].run, tenantId: tenant } })).path;
    const a = await this.call<CommitStepsAnswer>("commit_steps", path, { body, signal: options.signal });
    return a.outcomes.map((o) => (o.problem != null ? { error: problemError(o.problem) } : { receipt: o.receipt! }));
  }

  /**
   * Every checkpoint, in the store's total order (`GET …/checkpoints`),
   * read in pages of the server's largest (1000). With `fields: "summary"`
   * each comes without its `state` (read one with `readCheckpoint`); the
   * default, `"full"`, carries the states, as before.
   */
  async listCheckpoints(
    run: RunRef,
    options: CallOptions & { fields?: "summary" | "full" } = {},
  ): Promise<CheckpointBody[]> {
    const out: CheckpointBody[] = [];
    for (;;) {
      const query: Query = {
        fields: options.fields ?? "full",
        limit: MAX_CHECKPOINTS_PAGE,
        after: out.at(-1)?.id,
      };
      const page = await this.runGet<CheckpointBody[]>("list_checkpoints", run, options, query);
      out.push(...page);
      if (page.length < MAX_CHECKPOINTS_PAGE) return out;
    }
  }

  /** Writes a checkpoint (`POST …/checkpoints`). */
  writeCheckpoint(run: RunRef, checkpoint: CheckpointBody, options: FencedOptions = {}): Promise<CheckpointBody> {
    const body: WriteCheckpointBody = withFence({ checkpoint }, options.fence);
    return this.runWrite("write_checkpoint", run, body, options);
  }

  /** The latest checkpoint (`GET …/checkpoints/latest`). */
  async latestCheckpoint(run: RunRef, options: CallOptions = {}): Promise<CheckpointBody | null> {
    return (await this.runGet<MaybeCheckpoint>("latest_checkpoint", run, options)).checkpoint ?? null;
  }

  /** The outstanding park's checkpoint (`GET …/checkpoints/pending`). */
  async findPending(run: RunRef, options: CallOptions & { now?: number } = {}): Promise<CheckpointBody | null> {
    const q = { now: options.now };
    return (await this.runGet<MaybeCheckpoint>("find_pending", run, options, q)).checkpoint ?? null;
  }

  /** The checkpoint to resume from (`GET …/checkpoints/resume-point`). */
  async resumePoint(run: RunRef, options: CallOptions & { now?: number } = {}): Promise<CheckpointBody | null> {
    const q = { now: options.now };
    return (await this.runGet<MaybeCheckpoint>("resume_point", run, options, q))
      .checkpoint ?? null;
  }

  /** One checkpoint by id (`GET …/checkpoints/by-id/{id}`), `null` when absent. */
  async readCheckpoint(run: RunRef, id: string, options: CallOptions = {}): Promise<CheckpointBody | null> {
    return (await this.runGet<MaybeCheckpoint>("read_checkpoint", run, options, {}, id)).checkpoint ?? null;
  }

  /** Deletes a checkpoint (`DELETE …/checkpoints/by-id/{id}`). */
  async deleteCheckpoint(run: RunRef, id: string, options: FencedOptions = {}): Promise<Done> {
    const p = await this.path("delete_checkpoint", options, { run, checkpoint: id });
    return this.call("delete_checkpoint", p.path, { query: { ...p.query, fence: options.fence }, signal: options.signal });
  }

  /**
   * Answers a park exactly once (`POST …/checkpoints/by-id/{id}/answer`):
   * with `fence`, the holder's answer; without, an operator's. A second
   * answer is `Conflict`, whose `firstAnswer` is the one that won. The
   * answer is recorded at the server's store clock (no client instant).
   */
  resolvePark(
    run: RunRef,
    checkpointId: string,
    resolution: ResolutionBody,
    options: FencedOptions = {},
  ): Promise<CheckpointBody> {
    const body: ResolveBody = { resolution };
    if (options.fence !== undefined) body.fence = options.fence;
    return this.runWrite("resolve_park", run, body, options, checkpointId);
  }

  /** Deletes all but the newest `keepLast` checkpoints (`POST …/prune`). */
  prune(run: RunRef, keepLast: number, options: FencedOptions = {}): Promise<Pruned> {
    const body: PruneBody = withFence({ keepLast }, options.fence);
    return this.runWrite("prune_checkpoints", run, body, options);
  }

  // ---- events -------------------------------------------------------------

  /**
   * One page of the events after `sinceSeq` (`GET …/events`): at most
   * `limit` (default 1000, at most 10 000). `more: true` says events follow;
   * read on from `nextSinceSeq`, or use `readAllEvents`.
   */
  readEvents(
    run: RunRef,
    query: { sinceSeq?: number; integrity?: "tolerant" | "strict"; limit?: number } = {},
    options: CallOptions = {},
  ): Promise<EventBatchBody> {
    return this.runGet("read_events", run, options, query);
  }

  /**
   * Every event after `sinceSeq`, read page by page (`readEvents` until
   * `more` is false). A strict read checks the whole log with its first
   * page; damage a later page meets is an error as well.
   */
  async readAllEvents(
    run: RunRef,
    query: { sinceSeq?: number; integrity?: "tolerant" | "strict" } = {},
    options: CallOptions = {},
  ): Promise<EventBatchBody> {
    let since = query.sinceSeq ?? 0;
    const all: EventBatchBody = { events: [], skipped: [], lastSeq: 0 };
    for (let first = true; ; first = false) {
      const q: { sinceSeq: number; limit: number; integrity?: "tolerant" | "strict" } = { sinceSeq: since, limit: MAX_EVENTS_PAGE };
      if (first && query.integrity !== undefined) q.integrity = query.integrity;
      const page = await this.readEvents(run, q, options);
      const skipped = page.skipped ?? [];
      if (!first && query.integrity === "strict" && skipped.length > 0) {
        throw new Error(`strict read: a damaged record after seq ${since}`);
      }
      all.events.push(...page.events);
      for (const s of skipped) {
        if (!all.skipped!.some((k) => k.position === s.position)) all.skipped!.push(s);
      }
      all.lastSeq = Math.max(all.lastSeq, page.lastSeq);
      const next = page.nextSinceSeq;
      if (!page.more || next == null || next <= since) return all;
      since = next;
    }
  }

  /** Appends events (`POST …/events`); answers them with their `seq`. */
  async appendEvents(run: RunRef, events: NewEventBody[], options: FencedOptions = {}): Promise<EventBody[]> {
    const body: AppendEventsBody = withFence({ events }, options.fence);
    const r = await this.runWrite<Appended>("append_events", run, body, options);
    return r.events;
  }

  /** Waits until the log's last `seq` is above `sinceSeq` (`GET …/events/wait`). */
  waitEvents(run: RunRef, query: { sinceSeq?: number; timeoutMs?: number } = {}, options: CallOptions = {}): Promise<Waited> {
    return this.runGet("wait_events", run, options, query);
  }

  /**
   * The run's events as they are appended, as an async iterator over the
   * SSE tail (`GET …/events/stream`): every event after `sinceSeq`, then
   * each new one as it lands, until the caller breaks out or aborts
   * `signal` (the iteration then rejects with the signal's reason).
   *
   * A dropped connection or a restarted server is reconnected with
   * `Last-Event-ID` set to the last event delivered: the server's ids are
   * the store's `seq`s, so no event is lost or delivered twice. A refusal
   * (401, 403, 404, 400) or a `problem` event from the server rejects.
   */
  async *tail(run: RunRef, options: TailOptions = {}): AsyncGenerator<EventBody> {
    const reconnect = options.reconnect ?? true;
    const delays = new Doubling(options.retryDelayMs ?? 200, options.maxRetryDelayMs ?? 5000);
    const p = await this.path("tail_events", options, { run });
    let lastSeq = options.sinceSeq ?? 0;
    let attempt = 0;
    for (;;) {
      const local = new AbortController();
      const onAbort = () => local.abort(options.signal?.reason);
      options.signal?.addEventListener("abort", onAbort, { once: true });
      let error: unknown;
      try {
        if (options.signal?.aborted) throw options.signal.reason;
        const res = await this.send(OPERATIONS.tail_events[0], p.path, {
          query: { ...p.query, sinceSeq: lastSeq },
          signal: local.signal,
          headers: { accept: "text/event-stream", "last-event-id": String(lastSeq) },
        });
        if (!res.body) throw new ConnectionError("the tail answered without a body", { method: "GET", path: p.path }, false, undefined);
        const parser = new SseParser(String(lastSeq));
        for await (const m of sseMessages(res.body, parser)) {
          if (m.event === "problem") {
            throw problemOf(m.data, p.path);
          }
          if (m.event !== "event") continue;
          const ev = JSON.parse(m.data) as EventBody;
          // Seqs only increase; a repeat (never expected) is dropped, not delivered twice.
          if (ev.seq <= lastSeq) continue;
          lastSeq = ev.seq;
          attempt = 0;
          delays.reset();
          yield ev;
        }
        error = new ConnectionError("the server ended the event stream", { method: "GET", path: p.path }, false, undefined);
      } catch (e) {
        if (options.signal?.aborted) throw options.signal.reason;
        if (!isTransient(e)) throw e;
        error = e;
      } finally {
        options.signal?.removeEventListener("abort", onAbort);
        local.abort();
      }
      if (!reconnect) throw error;
      attempt += 1;
      options.onReconnect?.({ attempt, lastSeq, error });
      await sleep(delays.next(), options.signal);
    }
  }

  // ---- documents and audit --------------------------------------------------

  /** The run record (`GET …/record`), `null` when never written. */
  async readRecord(run: RunRef, options: CallOptions = {}): Promise<JsonObject | null> {
    return (await this.runGet<MaybeRecord>("read_run_record", run, options)).record ?? null;
  }

  /** Replaces the run record (`PUT …/record`). */
  writeRecord(run: RunRef, record: JsonObject, options: FencedOptions = {}): Promise<Done> {
    const body: RecordBody = withFence({ record }, options.fence);
    return this.runWrite("write_run_record", run, body, options);
  }

  /** The message snapshot (`GET …/messages`). */
  readMessages(run: RunRef, options: CallOptions = {}): Promise<MessagesBody> {
    return this.runGet("read_messages", run, options);
  }

  /** Publishes a message snapshot accounting for events up to `throughEventSeq` (`PUT …/messages`). */
  writeMessages(run: RunRef, messages: Json[], throughEventSeq: number, options: FencedOptions = {}): Promise<Done> {
    const body: WriteMessagesBody = withFence({ messages, throughEventSeq }, options.fence);
    return this.runWrite("write_messages", run, body, options);
  }

  /** The report (`GET …/report`), `null` when never written. */
  async readReport(run: RunRef, options: CallOptions = {}): Promise<string | null> {
    return (await this.runGet<MaybeReport>("read_report", run, options)).report ?? null;
  }

  /** Replaces the report (`PUT …/report`). */
  writeReport(run: RunRef, report: string, options: FencedOptions = {}): Promise<Done> {
    const body: ReportBody = withFence({ report }, options.fence);
    return this.runWrite("write_report", run, body, options);
  }

  /** The audit trail after `sinceSeq` (`GET …/audit`). */
  async readAudit(run: RunRef, options: CallOptions & { sinceSeq?: number } = {}): Promise<AuditBody[]> {
    return (await this.runGet<AuditList>("read_audit", run, options, { sinceSeq: options.sinceSeq })).records;
  }

  /** Appends audit events (`POST …/audit`). */
  async appendAudit(run: RunRef, events: NewAuditBody[], options: FencedOptions = {}): Promise<AuditBody[]> {
    const body: AppendAuditBody = withFence({ events }, options.fence);
    const r = await this.runWrite<AuditList>("append_audit", run, body, options);
    return r.records;
  }

  // ---- threads (checkpoint savers) -------------------------------------------

  /**
   * Writes a thread checkpoint `(ns, checkpointId)` with the channel values
   * it changed (`PUT …/thread/checkpoints`), replacing one with the same
   * key. Fenced like any checkpoint write.
   */
  putThreadCheckpoint(run: RunRef, body: Omit<PutThreadCheckpointBody, "fence">, options: FencedOptions = {}): Promise<Done> {
    return this.runWrite("put_thread_checkpoint", run, withFence(body, options.fence), options);
  }

  /**
   * Stores a task's pending writes on a thread checkpoint
   * (`POST …/thread/writes`): a repeated ordinary `(taskId, idx)` is
   * ignored, a special channel's slot (`idx < 0`) replaced; `park` parks
   * the run there.
   */
  putThreadWrites(run: RunRef, body: Omit<PutThreadWritesBody, "fence">, options: FencedOptions = {}): Promise<Done> {
    return this.runWrite("put_thread_writes", run, withFence(body, options.fence), options);
  }

  /**
   * One thread checkpoint (`GET …/thread/checkpoint`): by `checkpointId`,
   * else the namespace's latest (greatest id); `null` when there is none.
   */
  async getThreadCheckpoint(
    run: RunRef,
    query: { ns?: string; checkpointId?: string } = {},
    options: CallOptions = {},
  ): Promise<ThreadCheckpointBody | null> {
    const q = { ns: query.ns ?? "", checkpointId: query.checkpointId };
    return (await this.runGet<MaybeThreadCheckpoint>("get_thread_checkpoint", run, options, q)).checkpoint ?? null;
  }

  /** A thread's checkpoints, newest first (`GET …/thread/checkpoints`). */
  async listThreadCheckpoints(run: RunRef, query: ThreadListQuery = {}, options: CallOptions = {}): Promise<ThreadCheckpointBody[]> {
    const q = {
      ns: query.ns,
      checkpointId: query.checkpointId,
      before: query.before,
      limit: query.limit,
      filter: filterParam(query.filter),
    };
    return (await this.runGet<ThreadCheckpointList>("list_thread_checkpoints", run, options, q)).checkpoints;
  }

  /**
   * Thread checkpoints across every thread of the tenant, or of `project`
   * (and `session`), newest first (`GET {tenant}/thread-checkpoints`).
   */
  async listThreadsCheckpoints(query: ThreadsListQuery = {}, options: CallOptions = {}): Promise<ThreadCheckpointBody[]> {
    const p = await this.path("list_threads_checkpoints", options);
    const r = await this.call<ThreadCheckpointList>("list_threads_checkpoints", p.path, {
      query: {
        project: query.project,
        session: query.session,
        ns: query.ns,
        before: query.before,
        limit: query.limit,
        filter: filterParam(query.filter),
      },
      signal: options.signal,
    });
    return r.checkpoints;
  }

  /** Deletes every thread record of the run (`DELETE …/thread`); its lease, lifecycle and events stay. */
  async deleteThread(run: RunRef, options: FencedOptions = {}): Promise<ThreadDeleted> {
    const p = await this.path("delete_thread", options, { run });
    return this.call("delete_thread", p.path, { query: { ...p.query, fence: options.fence }, signal: options.signal });
  }

  /**
   * Deletes the named checkpoints of a thread and their pending writes
   * (`POST …/thread/checkpoints/delete`; LangGraph's `prune` and
   * `delete_for_runs`); answers how many existed.
   */
  deleteThreadCheckpoints(
    run: RunRef,
    checkpoints: ThreadCheckpointRef[],
    options: FencedOptions = {},
  ): Promise<ThreadCheckpointsDeleted> {
    return this.runWrite("delete_thread_checkpoints", run, { checkpoints, fence: options.fence ?? null }, options);
  }
}

function filterParam(filter: JsonObject | undefined): string | undefined {
  return filter === undefined || Object.keys(filter).length === 0 ? undefined : JSON.stringify(filter);
}

/** The longest error kind a failed attempt may carry, in characters. */
export const MAX_ERROR_KIND_CHARS = 128;
/** The longest error message a failed attempt may carry, in characters. */
export const MAX_ERROR_MESSAGE_CHARS = 4096;

/**
 * A failed attempt's error within the store's limits, as the Rust
 * `AttemptError::new` makes it: an empty kind becomes `error`, and a kind
 * or message longer than {@link MAX_ERROR_KIND_CHARS} /
 * {@link MAX_ERROR_MESSAGE_CHARS} characters (Unicode code points, as the
 * store counts them) is cut, ending with a marker saying how much was cut
 * (` … [N more characters cut]`). The store refuses longer text; it never
 * cuts it.
 */
export function attemptError(kind: string, message: string): AttemptErrorBody {
  return {
    kind: kind.trim() === "" ? "error" : cutChars(kind, MAX_ERROR_KIND_CHARS),
    message: cutChars(message, MAX_ERROR_MESSAGE_CHARS),
  };
}

function cutChars(s: string, max: number): string {
  const chars = Array.from(s);
  if (chars.length <= max) return s;
  const marker = ` … [${chars.length - max} more characters cut]`;
  const keep = Math.max(0, max - Array.from(marker).length);
  return chars.slice(0, keep).join("") + marker;
}

/** The {@link RunRef} of a run's address. */
export function refOf(run: RunAddress): RunRef {
  const r: RunRef = { tenantId: run.tenantId, projectId: run.projectId, sessionId: run.sessionId, runId: run.runId };
  if (run.parentRunId != null) r.parentRunId = run.parentRunId;
  return r;
}

function withFence<T extends object>(body: T, fence: number | undefined): T & { fence?: number } {
  return fence === undefined ? body : { ...body, fence };
}

function queryString(q: Query | undefined): string {
  if (!q) return "";
  const parts: string[] = [];
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined) continue;
    parts.push(`${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`);
  }
  return parts.length ? `?${parts.join("&")}` : "";
}

async function readText(res: Response, signal: AbortSignal | undefined, request: { method: string; path: string }): Promise<string> {
  try {
    return await res.text();
  } catch (e) {
    if (signal?.aborted) throw signal.reason;
    throw new ConnectionError(
      `the answer was cut off (${describe(e)})`,
      request,
      request.method !== "GET",
      e,
    );
  }
}

function problemOf(data: string, path: string): RunkeepError {
  let body: ProblemBody;
  try {
    body = JSON.parse(data) as ProblemBody;
  } catch {
    body = { type: "about:blank", title: "Event stream failed", status: 500, detail: data.slice(0, 200) };
  }
  return problemError(body, { method: "GET", path });
}

function isTransient(e: unknown): boolean {
  if (e instanceof ConnectionError) return true;
  if (e instanceof RunkeepError) return e.retryable || e.status >= 500;
  // A body read that failed mid-stream (socket closed) surfaces as a TypeError from undici.
  return e instanceof TypeError;
}

function connectionRefused(e: unknown): boolean {
  const code = (e as { cause?: { code?: unknown } } | undefined)?.cause?.code;
  return code === "ECONNREFUSED";
}

function describe(e: unknown): string {
  const cause = (e as { cause?: { code?: unknown; message?: unknown } } | undefined)?.cause;
  if (cause && typeof cause.code === "string") return cause.code;
  if (e instanceof Error) return e.message;
  return String(e);
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
