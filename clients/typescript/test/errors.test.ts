/**
 * Errors typed from the problem details: the mapping of every slug, and the
 * real answers of a live server for the common refusals.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  Conflict,
  ConnectionError,
  Contended,
  FencedOut,
  Forbidden,
  InvalidInput,
  MalformedBody,
  NotFound,
  parseRetryAfter,
  PROBLEM_CLASSES,
  problemError,
  RunkeepClient,
  RunkeepError,
  TYPE_PREFIX,
  Unauthorized,
  Unavailable,
} from "../src/index.js";
import { firstCheckpoint, Serve } from "./helpers/serve.js";

let serve: Serve;

before(async () => {
  serve = await Serve.start();
});

after(async () => {
  await serve?.close();
});

test("every problem slug maps to its own class", () => {
  const seen = new Set<unknown>();
  for (const [slug, cls] of Object.entries(PROBLEM_CLASSES)) {
    const e = problemError({ type: TYPE_PREFIX + slug, title: "t", status: 409, presented: 1, current: 2 });
    assert.ok(e instanceof cls, slug);
    assert.equal(e.slug, slug);
    seen.add(cls);
  }
  assert.equal(seen.size, Object.keys(PROBLEM_CLASSES).length, "no two slugs share a class");
  const unknown = problemError({ type: "urn:other:x", title: "Other", status: 418 });
  assert.equal(unknown.constructor, RunkeepError);
  assert.equal(unknown.slug, undefined);
});

test("fenced-out carries both fences; without them it is not a FencedOut", () => {
  const e = problemError({
    type: `${TYPE_PREFIX}fenced-out`,
    title: "Fenced out",
    status: 409,
    presented: 3,
    current: 5,
    run: "r",
    operation: "commit_step",
  });
  assert.ok(e instanceof FencedOut);
  assert.deepEqual([e.presented, e.current, e.run, e.operation], [3, 5, "r", "commit_step"]);
  const broken = problemError({ type: `${TYPE_PREFIX}fenced-out`, title: "Fenced out", status: 409 });
  assert.ok(!(broken instanceof FencedOut));
  assert.match(broken.message, /without its fences/);
});

test("forbidden tells a holding that is not this token's from a role too low", () => {
  const e = problemError({
    type: `${TYPE_PREFIX}forbidden`,
    title: "Forbidden",
    status: 403,
    run: "r",
    operation: "finish",
    presented: 4,
    current: 4,
  });
  assert.ok(e instanceof Forbidden);
  assert.deepEqual([e.notYourHolding, e.run, e.holdingFence, e.presented], [true, "r", 4, 4]);
  const unfenced = problemError({ type: `${TYPE_PREFIX}forbidden`, title: "Forbidden", status: 403, run: "r", current: 2 });
  assert.ok(unfenced instanceof Forbidden);
  assert.deepEqual([unfenced.notYourHolding, unfenced.holdingFence, unfenced.presented], [true, 2, undefined]);
  const role = problemError({ type: `${TYPE_PREFIX}forbidden`, title: "Forbidden", status: 403, requiredRole: "worker" });
  assert.ok(role instanceof Forbidden);
  assert.deepEqual([role.notYourHolding, role.run, role.holdingFence, role.requiredRole], [false, undefined, undefined, "worker"]);
});

test("503 answers carry Retry-After; unavailable says when the outcome is unknown", () => {
  const c = problemError({ type: `${TYPE_PREFIX}contended`, title: "Contended", status: 503, attempts: 8 }, undefined, 2000);
  assert.ok(c instanceof Contended);
  assert.equal(c.retryAfterMs, 2000);
  assert.equal(c.attempts, 8);
  assert.equal(c.retryable, true);
  const u = problemError({ type: `${TYPE_PREFIX}unavailable`, title: "Store unavailable", status: 503, outcomeUnknown: true });
  assert.ok(u instanceof Unavailable);
  assert.equal(u.outcomeUnknown, true);
  assert.equal(u.retryAfterMs, 1000, "the default when the header is missing");
  assert.equal(parseRetryAfter("3"), 3000);
  assert.equal(parseRetryAfter(new Date(Date.now() + 5000).toUTCString(), Date.now()) !== undefined, true);
  assert.equal(parseRetryAfter("soon"), undefined);
});

test("live: the server's refusals arrive as typed errors", async () => {
  const run = serve.run("errors-1");
  const worker = serve.client("worker");
  const reader = serve.client("reader");
  const operator = serve.client("operator");

  const anonymous = new RunkeepClient({ baseUrl: serve.url, token: "rk_nope_0000", tenant: "acme" });
  await assert.rejects(anonymous.listRuns(), (e: unknown) => e instanceof Unauthorized && e.status === 401);

  await assert.rejects(
    reader.claimNext({ holder: "r", ttlMs: 1000 }),
    (e: unknown) => e instanceof Forbidden && e.status === 403,
  );

  await assert.rejects(
    worker.lifecycle({ ...run, tenantId: "someone-else" }),
    (e: unknown) => e instanceof NotFound && e.status === 404,
  );

  await assert.rejects(
    worker.claim(run, { holder: "w", ttlMs: 0 }),
    (e: unknown) => e instanceof InvalidInput && e.field === "ttlMs" && e.status === 400,
  );
  await assert.rejects(
    worker.claim({ ...run, runId: "../etc" }, { holder: "w", ttlMs: 1000 }),
    (e: unknown) => e instanceof InvalidInput && e.field === "run",
  );
  await assert.rejects(
    worker.commitStep(run, 1, { events: [{ type: 7 as unknown as string }] }),
    (e: unknown) => e instanceof MalformedBody && e instanceof InvalidInput && e.field === "step.events[0].type",
  );

  // A park answered twice: the second answer sees the first.
  await worker.enqueue(run, { checkpoint: firstCheckpoint("park") });
  const claim = await worker.claim(run, { holder: "w", ttlMs: 30_000 });
  assert.equal(claim.outcome, "acquired");
  if (claim.outcome !== "acquired") return;
  await worker.commitStep(run, claim.lease.fence, {
    checkpoint: {
      id: "cp_park",
      createdAt: Date.now(),
      pending: { request: { type: "approval", text: "ship it?" }, parkedAt: Date.now() },
    },
  });
  const first = await operator.resolvePark(run, "cp_park", { action: "answer", decision: { approved: true } });
  assert.deepEqual(first.pending?.decision, { approved: true });
  await assert.rejects(
    operator.resolvePark(run, "cp_park", { action: "answer", decision: { approved: false } }),
    (e: unknown) => e instanceof Conflict && JSON.stringify(e.firstAnswer) === '{"approved":true}' && typeof e.resolvedAt === "number",
  );
});

test("no server: a ConnectionError, outcome known for a refused connection", async () => {
  const s = await Serve.start();
  const c = new RunkeepClient({ baseUrl: s.url, token: s.token("worker"), tenant: "acme" });
  await s.close();
  await assert.rejects(c.appendEvents(s.run("x"), [{ type: "t" }]), (e: unknown) => {
    return e instanceof ConnectionError && e.status === 0 && e.outcomeUnknown === false && e.retryable;
  });
});

test("an aborted call rejects with the signal's reason", async () => {
  const c = serve.client("worker");
  const controller = new AbortController();
  const pending = c.claimNext({ holder: "w-abort", ttlMs: 1000, waitMs: 10_000 }, { signal: controller.signal });
  const reason = new Error("stop waiting");
  setTimeout(() => controller.abort(reason), 50);
  await assert.rejects(pending, (e: unknown) => e === reason);
});
