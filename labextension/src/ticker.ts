/**
 * Calls an async function every `interval` ms while it is wanted, one call at a time,
 * backing off when calls fail: after n failures in a row the next call waits
 * `interval * 2^n` ms, at most `max` ms. The first success returns to `interval`.
 *
 * (Lumino's `Poll` backs off by a random amount; this one is predictable, which is what
 * a user watching a "retrying…" line, and a test, expect.)
 */
export class Ticker {
  constructor(options: Ticker.IOptions) {
    this._call = options.call;
    this._standby = options.standby ?? (() => false);
    this.setInterval(options.interval, options.max);
  }

  /** Failed calls in a row. */
  get failures(): number {
    return this._failures;
  }

  /** The delay before the next call, given the failures so far. */
  get delay(): number {
    return this._failures
      ? Math.min(this._max, this._interval * 2 ** this._failures)
      : this._interval;
  }

  /** Change the pace (ms); takes effect from the next call. */
  setInterval(interval: number, max = Math.max(interval, this._max)): void {
    this._interval = Math.max(1, interval);
    this._max = Math.max(this._interval, max);
  }

  /** Start ticking (the first call is immediate). */
  start(): void {
    if (!this._started) {
      this._started = true;
      this.now();
    }
  }

  /** Call now (or right after the call in flight), then go on at the usual pace. */
  now(): void {
    if (this._disposed || !this._started) {
      return;
    }
    if (this._inFlight) {
      this._again = true;
      return;
    }
    window.clearTimeout(this._timer);
    void this._tick();
  }

  dispose(): void {
    this._disposed = true;
    window.clearTimeout(this._timer);
  }

  private async _tick(): Promise<void> {
    if (this._disposed) {
      return;
    }
    if (!this._standby()) {
      this._inFlight = true;
      try {
        await this._call();
        this._failures = 0;
      } catch {
        this._failures += 1; // the caller has shown what went wrong
      } finally {
        this._inFlight = false;
      }
    }
    if (this._disposed) {
      return;
    }
    const delay = this._again ? 0 : this.delay;
    this._again = false;
    this._timer = window.setTimeout(() => void this._tick(), delay);
  }

  private readonly _call: () => Promise<void>;
  private readonly _standby: () => boolean;
  private _interval = 1000;
  private _max = 1000;
  private _failures = 0;
  private _timer = 0;
  private _started = false;
  private _inFlight = false;
  private _again = false;
  private _disposed = false;
}

export namespace Ticker {
  export interface IOptions {
    /** What to call; a rejection counts as a failure (and backs off). */
    call: () => Promise<void>;
    /** Milliseconds between calls. */
    interval: number;
    /** The longest wait while backing off (ms). */
    max: number;
    /** While true, skip the calls (a hidden widget, a hidden browser tab). */
    standby?: () => boolean;
  }
}
