/**
 * Errors typed from the server's RFC 9457 problem details.
 *
 * Every non-2xx answer of the API is `application/problem+json` with a
 * `type` of `urn:runkeep:problem:<slug>`, one per kind. {@link problemError}
 * maps it to the subclass of {@link RunkeepError} for that slug, carrying the
 * kind's extension members (`FencedOut.presented` / `.current`,
 * `InvalidInput.field`, `Contended.retryAfterMs`, …). A `type` the client
 * does not know still gives a `RunkeepError` with the type, status and
 * detail, never a silent success.
 *
 * Failures below HTTP (no connection, connection reset, no answer in time)
 * are {@link ConnectionError}s; an aborted call rejects with the signal's
 * reason (an `AbortError` `DOMException` by default), as `fetch` does.
 *
 * @module
 */

import type { Json, ProblemBody } from "./types.js";

/** The prefix of every runkeep problem `type`. */
export const TYPE_PREFIX = "urn:runkeep:problem:";

/** The problem kinds the server answers (the end of the `type` URI). */
export type ProblemSlug =
  | "not-found"
  | "invalid-input"
  | "fenced-out"
  | "contended"
  | "conflict"
  | "unsupported"
  | "corrupted"
  | "unavailable"
  | "backend"
  | "unauthorized"
  | "forbidden"
  | "malformed-body"
  | "unsupported-media-type"
  | "payload-too-large"
  | "method-not-allowed"
  | "timeout"
  | "overloaded"
  | "cancelled";

/** What an error is built with besides its problem. */
export interface ProblemErrorOptions {
  /** The underlying failure. */
  cause?: unknown;
  /** The answer's `Retry-After`, ms. */
  retryAfterMs?: number | undefined;
}

/** What a request was, for error messages. */
export interface RequestInfo {
  method: string;
  path: string;
}

/**
 * Any error answered by, or on the way to, a runkeep server.
 *
 * `type`, `status`, `title` and `detail` are the problem's; `problem` is the
 * whole body as received (extension members included).
 */
export class RunkeepError extends Error {
  override name = "RunkeepError";
  /** The problem `type` URI (`urn:runkeep:problem:<slug>`). */
  readonly type: string;
  /** The slug (end of the type URI), or `undefined` for a type not runkeep's. */
  readonly slug: ProblemSlug | undefined;
  /** HTTP status (0 for a failure below HTTP). */
  readonly status: number;
  /** The kind's title. */
  readonly title: string;
  /** What happened, for a person. */
  readonly detail: string | undefined;
  /** The request path the problem answers. */
  readonly instance: string | undefined;
  /** The whole problem body. */
  readonly problem: ProblemBody;
  /** The request that failed. */
  readonly request: RequestInfo | undefined;

  constructor(problem: ProblemBody, request?: RequestInfo, options: ProblemErrorOptions = {}) {
    const detail = problem.detail ?? problem.title;
    const where = request ? ` (${request.method} ${request.path})` : "";
    super(`${problem.title}: ${detail}${where}`, "cause" in options ? { cause: options.cause } : undefined);
    this.problem = problem;
    this.type = problem.type;
    this.slug = slugOf(problem.type);
    this.status = problem.status;
    this.title = problem.title;
    this.detail = problem.detail ?? undefined;
    this.instance = problem.instance ?? undefined;
    this.request = request;
  }

  /**
   * True when repeating the same call later may succeed without changing it
   * (contended, unavailable, overloaded, timeout, connection failures). A
   * write whose outcome is unknown ({@link Unavailable.outcomeUnknown}) must
   * be read back before it is repeated.
   */
  get retryable(): boolean {
    return false;
  }
}

/** `not-found` (404): no such run or route, or a run of another tenant. */
export class NotFound extends RunkeepError {
  override name = "NotFound";
}

/** `invalid-input` (400): a value broke a rule; nothing was changed. */
export class InvalidInput extends RunkeepError {
  override name = "InvalidInput";
  /** The input at fault: a path segment, a query parameter or a body path (`step.events[0].type`). */
  readonly field: string | undefined;
  constructor(problem: ProblemBody, request?: RequestInfo, options?: ProblemErrorOptions) {
    super(problem, request, options);
    this.field = problem.field ?? undefined;
  }
}

/** `malformed-body` (400): the body is not JSON, or not the JSON the route takes. */
export class MalformedBody extends InvalidInput {
  override name = "MalformedBody";
}

/** `payload-too-large` (413): the body is larger than the server accepts. */
export class PayloadTooLarge extends RunkeepError {
  override name = "PayloadTooLarge";
}

/**
 * `fenced-out` (409): the fence presented no longer holds the run — another
 * worker took it over, or this holding was renewed, released or finished.
 * The write changed nothing.
 */
export class FencedOut extends RunkeepError {
  override name = "FencedOut";
  /** The fence the caller presented. */
  readonly presented: number;
  /** The run's current fence. */
  readonly current: number;
  /** The run's id. */
  readonly run: string | undefined;
  /** The refused operation (`commit_step`, `finish`, …). */
  readonly operation: string | undefined;
  constructor(problem: ProblemBody, request?: RequestInfo, options?: ProblemErrorOptions) {
    super(problem, request, options);
    if (typeof problem.presented !== "number" || typeof problem.current !== "number") {
      throw new RunkeepError(
        {
          type: `${TYPE_PREFIX}corrupted`,
          title: "Malformed problem",
          status: problem.status,
          detail: `the server answered fenced-out without its fences: ${problem.detail ?? ""}`,
        },
        request,
      );
    }
    this.presented = problem.presented;
    this.current = problem.current;
    this.run = problem.run ?? undefined;
    this.operation = problem.operation ?? undefined;
  }
}

/**
 * `cancelled` (409): an operator cancelled the run (`POST …/cancel`). The
 * run is finished as cancelled and its holding ended: a holder's write is
 * refused with this instead of `fenced-out`, so it knows to stop, and not
 * to release, finish or report anything for the run. `runWorker` also
 * aborts a handler's `ctx.signal` with one when a renewal finds the run
 * cancelled (then {@link operation} is `claim`).
 */
export class Cancelled extends RunkeepError {
  override name = "Cancelled";
  /** The run's id. */
  readonly run: string | undefined;
  /** The refused operation (`commit_step`, `finish`, `claim`, …). */
  readonly operation: string | undefined;
  /** The operator's reason, when one was given. */
  readonly reason: string | undefined;
  constructor(problem: ProblemBody, request?: RequestInfo, options?: ProblemErrorOptions) {
    super(problem, request, options);
    this.run = problem.run ?? undefined;
    this.operation = problem.operation ?? undefined;
    this.reason = problem.reason ?? undefined;
  }
}

/** A 503 answer: carries the server's `Retry-After`. */
export abstract class RetryLater extends RunkeepError {
  /** How long to wait before retrying, ms (from `Retry-After`; 1000 when absent). */
  readonly retryAfterMs: number;
  constructor(problem: ProblemBody, request?: RequestInfo, options: ProblemErrorOptions = {}) {
    super(problem, request, options);
    this.retryAfterMs = options.retryAfterMs ?? 1000;
  }
  override get retryable(): boolean {
    return true;
  }
}

/** `contended` (503): the claim lost to concurrent claims; retry later. */
export class Contended extends RetryLater {
  override name = "Contended";
  /** Claim attempts lost. */
  get attempts(): number | undefined {
    return this.problem.attempts ?? undefined;
  }
}

/**
 * `unavailable` (503): the store is unreachable. When {@link outcomeUnknown}
 * is set, the write may or may not have been stored: read it back before
 * repeating it.
 */
export class Unavailable extends RetryLater {
  override name = "Unavailable";
  get outcomeUnknown(): boolean {
    return this.problem.outcomeUnknown === true;
  }
}

/** `overloaded` (503): the server is at its concurrency limit or shutting down. */
export class Overloaded extends RetryLater {
  override name = "Overloaded";
}

/** `timeout` (408): the request took longer than the server allows. */
export class Timeout extends RunkeepError {
  override name = "Timeout";
  override get retryable(): boolean {
    return true;
  }
}

/**
 * `conflict` (409): a compare-and-set found the record changed — among
 * others, a park that was already answered: {@link firstAnswer} is the
 * answer that won.
 */
export class Conflict extends RunkeepError {
  override name = "Conflict";
  /** For a park answered twice: the first answer, as stored. */
  get firstAnswer(): Json | undefined {
    return this.problem.firstAnswer;
  }
  /** For a park answered twice: when the first answer was recorded. */
  get resolvedAt(): number | undefined {
    return this.problem.resolvedAt ?? undefined;
  }
}

/** `unsupported` (422): the store refuses a capability it cannot honour. */
export class Unsupported extends RunkeepError {
  override name = "Unsupported";
}

/** `corrupted` (500): stored data could not be understood. */
export class Corrupted extends RunkeepError {
  override name = "Corrupted";
}

/** `backend` (500): any other store failure. */
export class Backend extends RunkeepError {
  override name = "Backend";
}

/** `unauthorized` (401): no token, or an unknown or revoked one. */
export class Unauthorized extends RunkeepError {
  override name = "Unauthorized";
}

/**
 * `forbidden` (403): the token's role does not allow the operation
 * ({@link requiredRole}), or the run's holding is not one this token may
 * write under ({@link notYourHolding}: a fenced act on a holding another
 * token claimed, or an unfenced write while a lease is on top). The store
 * judges the latter with the fence: stop working on the run.
 */
export class Forbidden extends RunkeepError {
  override name = "Forbidden";
  /** The role the operation needs. */
  get requiredRole(): string | undefined {
    return this.problem.requiredRole ?? undefined;
  }
  /** True when the refusal is about the run's holding, not the role. */
  get notYourHolding(): boolean {
    return typeof this.problem.run === "string" && typeof this.problem.current === "number";
  }
  /** For {@link notYourHolding}: the run. */
  get run(): string | undefined {
    return this.notYourHolding ? (this.problem.run ?? undefined) : undefined;
  }
  /** For {@link notYourHolding}: the fence of the holding that is not this token's. */
  get holdingFence(): number | undefined {
    return this.notYourHolding ? (this.problem.current ?? undefined) : undefined;
  }
  /** For {@link notYourHolding}: the fence the refused act presented (none for an unfenced write). */
  get presented(): number | undefined {
    return this.notYourHolding ? (this.problem.presented ?? undefined) : undefined;
  }
}

/** `unsupported-media-type` (415). */
export class UnsupportedMediaType extends RunkeepError {
  override name = "UnsupportedMediaType";
}

/** `method-not-allowed` (405). */
export class MethodNotAllowed extends RunkeepError {
  override name = "MethodNotAllowed";
}

/**
 * No HTTP answer: the connection could not be made, was reset, or the
 * answer could not be read. {@link outcomeUnknown} is true when a write may
 * have reached the server (anything but a refused connection): read back
 * before repeating it.
 */
export class ConnectionError extends RunkeepError {
  override name = "ConnectionError";
  readonly outcomeUnknown: boolean;
  constructor(detail: string, request: RequestInfo, outcomeUnknown: boolean, cause: unknown) {
    super(
      { type: "urn:runkeep:client:connection", title: "No answer from the server", status: 0, detail },
      request,
      { cause },
    );
    this.outcomeUnknown = outcomeUnknown;
  }
  override get retryable(): boolean {
    return true;
  }
}

function slugOf(type: string): ProblemSlug | undefined {
  if (!type.startsWith(TYPE_PREFIX)) return undefined;
  const slug = type.slice(TYPE_PREFIX.length);
  return slug in BY_SLUG ? (slug as ProblemSlug) : undefined;
}

type Ctor = new (problem: ProblemBody, request?: RequestInfo, options?: ProblemErrorOptions) => RunkeepError;

const BY_SLUG: Record<ProblemSlug, Ctor> = {
  "not-found": NotFound,
  "invalid-input": InvalidInput,
  "fenced-out": FencedOut,
  contended: Contended,
  conflict: Conflict,
  unsupported: Unsupported,
  corrupted: Corrupted,
  unavailable: Unavailable,
  backend: Backend,
  unauthorized: Unauthorized,
  forbidden: Forbidden,
  "malformed-body": MalformedBody,
  "unsupported-media-type": UnsupportedMediaType,
  "payload-too-large": PayloadTooLarge,
  "method-not-allowed": MethodNotAllowed,
  timeout: Timeout,
  overloaded: Overloaded,
  cancelled: Cancelled,
};

/** Every problem slug with the class it maps to. */
export const PROBLEM_CLASSES: Readonly<Record<ProblemSlug, Ctor>> = BY_SLUG;

/** Parses a `Retry-After` header (seconds, or an HTTP date) into ms. */
export function parseRetryAfter(value: string | null, nowMs: number = Date.now()): number | undefined {
  if (value === null) return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - nowMs);
}

/**
 * The typed error for a problem body: the subclass its `type` names, or a
 * plain {@link RunkeepError} for a type that is not runkeep's.
 */
export function problemError(problem: ProblemBody, request?: RequestInfo, retryAfterMs?: number): RunkeepError {
  const slug = slugOf(problem.type);
  if (slug === undefined) return new RunkeepError(problem, request);
  try {
    return new BY_SLUG[slug](problem, request, { retryAfterMs });
  } catch (e) {
    if (e instanceof RunkeepError) return e;
    throw e;
  }
}

/**
 * The error for a non-2xx HTTP answer: its problem body when it has one, else
 * a `RunkeepError` describing what came back (a proxy's error page, say).
 */
export async function responseError(res: Response, request: RequestInfo): Promise<RunkeepError> {
  const retryAfterMs = parseRetryAfter(res.headers.get("retry-after"));
  const text = await res.text().catch(() => "");
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  if (isProblem(body)) return problemError(body, request, retryAfterMs);
  return new RunkeepError(
    {
      type: "about:blank",
      title: res.statusText || `HTTP ${res.status}`,
      status: res.status,
      detail: `the server answered ${res.status} without a problem body: ${text.slice(0, 200)}`,
    },
    request,
  );
}

function isProblem(v: unknown): v is ProblemBody {
  if (typeof v !== "object" || v === null) return false;
  const o = v as Record<string, unknown>;
  return typeof o["type"] === "string" && typeof o["title"] === "string" && typeof o["status"] === "number";
}
