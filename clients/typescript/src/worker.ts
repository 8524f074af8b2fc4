/**
 * The worker helper: {@link runWorker} drains runs through `claim_next`,
 * keeps each lease while its handler works, and stops the handler the
 * moment the lease is lost.
 *
 * For each run it takes:
 *
 * 1. **Claim** with `claim_next` and a long-poll (`waitMs`), so an idle
 *    worker waits at the server instead of polling.
 * 2. **Keep** the lease: renew (a claim by the same holder, which mints a
 *    new, higher fence) every third of the TTL, measured from when the
 *    previous claim was *sent*. Renewals and writes exclude each other, so
 *    no write presents a fence a renewal is retiring.
 * 3. **Stop the work the moment the lease is lost**: `ctx.signal` aborts
 *    with a {@link LeaseLost} when a renewal answers that another holder has
 *    the run, when a renewal answers a fence other than the next one (a
 *    gap: someone released the holding in between, so the answer is a new
 *    claim, which the worker gives back at once), when any write is refused
 *    as fenced out, when renewals keep failing into the safety margin (a
 *    tenth of the TTL before the local deadline), or when nothing renewed
 *    the lease by then (a stalled event loop). An operator's cancel aborts
 *    it with a {@link Cancelled} instead (a renewal answers the run
 *    finished as cancelled, or a write is refused as `cancelled`), and the
 *    worker reports nothing more for that run. From then on every
 *    `ctx.step()` is refused locally, before it is sent.
 * 4. **Write through the atomic step**: `ctx.step(step)` commits events,
 *    checkpoint, messages, record and optionally the finish as one
 *    `POST …/steps`, always with the current fence.
 * 5. **End the holding** by what the handler returned: finish (default
 *    `completed`, with the returned value as result), release, or snooze.
 *    A handler that throws (or rejects), or runs past its attempt timeout
 *    (`attemptTimeoutMs`, or the run's own from its lease, the shorter;
 *    its signal then aborts with an {@link AttemptTimedOut}), has its
 *    attempt reported failed (`failAttempt`, kind the error's `name` or
 *    `timeout`, message its text, cut to 4 096 characters): the store keeps
 *    the error, counts the attempt, and defers the run by the run's own
 *    retry backoff, or dead-letters it at its attempt limit (`maxAttempts`)
 *    — the worker keeps no backoff of its own. `onError: "fail"` finishes
 *    a run whose handler threw as failed at once instead.
 * 6. **Hand over** (on by default, `handover`): a drained run's finishing
 *    commit — a `ctx.step` with `finish`, or the worker's own finish when
 *    the handler returns — is sent with the drain's next claim in one
 *    request (`commitStepAndClaimNext`, the same holder, TTL, filter and
 *    attempt limit as its `claimNext`), while the worker runs and is not
 *    stopping. The run it takes is kept (renewed) at once and worked next
 *    in the same slot once the finished run's handler has returned, so no
 *    more than `concurrency` runs are held or worked at any instant; a busy
 *    drain calls `claimNext` only when a hand-over took nothing. A claim
 *    that failed after the step committed (`nextError`): the step stands,
 *    the error is counted (`claimErrors`) and the slot claims by itself. A
 *    lost answer is the step's lost answer, as without the hand-over (the
 *    error reaches the handler's `ctx.step`, or is reported as the
 *    worker's finish failing); a run claimed in that lost answer is known
 *    to nobody and waits out its lease, then any worker takes it. A run
 *    handed over as the worker stops is released without being worked.
 * 7. **Group commit** (`commitBatch` > 1, off by default): the worker's own
 *    finish of a handler that returned its result waits, up to
 *    `commitLingerMs`, for the finishes of other slots, and the group goes
 *    as one `commitSteps` request. The wait is outside the run's gate (its
 *    keeper goes on renewing); at send time each run enters its gate, so
 *    its current fence is sent and no renewal retires it before the answer.
 *    Each run ends by its own outcome, as its single finish would: a
 *    refused run (fenced out, cancelled) alone, the others finished; a
 *    request failed or lost as a whole is every run's failed finish. Such a
 *    finish does not hand over. A stopping worker sends what waits at once.
 *
 * Lease expiry is judged by the store's clock (claims carry no instant);
 * the worker's own deadline runs on the monotonic clock from the moment the
 * claim was sent, so it is never later than the store's.
 *
 * This is the worker protocol every runkeep runtime follows (Rust,
 * TypeScript, Python), written down once in the repository's
 * `docs/design/worker-protocol.md`.
 *
 * @module
 */

import type { HandOver, RunkeepClient } from "./client.js";
import { Doubling } from "./backoff.js";
import { attemptError, refOf, sleep } from "./client.js";
import { Cancelled, FencedOut, RunkeepError, TYPE_PREFIX } from "./errors.js";
import type {
  AttemptErrorBody,
  CheckpointBody,
  Claimed,
  ClaimNextBody,
  Json,
  LeaseBody,
  NextClaimBody,
  OutcomeBody,
  Order,
  ParkState,
  ProblemBody,
  RunAddress,
  RunRef,
  StepBody,
  StepReceiptBody,
} from "./types.js";

/** Why a lease was lost. */
export type LeaseLossKind =
  /** A renewal found another holder on the run. */
  | "superseded"
  /** A write was refused: the fence no longer holds the run. */
  | "fenced-out"
  /** No renewal landed before the safety margin of the local deadline. */
  | "expiring"
  /**
   * A renewal answered a fence other than the next one: the holding was
   * ended in between (an operator's release, a takeover released again)
   * and the answer was a new claim, which the worker gave back. `current`
   * is the fence it answered.
   */
  | "gap"
  /** A renewal was refused for good (run finished or deferred meanwhile, a refusal). */
  | "renewal-failed";

/**
 * The reason `ctx.signal` aborts with when the lease is lost, and the error
 * every later `ctx.step()` rejects with.
 */
export class LeaseLost extends RunkeepError {
  override name = "LeaseLost";
  readonly kind: LeaseLossKind;
  /** The fence this worker held. */
  readonly fence: number;
  /** The run's current fence, when known (superseded, fenced-out). */
  readonly current: number | undefined;
  constructor(kind: LeaseLossKind, fence: number, detail: string, current?: number, cause?: unknown) {
    super(
      { type: `urn:runkeep:client:lease-lost`, title: "Lease lost", status: 0, detail },
      undefined,
      cause === undefined ? undefined : { cause },
    );
    this.kind = kind;
    this.fence = fence;
    this.current = current;
  }
}

/**
 * The reason `ctx.signal` aborts with when the handler ran past
 * {@link WorkerOptions.attemptTimeoutMs}, and the error every later
 * `ctx.step()` rejects with. The worker reports the attempt failed with
 * kind `timeout`.
 */
export class AttemptTimedOut extends RunkeepError {
  override name = "AttemptTimedOut";
  /** The attempt timeout, ms. */
  readonly timeoutMs: number;
  constructor(timeoutMs: number) {
    super({
      type: "urn:runkeep:client:attempt-timeout",
      title: "Attempt timed out",
      status: 0,
      detail: `the handler ran past the attempt timeout of ${timeoutMs} ms`,
    });
    this.timeoutMs = timeoutMs;
  }
}

/** What a handler returns: how the holding ends. */
export type WorkResult =
  /** Finish as `completed` with no result. */
  | void
  | undefined
  /** Finish with this outcome. */
  | { finish: OutcomeBody }
  /** More work remains: release the run; it is runnable again at once. */
  | { release: true }
  /** More work remains, not before this many ms: snooze it. */
  | { retryAfterMs: number };

/** What a handler is given for one run. */
export interface RunContext {
  /** The run. */
  readonly run: RunAddress;
  /** Its address for the client's methods. */
  readonly ref: RunRef;
  /** The lease as last taken or renewed. */
  readonly lease: LeaseBody;
  /** The current fence (it changes with every renewal). */
  readonly fence: number;
  /**
   * Aborts the moment the lease is lost (reason: a {@link LeaseLost}), the
   * run is cancelled by an operator (a {@link Cancelled}), the handler runs
   * past the attempt timeout (an {@link AttemptTimedOut}) or the worker is
   * stopped (the worker signal's reason). Pass it to everything the
   * handler awaits.
   */
  readonly signal: AbortSignal;
  /** The client (for reads; make writes through {@link step}). */
  readonly client: RunkeepClient;
  /** The checkpoint to resume from (`null`: a fresh run with no checkpoint). */
  resumePoint(): Promise<CheckpointBody | null>;
  /**
   * Commits one step atomically under the current fence. Refused locally
   * with {@link LeaseLost} once the lease is lost (with the
   * {@link Cancelled} once the run is cancelled, the {@link AttemptTimedOut}
   * once the attempt timed out); a `FencedOut` or `Cancelled` answer aborts
   * {@link signal} and rejects with it. A step with `finish` ends the
   * holding: the worker then does not finish the run again. In a drain
   * with hand-overs on, that step also claims the drain's next run
   * ({@link WorkerOptions.handover}); what it answers is the step's
   * receipt either way.
   */
  step(step: StepBody): Promise<StepReceiptBody>;
  /**
   * Any other fenced write (`writeReport`, `appendAudit`, …) under the
   * current fence, with the same guarantees as {@link step}: excluded from
   * renewals, refused locally once the lease is lost, a `FencedOut` answer
   * aborts {@link signal}. `write` gets the fence to present.
   */
  fenced<T>(write: (fence: number, signal: AbortSignal) => Promise<T>): Promise<T>;
  /** Throws the {@link LeaseLost} (or {@link Cancelled}, {@link AttemptTimedOut}) if the holding may no longer write. */
  ensureHeld(): void;
}

/** What happened to one run, for {@link WorkerOptions.onEvent}. */
export type WorkerEvent =
  /** `handedOver`: taken by a finishing commit's hand-over, not by `claimNext`. */
  | { type: "claimed"; run: RunAddress; fence: number; handedOver: boolean }
  | { type: "renewed"; run: RunAddress; from: number; to: number }
  | { type: "lost"; run: RunAddress; loss: LeaseLost }
  /** An operator cancelled the run while this worker held it. */
  | { type: "cancelled"; run: RunAddress; cancelled: Cancelled }
  | { type: "finished"; run: RunAddress; outcome: OutcomeBody }
  | { type: "released"; run: RunAddress; done: boolean }
  | { type: "snoozed"; run: RunAddress; until: number }
  /**
   * The handler threw (`error`: what it threw) or timed out (`error`: the
   * {@link AttemptTimedOut}); `kind` is the error's kind (its `name`, or
   * `timeout`), `deadLettered` whether the failed attempt's report
   * dead-lettered the run.
   */
  | { type: "failed"; run: RunAddress; error: unknown; kind: string; deadLettered: boolean }
  | { type: "error"; error: unknown };

/** How {@link runWorker} works. */
export interface WorkerOptions {
  client: RunkeepClient;
  /** Unique per process (it is what tells a renewal from a theft). Default: a random one. */
  holder?: string;
  /** Lease length, ms. */
  ttlMs: number;
  /** Only runs of this project / session, with this park state, in this order. */
  filter?: { project?: string; session?: string; park?: ParkState[]; order?: Order };
  /** Attempt limit passed with each claim (the store dead-letters past it). */
  maxAttempts?: number;
  /** Long-poll of each `claim_next`, ms (at most 30 000). Default 20 000. */
  waitMs?: number;
  /** Runs worked on at once. Default 1. */
  concurrency?: number;
  /**
   * Claim up to this many runs in one request (`claimNextBatch`, 1 to 256):
   * the slots that look for work at the same moment share one call, each
   * taking one of its runs (no run waits claimed in a local queue, so no
   * lease runs down unworked). Default 1: one `claimNext` a slot.
   */
  claimBatch?: number;
  /**
   * Group commit (1 to 256): the worker's own finishes (a handler that
   * returned its result) of up to this many runs go out as one
   * `commitSteps` request, each under its run's current fence, one outcome
   * per run (a refused run alone; a request failed as a whole fails each
   * run's finish, as a single finish's failure). A slot waits for its
   * run's finish, so a group holds at most `concurrency` runs, and is sent
   * as soon as it holds `min(commitBatch, concurrency)`; a group of one
   * goes as a single step. Such a finish does not hand over (a `ctx.step`
   * carrying `finish` still goes alone, and hands over as before); the
   * slot then claims as usual. Everything else (steps, failed attempts,
   * `onError: "fail"`'s finish, release, snooze) goes alone. Default 1:
   * every finish alone, exactly as without the option.
   */
  commitBatch?: number;
  /**
   * How long the first finish waiting in a group waits for others before
   * the group is sent anyway, ms (0 or more; 0 still lets the finishes of
   * the same turn join). Default 2. A stopping worker sends what waits at
   * once.
   */
  commitLingerMs?: number;
  /** `"continuous"` (default): wait for work until stopped; `"until-idle"`: stop when no run is runnable. */
  mode?: "continuous" | "until-idle";
  /** Stops the worker: no more claims; running handlers see `ctx.signal` abort, their runs are released. */
  signal?: AbortSignal;
  /**
   * A handler that throws: `"retry"` (default) reports a failed attempt
   * (`failAttempt`: the store retries the run after its backoff, or
   * dead-letters it at its attempt limit); `"fail"` finishes the run as
   * failed at once, the error as its reason.
   */
  onError?: "retry" | "fail";
  /**
   * Longest a handler may run on one attempt, ms. Past it the handler's
   * signal aborts (an {@link AttemptTimedOut}), its later writes are
   * refused locally, and the attempt is reported failed with kind
   * `timeout` without waiting for the handler to return. A run may set
   * its own (`attemptTimeoutMs` on enqueue, carried by its lease); with
   * both, the shorter holds. Default: the run's own, if any.
   */
  attemptTimeoutMs?: number;
  /** Renew every `renewFraction × ttlMs`. Default 1/3. */
  renewFraction?: number;
  /** Give the lease up `safetyFraction × ttlMs` before its local deadline. Default 0.1. */
  safetyFraction?: number;
  /**
   * Hand over (default true): while the worker runs and is not stopping, a
   * run's finishing commit also claims the next run, in one request
   * (`commitStepAndClaimNext` with this worker's holder, TTL, filter and
   * attempt limit), and the slot works that run next. `false`: every run is
   * finished alone and every next run claimed with `claimNext`. With
   * {@link commitBatch} > 1 the worker's own finish joins its group
   * instead; only a `ctx.step` carrying `finish` still hands over.
   */
  handover?: boolean;
  /** Observes what the worker does. */
  onEvent?: (event: WorkerEvent) => void;
  /** The work. */
  handler: (ctx: RunContext) => Promise<WorkResult> | WorkResult;
}

/** What {@link runWorker} did. */
export interface WorkerReport {
  claimed: number;
  finished: number;
  released: number;
  snoozed: number;
  /**
   * Handlers that threw or timed out: each attempt was reported failed
   * (or, with `onError: "fail"`, the run finished as failed).
   */
  failed: number;
  /** Of `failed`, the handlers stopped by the attempt timeout. */
  timedOut: number;
  /** Failed attempts that reached their run's limit: the store dead-lettered the run. */
  deadLettered: number;
  /** Runs an operator cancelled while they were worked (the handler's signal aborted; nothing more was reported). */
  cancelled: number;
  /** Leases lost while working (cancels not included). */
  lost: number;
  /** Runs taken by a hand-over (a finishing commit claimed them); counted in `claimed` too. */
  handedOver: number;
  /**
   * `claimNext` calls that failed and were retried, and hand-overs whose
   * claim failed after their step committed (the step stands).
   */
  claimErrors: number;
}

/**
 * Runs a worker until `options.signal` aborts (or, in `"until-idle"` mode,
 * until no run is runnable). Rejects on a refusal that retrying cannot fix
 * (a token without the worker role, a bad filter), after stopping its runs.
 */
export async function runWorker(options: WorkerOptions): Promise<WorkerReport> {
  const ttl = options.ttlMs;
  if (!Number.isInteger(ttl) || ttl <= 0) throw new TypeError(`ttlMs ${ttl} must be a positive whole number of ms`);
  const renewFraction = options.renewFraction ?? 1 / 3;
  const safetyFraction = options.safetyFraction ?? 0.1;
  if (!(renewFraction > 0 && renewFraction < 1)) throw new TypeError(`renewFraction ${renewFraction} must lie in (0, 1)`);
  if (!(safetyFraction >= 0 && safetyFraction < 1) || renewFraction + safetyFraction >= 1) {
    throw new TypeError(`safetyFraction ${safetyFraction} must lie in [0, 1) with renewFraction + safetyFraction < 1`);
  }
  const timeoutMs = options.attemptTimeoutMs;
  if (timeoutMs !== undefined && !(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
    throw new TypeError(`attemptTimeoutMs ${timeoutMs} must be a positive number of ms (leave it out for no limit)`);
  }
  const waitMs = options.waitMs ?? 20_000;
  const concurrency = options.concurrency ?? 1;
  if (!Number.isInteger(concurrency) || concurrency < 1) throw new TypeError(`concurrency ${concurrency} must be at least 1`);
  const claimBatch = options.claimBatch ?? 1;
  if (!Number.isInteger(claimBatch) || claimBatch < 1 || claimBatch > 256) {
    throw new TypeError(`claimBatch ${claimBatch} must be a whole number from 1 to 256`);
  }
  const commitBatch = options.commitBatch ?? 1;
  if (!Number.isInteger(commitBatch) || commitBatch < 1 || commitBatch > 256) {
    throw new TypeError(`commitBatch ${commitBatch} must be a whole number from 1 to 256 (1: every finish alone)`);
  }
  const commitLingerMs = options.commitLingerMs ?? 2;
  if (!(Number.isFinite(commitLingerMs) && commitLingerMs >= 0)) {
    throw new TypeError(`commitLingerMs ${commitLingerMs} must be a finite number of ms, 0 or more`);
  }
  const holder = options.holder ?? `ts-${randomId()}`;
  const report: WorkerReport = {
    claimed: 0,
    finished: 0,
    released: 0,
    snoozed: 0,
    failed: 0,
    timedOut: 0,
    deadLettered: 0,
    cancelled: 0,
    lost: 0,
    handedOver: 0,
    claimErrors: 0,
  };
  const stop = new AbortController();
  const onStop = () => stop.abort(options.signal?.reason);
  if (options.signal?.aborted) return report;
  options.signal?.addEventListener("abort", onStop, { once: true });
  // The drain's claim: its claimNext's (with the long-poll added) and its hand-overs'.
  const claim: NextClaimBody = {
    holder,
    ttlMs: ttl,
    ...(options.maxAttempts !== undefined ? { maxAttempts: options.maxAttempts } : {}),
    ...options.filter,
  };
  const drain: Drain = {
    options,
    report,
    renewFraction,
    safetyFraction,
    stop: stop.signal,
    handover: options.handover === false ? undefined : claim,
    group:
      commitBatch > 1
        ? new GroupCommitter(options.client, Math.min(commitBatch, concurrency), commitLingerMs, stop.signal)
        : undefined,
    emit: (e: WorkerEvent) => {
      try {
        options.onEvent?.(e);
      } catch {
        // An observer's failure is not the worker's.
      }
    },
  };
  let fatal: unknown;

  const claimBody = { ...claim, waitMs: options.mode === "until-idle" ? 0 : waitMs };
  const batcher = claimBatch > 1 ? new BatchClaimer(options.client, claimBody, claimBatch, stop.signal) : undefined;

  const slot = async () => {
    const backoff = new Doubling(100, 5000);
    /** The run the previous run's finishing commit handed over: this slot works it next. */
    let handed: HeldRun | undefined;
    while (!stop.signal.aborted) {
      let held = handed;
      handed = undefined;
      if (!held) {
        let claimed;
        let sentAt = 0;
        try {
          sentAt = performance.now();
          claimed = batcher
            ? await batcher.next()
            : (await options.client.claimNext(claimBody, { signal: stop.signal })).claimed;
          backoff.reset();
        } catch (e) {
          if (stop.signal.aborted) return;
          if (e instanceof RunkeepError && e.retryable) {
            report.claimErrors += 1;
            drain.emit({ type: "error", error: e });
            await sleep(Math.max(backoff.next(), retryAfter(e)), stop.signal).catch(() => undefined);
            continue;
          }
          fatal = e;
          stop.abort(e);
          return;
        }
        if (!claimed) {
          // Until idle: this slot stops; the others stop when they find nothing either.
          if (options.mode === "until-idle") return;
          continue;
        }
        held = HeldRun.take(drain, claimed, sentAt, false);
      }
      handed = await held.work();
    }
    // The worker stopped as a run was handed over to this slot: give it back unworked.
    await handed?.giveBack();
  };

  try {
    await Promise.all(Array.from({ length: concurrency }, slot));
  } finally {
    options.signal?.removeEventListener("abort", onStop);
  }
  if (fatal !== undefined) throw fatal;
  return report;
}

/**
 * The slots' claims coalesced into batches: every slot asking while no
 * batch call is in flight joins the next one, which asks for as many runs
 * as slots are waiting (up to the batch), and each slot gets one run or
 * `null`.
 */
class BatchClaimer {
  private readonly waiting: Array<{ resolve: (c: Claimed | null) => void; reject: (e: unknown) => void }> = [];
  private running = false;

  constructor(
    private readonly client: RunkeepClient,
    private readonly body: ClaimNextBody,
    private readonly max: number,
    private readonly signal: AbortSignal,
  ) {}

  next(): Promise<Claimed | null> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      if (!this.running) void this.rounds();
    });
  }

  private async rounds(): Promise<void> {
    this.running = true;
    try {
      while (this.waiting.length > 0) {
        // Slots freed in the same turn join this round.
        await new Promise<void>((r) => setImmediate(r));
        const askers = this.waiting.splice(0, this.max);
        try {
          const got = await this.client.claimNextBatch(askers.length, this.body, { signal: this.signal });
          askers.forEach((a, i) => a.resolve(got[i] ?? null));
        } catch (e) {
          for (const a of askers) a.reject(e);
        }
      }
    } finally {
      this.running = false;
    }
  }
}

/**
 * One run's step waiting in a {@link GroupCommitter}. `enter` runs `write`
 * inside the run's gate (shared with its other writes, exclusive of its
 * renewals) with the run's current fence, as the run's own writes are
 * run, or rejects without running it when the run may no longer write.
 */
interface GroupEntry {
  readonly ref: RunRef;
  readonly step: StepBody;
  readonly enter: (write: (fence: number) => Promise<StepReceiptBody>) => Promise<StepReceiptBody>;
  readonly resolve: (receipt: StepReceiptBody) => void;
  readonly reject: (e: unknown) => void;
}

/**
 * The worker's own finishes grouped into `commitSteps` requests. A finish
 * waits (outside its run's gate, so its keeper goes on renewing) until the
 * group is full, the first waiting finish has lingered `lingerMs`, or the
 * worker stops. Then every run of the group enters its gate: its fence is
 * read there, and no renewal can swap it until the group's answer is in.
 * A run that may no longer write (lost while it waited) drops out alone.
 * Each run gets its own outcome: a receipt, its own refusal (`FencedOut`,
 * `Cancelled`: the others stand), or, when the request as a whole failed,
 * that failure, as its own finish would have.
 */
class GroupCommitter {
  private waiting: GroupEntry[] = [];
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly client: RunkeepClient,
    private readonly max: number,
    private readonly lingerMs: number,
    private readonly stop: AbortSignal,
  ) {
    // A stopping worker sends what waits at once: nothing waits out the linger, nothing is dropped.
    stop.addEventListener("abort", () => this.flush(), { once: true });
  }

  /** Commits `step` in the next group; answers as {@link RunkeepClient.commitStep} would. */
  commit(ref: RunRef, step: StepBody, enter: GroupEntry["enter"]): Promise<StepReceiptBody> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ ref, step, enter, resolve, reject });
      if (this.waiting.length >= this.max || this.stop.aborted) this.flush();
      else this.timer ??= setTimeout(() => this.flush(), this.lingerMs);
    });
  }

  private flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    // Runs of one tenant share a request (a worker's runs all are: its client's).
    const byTenant = new Map<string | undefined, GroupEntry[]>();
    for (const entry of this.waiting.splice(0)) {
      const key = entry.ref.tenantId;
      byTenant.set(key, [...(byTenant.get(key) ?? []), entry]);
    }
    for (const group of byTenant.values()) void this.send(group);
  }

  private async send(group: GroupEntry[]): Promise<void> {
    // Each run's fence, read inside its gate; the gate stays held until its outcome is in.
    const outcomes = group.map(() => deferred<StepReceiptBody>());
    const fences = await Promise.all(
      group.map(
        (entry, i) =>
          new Promise<number | undefined>((entered) => {
            entry
              .enter((fence) => {
                entered(fence);
                return outcomes[i]!.promise;
              })
              .then(entry.resolve, entry.reject)
              // Refused before it entered (lost while it waited): it drops out.
              .finally(() => entered(undefined));
          }),
      ),
    );
    const going = group.flatMap((entry, i) => (fences[i] === undefined ? [] : [{ i, entry, fence: fences[i]! }]));
    if (going.length === 0) return;
    try {
      if (going.length === 1) {
        // A group of one is a single step.
        const [{ i, entry, fence }] = going as [(typeof going)[0]];
        outcomes[i]!.resolve(await this.client.commitStep(entry.ref, fence, entry.step));
        return;
      }
      const answers = await this.client.commitSteps(going.map(({ entry, fence }) => ({ run: entry.ref, fence, step: entry.step })));
      if (answers.length !== going.length) {
        throw new Error(`the group commit of ${going.length} steps was answered with ${answers.length} outcomes; each step's outcome is unknown`);
      }
      going.forEach(({ i }, k) => {
        const answer = answers[k]!;
        if (answer.error) outcomes[i]!.reject(answer.error);
        else outcomes[i]!.resolve(answer.receipt);
      });
    } catch (e) {
      // The request failed as a whole (refused, unreachable, a lost answer): every run's finish failed with it.
      for (const { i } of going) outcomes[i]!.reject(e);
    }
  }
}

function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  // A run that dropped out never reads its outcome.
  promise.catch(() => undefined);
  return { promise, resolve, reject };
}

/** What every run of one {@link runWorker} shares. */
interface Drain {
  readonly options: WorkerOptions;
  readonly report: WorkerReport;
  readonly renewFraction: number;
  readonly safetyFraction: number;
  /** Aborts when the worker stops (its signal, or a claim error retrying cannot fix). */
  readonly stop: AbortSignal;
  /** The claim a finishing commit hands over with; `undefined`: hand-overs are off. */
  readonly handover: NextClaimBody | undefined;
  /** Where the worker's own finishes are grouped; `undefined`: each goes alone (`commitBatch` 1). */
  readonly group: GroupCommitter | undefined;
  readonly emit: (e: WorkerEvent) => void;
}

/** One run while this worker holds it. */
class HeldRun {
  private lease: LeaseBody;
  /** Monotonic ms when the current lease's claim was sent. */
  private sentAt: number;
  /** Why this holding may no longer write: the lease was lost, or the run cancelled. */
  private lost: LeaseLost | Cancelled | undefined;
  /** Set when the handler ran past the attempt timeout: its writes are refused from then on. */
  private timedOut: AttemptTimedOut | undefined;
  private ended = false;
  /** The run this holding's finishing commit handed over, until the slot collects it. */
  private next: HeldRun | undefined;
  /** Set once the slot has collected {@link next}: no hand-over from then on. */
  private collected = false;
  private readonly lossController = new AbortController();
  private readonly attemptController = new AbortController();
  private readonly signal: AbortSignal;
  private readonly gate = new Gate();
  private renewTimer: ReturnType<typeof setTimeout> | undefined;
  private watchdog: ReturnType<typeof setTimeout> | undefined;
  private renewing: Promise<void> = Promise.resolve();
  private readonly ref: RunRef;
  private readonly options: WorkerOptions;

  /**
   * A run the drain took, by its own `claimNext` or by a hand-over: counted
   * and announced as claimed, its lease kept (renewed) from now on.
   */
  static take(drain: Drain, claimed: Claimed, sentAt: number, handedOver: boolean): HeldRun {
    drain.report.claimed += 1;
    if (handedOver) drain.report.handedOver += 1;
    drain.emit({ type: "claimed", run: claimed.run, fence: claimed.lease.fence, handedOver });
    const held = new HeldRun(drain, claimed.run, claimed.lease, sentAt);
    held.arm();
    return held;
  }

  private constructor(
    private readonly drain: Drain,
    private readonly run: RunAddress,
    lease: LeaseBody,
    sentAt: number,
  ) {
    this.options = drain.options;
    this.lease = lease;
    this.sentAt = sentAt;
    this.ref = refOf(run);
    this.signal = AbortSignal.any([this.lossController.signal, this.attemptController.signal, drain.stop]);
  }

  private get ttl(): number {
    return this.options.ttlMs;
  }

  private emit(e: WorkerEvent): void {
    this.drain.emit(e);
  }

  /** Monotonic ms past which no write is sent and the lease counts as lost. */
  private giveUpAt(): number {
    return this.sentAt + this.ttl * (1 - this.drain.safetyFraction);
  }

  private lose(loss: LeaseLost | Cancelled): void {
    if (this.lost || this.ended) return;
    this.lost = loss;
    this.stopTimers();
    // Abort first: an observer that stops the worker on this event must
    // not make the worker's reason the handler's.
    this.lossController.abort(loss);
    if (loss instanceof Cancelled) this.emit({ type: "cancelled", run: this.run, cancelled: loss });
    else this.emit({ type: "lost", run: this.run, loss });
  }

  /** Counts how this holding was lost: a cancel, or a lease lost. */
  private countLoss(): void {
    if (this.lost instanceof Cancelled) this.drain.report.cancelled += 1;
    else this.drain.report.lost += 1;
  }

  private stopTimers(): void {
    if (this.renewTimer) clearTimeout(this.renewTimer);
    if (this.watchdog) clearTimeout(this.watchdog);
    this.renewTimer = undefined;
    this.watchdog = undefined;
  }

  private arm(): void {
    this.stopTimers();
    if (this.lost || this.ended) return;
    const now = performance.now();
    const renewAt = this.sentAt + this.ttl * this.drain.renewFraction;
    this.renewTimer = setTimeout(() => {
      this.renewing = this.renew();
    }, Math.max(0, renewAt - now));
    // Whatever the renewal does (hung request, starved loop), the work stops at the margin.
    this.watchdog = setTimeout(() => {
      this.lose(
        new LeaseLost(
          "expiring",
          this.lease.fence,
          `no renewal of fence ${this.lease.fence} landed before the safety margin of its lease`,
        ),
      );
    }, Math.max(0, this.giveUpAt() - now));
  }

  private async renew(): Promise<void> {
    const old = this.lease.fence;
    const giveUpAt = this.giveUpAt();
    const deadline = this.sentAt + this.ttl;
    if (performance.now() >= giveUpAt) {
      // Due long before, but the event loop only ran it now (blocked or starved).
      this.lose(new LeaseLost("expiring", old, `the renewal of fence ${old} only ran within the safety margin of its lease (event loop blocked)`));
      return;
    }
    // No write may present the fence this renewal retires.
    const bound = new AbortController();
    const t = setTimeout(() => bound.abort(), Math.max(0, giveUpAt - performance.now()));
    const signal = AbortSignal.any([bound.signal, this.lossController.signal]);
    const delays = new Doubling(50);
    try {
      await this.gate.exclusive(signal, async () => {
        for (let attempt = 1; ; attempt++) {
          if (this.lost || this.ended) return;
          const sentAt = performance.now();
          try {
            const answer = await this.options.client.claim(
              this.ref,
              {
                holder: this.lease.holder,
                ttlMs: this.ttl,
                ...(this.options.maxAttempts !== undefined ? { maxAttempts: this.options.maxAttempts } : {}),
              },
              { signal },
            );
            switch (answer.outcome) {
              case "acquired": {
                const got = answer.lease.fence;
                if (got <= old) {
                  this.lose(new LeaseLost("renewal-failed", old, `the store renewed fence ${old} with fence ${got}; a renewal must mint a higher one`));
                  return;
                }
                if (got !== old + 1) {
                  // A gap: someone ended this holding in between (an
                  // operator's release, a takeover released again), and the
                  // answer is a new claim over the tombstone, not a renewal.
                  // Stop the work, and give that holding back at once.
                  this.lose(
                    new LeaseLost(
                      "gap",
                      old,
                      `the renewal of fence ${old} answered fence ${got}, not ${old + 1}: the holding was ended in between (an operator's release, or a takeover released again), so this was a new claim; it was given back`,
                      got,
                    ),
                  );
                  await this.giveBackGap(got);
                  return;
                }
                if (performance.now() >= deadline) {
                  this.lose(new LeaseLost("expiring", old, `the renewal of fence ${old} answered after its deadline`));
                  return;
                }
                this.lease = answer.lease;
                this.sentAt = sentAt;
                this.emit({ type: "renewed", run: this.run, from: old, to: answer.lease.fence });
                this.arm();
                return;
              }
              case "held":
                this.lose(
                  new LeaseLost(
                    "superseded",
                    old,
                    `the run is held by ${answer.lease.holder || "another holding"} at fence ${answer.lease.fence}`,
                    answer.lease.fence,
                  ),
                );
                return;
              case "finished":
                if (answer.status === "cancelled") {
                  // An operator's cancel: say why, if the lifecycle tells.
                  const reason = await this.options.client
                    .lifecycle(this.ref, { signal })
                    .then((l) => l.reason ?? undefined)
                    .catch(() => undefined);
                  this.lose(cancelledWhileHeld(this.run, old, reason));
                  return;
                }
                this.lose(new LeaseLost("renewal-failed", old, `the run was finished (${answer.status}) while fence ${old} was held`));
                return;
              case "notBefore":
                this.lose(new LeaseLost("renewal-failed", old, `the run was released and deferred while fence ${old} was held`));
                return;
              case "atLimit":
                // Only a renewal of a lease that already expired is judged
                // against the key: the holding lapsed and others of the key
                // took its place.
                this.lose(
                  new LeaseLost(
                    "renewal-failed",
                    old,
                    `fence ${old} expired and the run's concurrency key ${answer.key} is at its limit (${answer.held} of ${answer.limit} held)`,
                  ),
                );
                return;
            }
          } catch (e) {
            if (this.lost || this.ended) return;
            if (e instanceof Cancelled) {
              this.lose(e);
              return;
            }
            if (bound.signal.aborted) {
              this.lose(new LeaseLost("expiring", old, `renewal attempt ${attempt} of fence ${old} did not answer before the safety margin`));
              return;
            }
            if (e instanceof RunkeepError && e.retryable && performance.now() + delays.peek() < giveUpAt) {
              await sleep(delays.next(), signal).catch(() => undefined);
              continue;
            }
            this.lose(new LeaseLost("renewal-failed", old, `renewing fence ${old} failed: ${String(e instanceof Error ? e.message : e)}`, undefined, e));
            return;
          }
        }
      });
    } catch {
      // The gate wait was cut by the margin: writes in flight held the renewal off.
      this.lose(new LeaseLost("expiring", old, `writes in flight held off the renewal of fence ${old} until the safety margin`));
    } finally {
      clearTimeout(t);
    }
  }

  /**
   * Gives back the holding a renewal took after a gap (a new claim the
   * worker must not go on with), so the run is claimable at once. A failure
   * is reported; the holding then waits out its lease.
   */
  private async giveBackGap(fence: number): Promise<void> {
    try {
      await this.options.client.release(this.ref, { fence, signal: AbortSignal.timeout(this.ttl) });
    } catch (e) {
      this.emit({ type: "error", error: e });
    }
  }

  /**
   * Throws when this holding may not write: the lease is lost, the run
   * cancelled, the holding ended, or (unless `own`: the worker's own report
   * of the timeout) the attempt timed out.
   */
  private ensureHeld(own = false): void {
    if (this.lost) throw this.lost;
    if (this.ended) throw new Error(`the holding of fence ${this.lease.fence} already ended (finished, released, snoozed or failed); nothing more can be written under it`);
    if (!own && this.timedOut) throw this.timedOut;
    if (performance.now() >= this.giveUpAt()) {
      this.lose(new LeaseLost("expiring", this.lease.fence, `fence ${this.lease.fence} is within the safety margin of its deadline`));
      throw this.lost;
    }
  }

  /**
   * A write under the current fence, shared with other writes, exclusive of
   * renewals. A refusal as fenced out loses the lease; as cancelled, the run.
   * `own`: the worker's own write, allowed after the attempt timed out.
   */
  private fenced<T>(write: (fence: number) => Promise<T>, own = false): Promise<T> {
    return this.gate.shared(async () => {
      this.ensureHeld(own);
      const fence = this.lease.fence;
      try {
        return await write(fence);
      } catch (e) {
        if (e instanceof FencedOut) {
          this.lose(new LeaseLost("fenced-out", fence, e.message, e.current, e));
        } else if (e instanceof Cancelled) {
          this.lose(e);
        }
        throw e;
      }
    });
  }

  private context(): RunContext {
    const self = this;
    return {
      run: this.run,
      ref: this.ref,
      get lease() {
        return self.lease;
      },
      get fence() {
        return self.lease.fence;
      },
      signal: this.signal,
      client: this.options.client,
      resumePoint: () => this.options.client.resumePoint(this.ref, { signal: this.signal }),
      step: (step: StepBody) =>
        this.fenced(async (fence) => {
          const receipt = await this.commit(fence, step, this.signal);
          if (step.finish) this.end();
          return receipt;
        }),
      fenced: <T>(write: (fence: number, signal: AbortSignal) => Promise<T>) => this.fenced((fence) => write(fence, this.signal)),
      ensureHeld: () => this.ensureHeld(),
    };
  }

  /**
   * Commits `step` under `fence`. A finishing step hands over while the
   * drain would claim again anyway (hand-overs on, the worker not stopping,
   * this holding not collected yet, nothing handed over already): the step
   * and the drain's next claim go as one `commitStepAndClaimNext`, and the
   * run it takes is kept for the slot ({@link takeHandedOver}). Answers the
   * step's receipt alone; a refusal or a lost answer rejects as the step's
   * own would.
   */
  private async commit(fence: number, step: StepBody, signal: AbortSignal | undefined): Promise<StepReceiptBody> {
    const client = this.options.client;
    const mayHandOver = step.finish && !this.drain.stop.aborted && !this.collected && !this.next;
    const claim = mayHandOver ? this.drain.handover : undefined;
    if (!claim) return client.commitStep(this.ref, fence, step, { signal });
    const sentAt = performance.now();
    const over = await client.commitStepAndClaimNext(this.ref, fence, step, claim, { signal });
    await this.takeHandedOver(over, sentAt);
    return over.receipt;
  }

  /**
   * Keeps what a hand-over took for the slot to work next. A claim that
   * failed after the step committed is counted, and the slot claims by
   * itself. A run taken after the slot collected this holding (a step the
   * handler did not await) is released at once.
   */
  private async takeHandedOver(over: HandOver, sentAt: number): Promise<void> {
    if (over.nextError) {
      this.drain.report.claimErrors += 1;
      this.emit({ type: "error", error: over.nextError });
    }
    if (!over.next) return;
    const next = HeldRun.take(this.drain, over.next, sentAt, true);
    if (this.collected || this.next) {
      await next.giveBack();
      return;
    }
    this.next = next;
  }

  private end(): void {
    this.ended = true;
    this.stopTimers();
  }

  /**
   * Works the run and ends the holding by what the handler returned.
   * Answers the run its finishing commit handed over (the slot works it
   * next), if any; no hand-over is taken from then on.
   */
  async work(): Promise<HeldRun | undefined> {
    const report = this.drain.report;
    const outcome = await this.runHandler();
    await this.renewing;
    if (this.lost) {
      // Lost or cancelled: nothing more is sent for this run.
      this.countLoss();
    } else if (this.ended) {
      // The handler's last step finished the run.
      report.finished += 1;
      this.emit({ type: "finished", run: this.run, outcome: { status: "completed" } });
    } else if (outcome.kind === "timeout") {
      await this.failAttempt(outcome.error, attemptError("timeout", outcome.error.detail ?? outcome.error.message), true);
    } else if (outcome.kind === "threw" && this.signal.aborted) {
      // Stopped by the worker's signal: give the run back at once.
      await this.endSafely({ release: true });
    } else if (outcome.kind === "threw" && this.options.onError === "fail") {
      report.failed += 1;
      this.emit({ type: "failed", run: this.run, error: outcome.error, kind: attemptErrorOf(outcome.error).kind, deadLettered: false });
      await this.endSafely({ finish: { status: "failed", reason: reasonOf(outcome.error) } });
    } else if (outcome.kind === "threw") {
      await this.failAttempt(outcome.error, attemptErrorOf(outcome.error), false);
    } else {
      // The handler's own result: its finish may join a group (`commitBatch`).
      await this.endSafely(outcome.result, true);
    }
    this.collected = true;
    const next = this.next;
    this.next = undefined;
    return next;
  }

  /**
   * Runs the handler, up to the attempt timeout: past it, the handler's
   * signal aborts with an {@link AttemptTimedOut}, its writes are refused
   * from then on, and the attempt ends without waiting for the handler
   * (JavaScript cannot stop it; what it writes through the context is
   * refused locally).
   */
  private async runHandler(): Promise<HandlerOutcome> {
    const settled = (async () => this.options.handler(this.context()))().then(
      (result): HandlerOutcome => ({ kind: "returned", result }),
      (error: unknown): HandlerOutcome => ({ kind: "threw", error }),
    );
    // The run's own limit (set on enqueue, carried by its lease) and the worker's: the shorter holds.
    const limits = [this.options.attemptTimeoutMs, this.lease.attemptTimeoutMs ?? undefined].filter((t): t is number => t !== undefined);
    if (limits.length === 0) return settled;
    const ms = Math.min(...limits);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<HandlerOutcome>((resolve) => {
      timer = setTimeout(() => {
        const error = new AttemptTimedOut(ms);
        this.timedOut = error;
        this.attemptController.abort(error);
        resolve({ kind: "timeout", error });
      }, ms);
    });
    try {
      return await Promise.race([settled, timedOut]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Reports the attempt failed (`failAttempt` under the current fence, the
   * drain's attempt limit): the store keeps `error`, ends the holding and
   * defers the run by its backoff, or dead-letters it at its limit.
   */
  private async failAttempt(cause: unknown, error: AttemptErrorBody, timedOut: boolean): Promise<void> {
    const report = this.drain.report;
    report.failed += 1;
    if (timedOut) report.timedOut += 1;
    try {
      const options = this.options.maxAttempts !== undefined ? { maxAttempts: this.options.maxAttempts } : {};
      const lifecycle = await this.fenced(
        (fence) =>
          this.options.client.failAttempt(this.ref, fence, error, options).then((l) => {
            this.end();
            return l;
          }),
        true,
      );
      const deadLettered = lifecycle.deadLettered === true;
      if (deadLettered) report.deadLettered += 1;
      this.emit({ type: "failed", run: this.run, error: cause, kind: error.kind, deadLettered });
    } catch (e) {
      if (this.lost) {
        this.countLoss();
        return;
      }
      this.emit({ type: "error", error: e });
    } finally {
      this.end();
    }
  }

  /** Releases a handed-over run without working it (the worker stopped, or nobody collects it). */
  giveBack(): Promise<void> {
    return this.endSafely({ release: true });
  }

  /** {@link endWith}, its failure counted (a lost lease) or reported, not thrown. */
  private async endSafely(result: WorkResult, mayGroup = false): Promise<void> {
    try {
      await this.endWith(result, mayGroup);
    } catch (e) {
      if (this.lost) {
        this.countLoss();
        return;
      }
      this.emit({ type: "error", error: e });
    } finally {
      this.end();
    }
  }

  /**
   * Ends the holding by `result`. `mayGroup`: the handler's own result,
   * whose finish joins the drain's group commit when there is one (the
   * worker's other finishes, `onError: "fail"`, go alone).
   */
  private async endWith(result: WorkResult, mayGroup: boolean): Promise<void> {
    const client = this.options.client;
    const report = this.drain.report;
    if (result === undefined || "finish" in result) {
      const outcome: OutcomeBody = result?.finish ?? { status: "completed" };
      const group = mayGroup ? this.drain.group : undefined;
      if (group) {
        // Grouped: it waits for others outside the gate; at send time it enters the gate with its current fence.
        await group.commit(this.ref, { finish: outcome }, (write) =>
          this.fenced((fence) =>
            write(fence).then((receipt) => {
              this.end();
              return receipt;
            }),
          ),
        );
      } else {
        // With hand-overs on, the finish is a finishing step: it may carry the drain's next claim.
        const finish = (fence: number) =>
          this.drain.handover ? this.commit(fence, { finish: outcome }, undefined) : client.finish(this.ref, fence, outcome);
        await this.fenced((fence) => finish(fence).then(() => this.end()));
      }
      report.finished += 1;
      this.emit({ type: "finished", run: this.run, outcome });
    } else if ("release" in result) {
      const r = await this.fenced((fence) =>
        client.release(this.ref, { fence }).then((done) => {
          this.end();
          return done;
        }),
      );
      report.released += 1;
      this.emit({ type: "released", run: this.run, done: r.done });
    } else {
      const until = client.storeNow() + result.retryAfterMs;
      await this.fenced((fence) => client.snooze(this.ref, fence, until).then(() => this.end()));
      report.snoozed += 1;
      this.emit({ type: "snoozed", run: this.run, until });
    }
  }
}

/**
 * Writes share the gate; a renewal takes it alone, after the writes in
 * flight, and writes that arrive meanwhile wait for it.
 */
class Gate {
  private readers = 0;
  private writer: Promise<void> | undefined;
  private drained: (() => void) | undefined;

  async shared<T>(fn: () => Promise<T>): Promise<T> {
    while (this.writer) await this.writer;
    this.readers += 1;
    try {
      return await fn();
    } finally {
      this.readers -= 1;
      if (this.readers === 0) this.drained?.();
    }
  }

  /** Rejects (without running `fn`) when `signal` aborts before the writes drain. */
  async exclusive<T>(signal: AbortSignal, fn: () => Promise<T>): Promise<T> {
    while (this.writer) await this.writer;
    let open!: () => void;
    this.writer = new Promise<void>((r) => (open = r));
    try {
      if (this.readers > 0) {
        await new Promise<void>((resolve, reject) => {
          const onAbort = () => reject(signal.reason);
          if (signal.aborted) return onAbort();
          this.drained = () => {
            signal.removeEventListener("abort", onAbort);
            resolve();
          };
          signal.addEventListener("abort", onAbort, { once: true });
        });
      }
      return await fn();
    } finally {
      this.drained = undefined;
      this.writer = undefined;
      open();
    }
  }
}

function retryAfter(e: unknown): number {
  const ms = (e as { retryAfterMs?: unknown }).retryAfterMs;
  return typeof ms === "number" ? ms : 0;
}

/** What a handler's attempt ended in. */
type HandlerOutcome =
  | { kind: "returned"; result: WorkResult }
  | { kind: "threw"; error: unknown }
  | { kind: "timeout"; error: AttemptTimedOut };

/**
 * The failed attempt's error for what a handler threw: kind its `name`
 * (`TypeError`; `error` when it has none), message its `message` (else
 * its text), cut to the store's limits with a marker.
 */
export function attemptErrorOf(e: unknown): AttemptErrorBody {
  const o = typeof e === "object" && e !== null ? (e as { name?: unknown; message?: unknown }) : undefined;
  const name = typeof o?.name === "string" ? o.name : "";
  const message = typeof o?.message === "string" ? o.message : textOf(e);
  return attemptError(name || "error", message);
}

function textOf(e: unknown): string {
  try {
    return String(e);
  } catch {
    return Object.prototype.toString.call(e);
  }
}

/** The {@link Cancelled} a renewal that found the run cancelled aborts the handler with. */
function cancelledWhileHeld(run: RunAddress, fence: number, reason: string | undefined): Cancelled {
  const problem: ProblemBody = {
    type: `${TYPE_PREFIX}cancelled`,
    title: "Run cancelled",
    status: 409,
    detail: `run ${run.runId} was cancelled by an operator while fence ${fence} was held${reason !== undefined ? `: ${reason}` : ""}`,
    run: run.runId,
    operation: "claim",
  };
  if (reason !== undefined) problem.reason = reason;
  return new Cancelled(problem);
}

function reasonOf(e: unknown): string {
  const s = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return s.slice(0, 500);
}

function randomId(): string {
  const b = new Uint8Array(8);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** A JSON value (re-exported for handlers' results). */
export type { Json };
