// Generated from clients/typescript/src/backoff.ts by `npm run console-sse`
// (clients/typescript/scripts/console-sse.mjs). Do not edit: change the
// client's backoff and regenerate. The console serves it as it is.

/**
 * Backoff, written once for the package and the web console: the worker's
 * claim retries and lease renewals (`worker.ts`), the event tail's
 * reconnects (`client.ts`) and the console's live tail
 * (`crates/runkeep-server/console/sse.js`, which imports this module as
 * `console/backoff.js`, emitted by `npm run console-sse`). No dependency:
 * the package has no runtime dependencies, and what the four loops share
 * is a doubling delay that starts again after a success.
 *
 * @internal
 */
export class Doubling {
    first;
    max;
    current;
    /** Starts at `first` ms; never above `max` (unless `first` is). */
    constructor(first, max = Number.POSITIVE_INFINITY) {
        this.first = first;
        this.max = max;
        this.current = first;
    }
    /** The delay to wait now, ms; the next one is twice it, capped. */
    next() {
        const d = this.current;
        this.current = Math.min(d * 2, this.max);
        return d;
    }
    /** The delay {@link next} will answer, without using it. */
    peek() {
        return this.current;
    }
    /** Back to the first delay (after a success). */
    reset() {
        this.current = this.first;
    }
}
