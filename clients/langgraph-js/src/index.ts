/**
 * A LangGraph.js checkpoint saver over runkeep's HTTP API
 * (`@runkeep/client`), with opt-in write ownership: a saver bound to a
 * runkeep lease refuses a superseded owner's writes
 * ({@link StaleWriteOwnerError}), so two workers on one thread can never
 * fork its checkpoint chain.
 *
 * The mapping is the Python saver's (`clients/python-langgraph`), over the
 * server's `thread` routes (`crates/runkeep-server/README.md`, "Threads"):
 *
 * - a LangGraph **thread** is a runkeep **run** of `project`/`session`:
 *   {@link threadRunId} maps the thread id to a run id deterministically;
 * - a **checkpoint** `(checkpoint_ns, checkpoint_id)` is a thread
 *   checkpoint with its parent id, its metadata (JSON, what `filter`
 *   matches, kept exactly as given), the checkpoint without its channel
 *   values (`serde`-typed, base64, beside its `channel_versions` as JSON so
 *   the server rebuilds values), and a blob per channel of `newVersions`;
 * - **pending writes** are keyed by `(taskId, idx)` with LangGraph's
 *   conflict rule, applied by the server; an `__interrupt__` write also
 *   opens a runkeep park on that checkpoint (its request readable in the
 *   console), unless `parks: false`.
 *
 * Checkpoints below v4 get LangGraph's pending-sends migration on read:
 * the parent's `__pregel_tasks` writes become the child's `__pregel_tasks`
 * channel value.
 *
 * @module
 */

import { createHash } from "node:crypto";

import type { RunnableConfig } from "@langchain/core/runnables";
import {
  BaseCheckpointSaver,
  INTERRUPT,
  RESUME,
  TASKS,
  WRITES_IDX_MAP,
  compareWritesSortKeys,
  getCheckpointId,
  maxChannelVersion,
  writesSortKey,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  type PendingWrite,
  type SerializerProtocol,
} from "@langchain/langgraph-checkpoint";
import {
  FencedOut,
  LeaseLost,
  RunkeepError,
  type Json,
  type JsonObject,
  type RunkeepClient,
  type RunRef,
  type ThreadBlobBody,
  type ThreadCheckpointBody,
  type ThreadWriteBody,
} from "@runkeep/client";

const RAW = /^[A-Za-z0-9_-]{1,124}$/;

/**
 * The run id of a LangGraph thread id: `run_<thread>` when the thread id
 * is 1 to 124 characters of `[A-Za-z0-9_-]` not starting with `x_` or
 * `h_`; else `run_x_` and the lowercase hex of its UTF-8 bytes when that
 * fits in 128 characters; else `run_h_` and the hex SHA-256 of them. The
 * Python saver's `thread_run_id`, so both name a thread's run alike.
 */
export function threadRunId(threadId: string | number): string {
  const t = String(threadId);
  if (RAW.test(t) && !t.startsWith("x_") && !t.startsWith("h_")) return `run_${t}`;
  const bytes = Buffer.from(t, "utf8");
  const h = bytes.toString("hex");
  if (h.length <= 122) return `run_x_${h}`;
  return `run_h_${createHash("sha256").update(bytes).digest("hex")}`;
}

/**
 * A write by a superseded owner of the thread, refused: another worker
 * claimed the thread since this saver's lease was taken. Nothing of the
 * write landed. `presented` is the fence the write carried, `current` the
 * run's top holding when the server refused it (`undefined` when the
 * refusal was local: the lease was already known lost).
 */
export class StaleWriteOwnerError extends RunkeepError {
  override name = "StaleWriteOwnerError";
  /** The marker the proposed LangGraph `write_ownership` capability reads (duck-typed). */
  readonly isStaleWriteOwnerError = true;
  readonly threadId: string;
  readonly presented: number;
  readonly current: number | undefined;
  constructor(threadId: string, presented: number, current: number | undefined, cause: RunkeepError) {
    super(
      {
        ...cause.problem,
        type: cause.problem.type || "urn:runkeep:client:stale-write-owner",
        title: cause.problem.title || "Stale write owner",
        status: cause.problem.status || 409,
        detail:
          `thread ${JSON.stringify(threadId)}: this saver's write ownership (fence ${presented}) was superseded` +
          (current !== undefined ? ` by fence ${current}` : "") +
          `; the write was refused and nothing of it landed (${cause.message})`,
      },
      cause.request,
      { cause },
    );
    this.threadId = threadId;
    this.presented = presented;
    this.current = current;
  }
}

/**
 * What a saver writes a thread under: anything that runs a write with the
 * current fence. {@link FixedFence} is one fence, never renewed; a
 * `runWorker` handler's context (`RunContext` of `@runkeep/client`) is the
 * renewing kind (its `fenced` carries the latest fence and refuses once
 * the lease is lost).
 */
export interface WriteLease {
  fenced<T>(write: (fence: number) => Promise<T>): Promise<T>;
}

/** Write ownership at one fence, never renewed (the server judges every write). */
export class FixedFence implements WriteLease {
  constructor(readonly fence: number) {}
  fenced<T>(write: (fence: number) => Promise<T>): Promise<T> {
    return write(this.fence);
  }
}

/** Options of {@link RunkeepSaver}. */
export interface RunkeepSaverOptions {
  /** A client with a worker token (to write) or a reader token (to read only). */
  client: RunkeepClient;
  /** The project threads live in (default `langgraph`). */
  project?: string;
  /** The session threads live in (default `threads`); cross-thread listings cover it. */
  session?: string;
  /** The serializer (default LangGraph's `JsonPlusSerializer`). */
  serde?: SerializerProtocol;
  /** Open a runkeep park for each `__interrupt__` write (default true). */
  parks?: boolean;
}

/** One interrupt of a park's request: LangGraph's interrupt id, its value (as JSON) and the task that raised it. */
export interface ParkedInterrupt {
  id: string | null;
  value: Json;
  taskId: string | null;
}

/**
 * What {@link RunkeepSaver.answeredInterrupt} answers. `resume` is what to
 * resume the graph with (`new Command({ resume })`): with one interrupt,
 * the answer itself; with several, the `{ [interruptId]: value }` map the
 * answer is. `decision` is the park's answer as recorded, `interrupts` the
 * park's interrupts.
 */
export type AnsweredInterrupt =
  | { answered: true; resume: Json; decision: Json; interrupts: ParkedInterrupt[] }
  | { answered: false };

/**
 * The answer of a park with several interrupts is not a map with exactly one
 * value per interrupt id: nothing to resume with. `ids` are the park's
 * interrupt ids, `decision` the answer as recorded.
 */
export class InterruptAnswerError extends Error {
  override name = "InterruptAnswerError";
  constructor(
    readonly threadId: string,
    readonly ids: string[],
    readonly decision: Json,
  ) {
    super(
      `thread ${JSON.stringify(threadId)}: the park holds ${ids.length} interrupts (${ids.join(", ")}); its answer must be ` +
        `an object with one value per interrupt id, e.g. ${JSON.stringify(Object.fromEntries(ids.map((id) => [id, "…"])))}, ` +
        `but it is ${JSON.stringify(decision)}`,
    );
  }
}

/**
 * A thread's run could not be claimed: {@link ThreadHeldError} (another
 * owner holds it live), {@link ThreadFinishedError} (the run is finished)
 * or {@link ThreadNotYetClaimableError} (snoozed or backing off). `outcome`
 * is the claim's answer.
 */
export class ThreadClaimRefused extends RunkeepError {
  override name = "ThreadClaimRefused";
  constructor(
    readonly threadId: string,
    readonly outcome: "held" | "finished" | "notBefore" | "atLimit",
    type: string,
    title: string,
    detail: string,
  ) {
    super({ type, title, status: 409, detail });
  }
}

/** Another owner holds the thread's run live: wait for it to release, or for its lease (`expiresAt`) to lapse. */
export class ThreadHeldError extends ThreadClaimRefused {
  override name = "ThreadHeldError";
  constructor(
    threadId: string,
    readonly holder: string,
    readonly fence: number,
    readonly expiresAt: number,
  ) {
    super(
      threadId,
      "held",
      "urn:runkeep:client:thread-held",
      "Thread held",
      `thread ${JSON.stringify(threadId)} is held live by ${JSON.stringify(holder)} (fence ${fence}, until ${new Date(expiresAt).toISOString()}); ` +
        "its writes are refused to anyone else until it releases or its lease lapses",
    );
  }
}

/** The thread's run is finished (`runStatus`: completed, failed or cancelled): nothing more is written under a claim; an operator's `reopen` makes it claimable again. */
export class ThreadFinishedError extends ThreadClaimRefused {
  override name = "ThreadFinishedError";
  constructor(
    threadId: string,
    readonly runStatus: string,
  ) {
    super(
      threadId,
      "finished",
      "urn:runkeep:client:thread-finished",
      "Thread finished",
      `thread ${JSON.stringify(threadId)}: its run is finished (${runStatus}); an operator reopens it with \`reopen\` (RunkeepClient.reopen(saver.runRef(threadId))) to run it again`,
    );
  }
}

/** The thread's run is not claimable before `availableAt` (snoozed, or backing off after a failed attempt). */
/** The thread's run carries a concurrency key that is at its limit: `held` other runs of `key` are held (limit `limit`); claim again once one of them ends. */
export class ThreadAtLimitError extends ThreadClaimRefused {
  override name = "ThreadAtLimitError";
  constructor(
    threadId: string,
    readonly key: string,
    readonly limit: number,
    readonly held: number,
  ) {
    super(
      threadId,
      "atLimit",
      "urn:runkeep:client:thread-at-limit",
      "Thread's concurrency key at its limit",
      `thread ${JSON.stringify(threadId)} carries concurrency key ${JSON.stringify(key)}, which is at its limit (${held} of ${limit} held)`,
    );
  }
}

export class ThreadNotYetClaimableError extends ThreadClaimRefused {
  override name = "ThreadNotYetClaimableError";
  constructor(
    threadId: string,
    readonly availableAt: number,
  ) {
    super(
      threadId,
      "notBefore",
      "urn:runkeep:client:thread-not-yet-claimable",
      "Thread not yet claimable",
      `thread ${JSON.stringify(threadId)} is not claimable before ${new Date(availableAt).toISOString()}`,
    );
  }
}

function b64(data: Uint8Array): string {
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64");
}

function unb64(data: string | null | undefined): Uint8Array {
  return data == null ? new Uint8Array() : new Uint8Array(Buffer.from(data, "base64"));
}

function jsonable(value: unknown): Json {
  try {
    const text = JSON.stringify(value === undefined ? null : value);
    return text === undefined ? null : (JSON.parse(text) as Json);
  } catch {
    return String(value);
  }
}

/** A version as the server matches it: a string as itself, a number as its JS text (both sides of the match are sent so). */
function versionText(v: unknown): string {
  return typeof v === "string" ? v : String(v);
}

/**
 * A checkpoint saver keeping each thread in a runkeep run.
 *
 * Unbound, the saver writes unfenced (like every other LangGraph saver:
 * two writers on one thread fork it). Bound to a lease ({@link owned},
 * {@link claimWriteOwnership}), every write to that thread carries the
 * lease's fence and a superseded owner's write rejects with
 * {@link StaleWriteOwnerError}. Run graphs under ownership with
 * `durability: "sync"`: the default `"async"` reports a refused write only
 * when the graph exits.
 */
export class RunkeepSaver extends BaseCheckpointSaver {
  readonly client: RunkeepClient;
  readonly project: string;
  readonly session: string;
  readonly parks: boolean;
  private readonly owner: { threadId: string; lease: WriteLease } | undefined;
  /**
   * The interrupt ids of the park each checkpoint carried when `getTuple`
   * last read it, by `thread \u0000 ns \u0000 checkpointId` (the latest
   * {@link PARKS_REMEMBERED}): LangGraph reads the checkpoint, then writes
   * a `Command({ resume })`'s `__resume__`, which answers that park's
   * interrupts. It sends that write and the resumed node's next
   * `__interrupt__` at once, so the server may store the next question
   * first; the resume names what it answers (`resumeOf`) and leaves that
   * question waiting.
   */
  private readonly parksRead = new Map<string, string[]>();

  constructor(options: RunkeepSaverOptions, owner?: { threadId: string; lease: WriteLease }) {
    super(options.serde);
    this.client = options.client;
    this.project = options.project ?? "langgraph";
    this.session = options.session ?? "threads";
    this.parks = options.parks ?? true;
    this.owner = owner;
  }

  // ---- ownership ------------------------------------------------------------

  /** The runkeep run that keeps `threadId`. */
  runRef(threadId: string | number): RunRef {
    return { projectId: this.project, sessionId: this.session, runId: threadRunId(threadId) };
  }

  private options(): RunkeepSaverOptions {
    return { client: this.client, project: this.project, session: this.session, serde: this.serde, parks: this.parks };
  }

  /**
   * This saver bound to `lease` for `threadId`: its writes to that thread
   * carry the lease's fence; writes to any other thread are refused.
   */
  owned(threadId: string | number, lease: WriteLease): RunkeepSaver {
    return new RunkeepSaver(this.options(), { threadId: String(threadId), lease });
  }

  /**
   * Claims the thread's run (a fence above every earlier one; a live
   * owner's holding is not taken before it lapses) and answers a saver
   * that writes under it, at that fixed fence. Rejects with
   * {@link ThreadHeldError} when another owner holds the thread live,
   * {@link ThreadFinishedError} when its run is finished (the graph ended,
   * or an operator finished it) and {@link ThreadNotYetClaimableError}
   * when it is snoozed. End the holding with the client's `release` (the
   * graph stopped at an interrupt) or `finish` (the graph ended), at
   * {@link ownershipFence}.
   */
  async claimWriteOwnership(
    threadId: string | number,
    options: { holder?: string; ttlMs?: number; signal?: AbortSignal } = {},
  ): Promise<RunkeepSaver> {
    const holder = options.holder ?? `langgraph-js-${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
    const answer = await this.client.claim(
      this.runRef(threadId),
      { holder, ttlMs: options.ttlMs ?? 30_000 },
      { signal: options.signal },
    );
    const t = String(threadId);
    switch (answer.outcome) {
      case "acquired":
        return this.owned(threadId, new FixedFence(answer.lease.fence));
      case "held":
        throw new ThreadHeldError(t, answer.lease.holder, answer.lease.fence, answer.lease.expiresAt);
      case "finished":
        throw new ThreadFinishedError(t, answer.status);
      case "notBefore":
        throw new ThreadNotYetClaimableError(t, answer.availableAt);
      case "atLimit":
        throw new ThreadAtLimitError(t, answer.key, answer.limit, answer.held);
    }
  }

  /** The fence this saver writes its thread under when bound to a {@link FixedFence} ({@link claimWriteOwnership}); else `undefined`. */
  get ownershipFence(): number | undefined {
    const lease = this.owner?.lease;
    return lease instanceof FixedFence ? lease.fence : undefined;
  }

  /** Runs `send(fence)` with the fence this saver writes `threadId` under. */
  private async write<T>(threadId: string, send: (fence: number | undefined) => Promise<T>): Promise<T> {
    if (!this.owner) return send(undefined);
    const { threadId: ownedThread, lease } = this.owner;
    if (threadId !== ownedThread) {
      throw new Error(`this saver owns thread ${JSON.stringify(ownedThread)}, not ${JSON.stringify(threadId)}`);
    }
    try {
      return await lease.fenced((fence) => send(fence));
    } catch (e) {
      if (e instanceof FencedOut) throw new StaleWriteOwnerError(ownedThread, e.presented, e.current, e);
      if (e instanceof LeaseLost) throw new StaleWriteOwnerError(ownedThread, e.fence, e.current, e);
      throw e;
    }
  }

  // ---- serialization --------------------------------------------------------

  private async dump(value: unknown): Promise<{ type: string; data: string }> {
    const [type, data] = await this.serde.dumpsTyped(value);
    return { type, data: b64(data) };
  }

  private load(type: string, data: string | null | undefined): Promise<unknown> {
    return this.serde.loadsTyped(type, unb64(data));
  }

  private async tuple(body: ThreadCheckpointBody, threadId?: string): Promise<CheckpointTuple> {
    const thread = threadId ?? body.thread;
    const ns = body.ns;
    const doc = body.checkpoint as { serde?: { type?: string; data?: string | null } };
    if (!doc.serde || typeof doc.serde.type !== "string") {
      throw new Error(`thread ${JSON.stringify(thread)}: checkpoint ${JSON.stringify(body.checkpointId)} was not written by a LangGraph saver`);
    }
    const checkpoint = (await this.load(doc.serde.type, doc.serde.data)) as Checkpoint;
    const values: Record<string, unknown> = {};
    for (const b of body.values) {
      if (b.type !== "empty") values[b.channel] = await this.load(b.type, b.data);
    }
    checkpoint.channel_values = values;
    const writes = [...body.writes].sort((a, b) =>
      compareWritesSortKeys(writesSortKey(a.taskPath, a.taskId, a.idx), writesSortKey(b.taskPath, b.taskId, b.idx)),
    );
    const pendingWrites: CheckpointPendingWrite[] = [];
    for (const w of writes) pendingWrites.push([w.taskId, w.channel, await this.load(w.type, w.data)]);
    const parent = body.parentId ?? undefined;
    if (checkpoint.v < 4 && parent !== undefined) await this.migratePendingSends(checkpoint, thread, ns, parent);
    const t: CheckpointTuple = {
      config: { configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: body.checkpointId } },
      checkpoint,
      metadata: body.metadata as unknown as CheckpointMetadata,
      pendingWrites,
    };
    if (parent !== undefined) t.parentConfig = { configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: parent } };
    return t;
  }

  /**
   * Checkpoints below v4 kept pending sends as `__pregel_tasks` writes on
   * their parent; LangGraph reads them as the child's `__pregel_tasks`
   * channel (as `MemorySaver` and the postgres saver migrate them).
   */
  private async migratePendingSends(checkpoint: Checkpoint, threadId: string, ns: string, parentId: string): Promise<void> {
    const parent = await this.client.getThreadCheckpoint(this.runRef(threadId), { ns, checkpointId: parentId });
    const sends: unknown[] = [];
    const writes = [...(parent?.writes ?? [])].sort((a, b) =>
      compareWritesSortKeys(writesSortKey(a.taskPath, a.taskId, a.idx), writesSortKey(b.taskPath, b.taskId, b.idx)),
    );
    for (const w of writes) if (w.channel === TASKS) sends.push(await this.load(w.type, w.data));
    checkpoint.channel_values ??= {};
    checkpoint.channel_values[TASKS] = sends;
    checkpoint.channel_versions ??= {};
    const versions = Object.values(checkpoint.channel_versions);
    checkpoint.channel_versions[TASKS] = versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
  }

  // ---- the saver --------------------------------------------------------------

  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const c = config.configurable ?? {};
    if (c["thread_id"] === undefined || c["thread_id"] === null) return undefined;
    const threadId = String(c["thread_id"]);
    const checkpointId = getCheckpointId(config) || undefined;
    const query: { ns: string; checkpointId?: string } = { ns: (c["checkpoint_ns"] as string | undefined) ?? "" };
    if (checkpointId !== undefined) query.checkpointId = checkpointId;
    const body = await this.client.getThreadCheckpoint(this.runRef(threadId), query);
    if (body === null) return undefined;
    if (this.parks) this.noteParkRead(threadId, body);
    return this.tuple(body, threadId);
  }

  private noteParkRead(threadId: string, body: ThreadCheckpointBody): void {
    const key = [threadId, body.ns, body.checkpointId].join("\u0000");
    const request = body.park?.pending?.request as { type?: unknown; interrupts?: unknown } | undefined;
    const entries = request?.type === "langgraph-interrupt" && Array.isArray(request.interrupts) ? request.interrupts : [];
    const ids = entries.flatMap((i: { id?: unknown }) => (typeof i?.id === "string" ? [i.id] : []));
    this.parksRead.delete(key);
    this.parksRead.set(key, ids);
    while (this.parksRead.size > PARKS_REMEMBERED) this.parksRead.delete(this.parksRead.keys().next().value as string);
  }

  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const c = config?.configurable ?? {};
    const { limit, filter } = options;
    if (limit !== undefined && limit <= 0) return;
    const before = options.before ? getCheckpointId(options.before) || undefined : undefined;
    const ns = c["checkpoint_ns"] as string | undefined;
    const common = {
      ...(ns !== undefined ? { ns } : {}),
      ...(before !== undefined ? { before } : {}),
      ...(limit !== undefined ? { limit } : {}),
      ...(filter !== undefined ? { filter: jsonable(filter) as JsonObject } : {}),
    };
    if (c["thread_id"] === undefined || c["thread_id"] === null) {
      const bodies = await this.client.listThreadsCheckpoints({ project: this.project, session: this.session, ...common });
      for (const b of bodies) yield await this.tuple(b);
      return;
    }
    const threadId = String(c["thread_id"]);
    const checkpointId = c["checkpoint_id"] as string | undefined;
    const bodies = await this.client.listThreadCheckpoints(this.runRef(threadId), {
      ...common,
      ...(checkpointId ? { checkpointId } : {}),
    });
    for (const b of bodies) yield await this.tuple(b, threadId);
  }

  async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const c = config.configurable;
    if (c === undefined) throw new Error("put: config.configurable is missing");
    if (c["thread_id"] === undefined || c["thread_id"] === null) throw new Error("put: config.configurable.thread_id is missing");
    const threadId = String(c["thread_id"]);
    const ns = (c["checkpoint_ns"] as string | undefined) ?? "";
    const parent = c["checkpoint_id"] as string | undefined;
    const { channel_values: values = {}, ...rest } = checkpoint;
    const blobs: ThreadBlobBody[] = [];
    for (const [channel, version] of Object.entries(newVersions)) {
      const blob =
        channel in values ? await this.dump(values[channel]) : { type: "empty", data: null };
      blobs.push({ channel, version: versionText(version), ...blob });
    }
    const channelVersions: JsonObject = {};
    for (const [k, v] of Object.entries(checkpoint.channel_versions ?? {})) channelVersions[k] = versionText(v);
    const body = {
      thread: threadId,
      ns,
      checkpointId: checkpoint.id,
      ...(parent ? { parentId: parent } : {}),
      checkpoint: { channel_versions: channelVersions, serde: await this.dump(rest) },
      metadata: jsonable(metadata ?? {}) as JsonObject,
      blobs,
    };
    await this.write(threadId, (fence) => this.client.putThreadCheckpoint(this.runRef(threadId), body, { fence }));
    return { configurable: { thread_id: threadId, checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
  }

  async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath = ""): Promise<void> {
    const c = config.configurable ?? {};
    if (c["thread_id"] === undefined || c["thread_id"] === null) throw new Error("putWrites: config.configurable.thread_id is missing");
    const checkpointId = c["checkpoint_id"] as string | undefined;
    if (!checkpointId) throw new Error("putWrites: config.configurable.checkpoint_id is missing");
    const threadId = String(c["thread_id"]);
    const ns = (c["checkpoint_ns"] as string | undefined) ?? "";
    const items: ThreadWriteBody[] = [];
    let park: { request: { type: string } & JsonObject } | undefined;
    let resume: { value: Json } | undefined;
    for (const [idx, [channel, value]] of writes.entries()) {
      items.push({ idx: WRITES_IDX_MAP[channel] ?? idx, channel, ...(await this.dump(value)) });
      if (channel === INTERRUPT && this.parks) {
        park = { request: parkRequest(threadId, ns, checkpointId, taskId, value) };
      }
      if (channel === RESUME && this.parks) resume = commandResume(taskId, value);
    }
    // A Command's resume answers the interrupts of the park LangGraph read.
    const resumeOf = resume ? this.parksRead.get([threadId, ns, checkpointId].join("\u0000")) : undefined;
    const body = {
      thread: threadId,
      ns,
      checkpointId,
      taskId,
      taskPath,
      writes: items,
      ...(park ? { park } : {}),
      ...(resume ? { resume: resume.value } : {}),
      ...(resumeOf ? { resumeOf } : {}),
    };
    await this.write(threadId, (fence) => this.client.putThreadWrites(this.runRef(threadId), body, { fence }));
  }

  /**
   * `{ answered: true, resume, decision, interrupts }` when the thread's
   * latest root checkpoint carries a park (from `interrupt()`s) that was
   * answered (in the console, or `resolvePark`) and the graph has not
   * resumed from it yet; else `{ answered: false }`. Resume with
   * `graph.invoke(new Command({ resume }), config)`: with one interrupt
   * `resume` is the answer; with several (parallel nodes interrupting in
   * one step: one park holds them all) the answer must be an object with
   * one value per interrupt id, `{ [id]: value }`, and `resume` is that map
   * (any other answer rejects with {@link InterruptAnswerError}, naming
   * the ids).
   */
  async answeredInterrupt(threadId: string | number): Promise<AnsweredInterrupt> {
    const body = await this.client.getThreadCheckpoint(this.runRef(threadId), { ns: "" });
    const pending = body?.park?.pending;
    if (!body || !pending || pending.resolvedAt === undefined || pending.decision === undefined) return { answered: false };
    if (body.writes.some((w) => w.channel === RESUME)) return { answered: false };
    const decision = pending.decision;
    const raw = (pending.request as { interrupts?: unknown } | undefined)?.interrupts;
    const interrupts: ParkedInterrupt[] = (Array.isArray(raw) ? raw : []).map((i: { id?: unknown; value?: unknown; taskId?: unknown }) => ({
      id: typeof i?.id === "string" ? i.id : null,
      value: (i?.value ?? null) as Json,
      taskId: typeof i?.taskId === "string" ? i.taskId : null,
    }));
    if (interrupts.length <= 1) return { answered: true, resume: decision, decision, interrupts };
    const ids = interrupts.map((i) => i.id);
    const known = ids.filter((id): id is string => id !== null);
    const map = decision !== null && typeof decision === "object" && !Array.isArray(decision) ? (decision as JsonObject) : undefined;
    const keys = map ? Object.keys(map) : [];
    if (!map || known.length !== ids.length || keys.length !== known.length || !known.every((id) => Object.hasOwn(map, id))) {
      throw new InterruptAnswerError(String(threadId), known, decision);
    }
    return { answered: true, resume: Object.fromEntries(known.map((id) => [id, map[id] as Json])), decision, interrupts };
  }

  async deleteThread(threadId: string): Promise<void> {
    const t = String(threadId);
    await this.write(t, (fence) => this.client.deleteThread(this.runRef(t), { fence }));
  }

  /**
   * The next version of a channel: one more than the integer part of
   * `current`, plus a random fraction below 1. Blobs are keyed by
   * `(ns, channel, version)`, so two branches of a forked thread (time
   * travel, `updateState` on an old checkpoint) never share a version of a
   * channel, and one branch's value never stands in for the other's (the
   * Python saver's `"<counter>.<random>"` strings, as numbers: LangGraph.js
   * types versions as numbers, and compares them as numbers).
   */
  override getNextVersion(current: number | undefined): number {
    const n = typeof current === "number" && Number.isFinite(current) ? Math.floor(current) : 0;
    return n + 1 + Math.floor(Math.random() * 1e9) / 1e10;
  }
}

/** How many checkpoints' parks a saver remembers from its reads (`RunkeepSaver.parksRead`). */
const PARKS_REMEMBERED = 1024;
/** LangGraph.js's null task: the writes of a `Command` (its `resume` among them). */
const NULL_TASK_ID = "00000000-0000-0000-0000-000000000000";
/** An interrupt id (xxh3, 32 hex digits): LangGraph.js writes a resume map as one batch per interrupt, under that id. */
const INTERRUPT_ID = /^[0-9a-f]{32}$/;

/**
 * The resume a `Command({ resume })` writes, to close the park with: the
 * null task's `__resume__` value (one answer, or LangGraph's map), or, for
 * the batch LangGraph.js writes per interrupt of a resume map (task id =
 * the interrupt id, value = the list of that interrupt's answers), that
 * answer as `{ [interruptId]: value }`. A task's own `__resume__` write
 * (the answers it consumed) is not a Command's, so it closes nothing.
 */
function commandResume(taskId: string, value: unknown): { value: Json } | undefined {
  if (taskId === NULL_TASK_ID) return { value: jsonable(value) };
  if (INTERRUPT_ID.test(taskId)) {
    const answers = Array.isArray(value) ? value : [value];
    return { value: { [taskId]: jsonable(answers[answers.length - 1]) } };
  }
  return undefined;
}

/** The park request of an `__interrupt__` write (the Python saver's shape): each interrupt with its id, value and task. */
function parkRequest(
  threadId: string,
  ns: string,
  checkpointId: string,
  taskId: string,
  value: unknown,
): { type: string } & JsonObject {
  const interrupts = Array.isArray(value) ? value : [value];
  return {
    type: "langgraph-interrupt",
    thread: threadId,
    ns,
    checkpointId,
    taskId,
    interrupts: interrupts.map((i) => {
      const o = i !== null && typeof i === "object" ? (i as { id?: unknown; value?: unknown }) : undefined;
      return {
        id: typeof o?.id === "string" ? o.id : null,
        value: jsonable(o && "value" in o ? o.value : i),
        taskId,
      };
    }),
  };
}
