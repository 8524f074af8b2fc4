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
  private current: number;

  /** Starts at `first` ms; never above `max` (unless `first` is). */
  constructor(
    private readonly first: number,
    private readonly max: number = Number.POSITIVE_INFINITY,
  ) {
    this.current = first;
  }

  /** The delay to wait now, ms; the next one is twice it, capped. */
  next(): number {
    const d = this.current;
    this.current = Math.min(d * 2, this.max);
    return d;
  }

  /** The delay {@link next} will answer, without using it. */
  peek(): number {
    return this.current;
  }

  /** Back to the first delay (after a success). */
  reset(): void {
    this.current = this.first;
  }
}
