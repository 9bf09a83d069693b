/**
 * The page's connection state machine: one enum, one transition table, one transition().
 *
 *   idle -> connecting -> live <-> paused
 *             |  ^         |        |
 *             v  |         v        v
 *            error  <-----------  closed
 *
 * `error` and `closed` are resting states from which the user may connect again. An illegal
 * transition throws a StateError naming the current state and the attempted one (a bug, not a
 * runtime condition).
 */

export const PageState = Object.freeze({
  IDLE: "idle",
  CONNECTING: "connecting",
  LIVE: "live",
  PAUSED: "paused",
  ERROR: "error",
  CLOSED: "closed",
});

const ALLOWED = Object.freeze({
  [PageState.IDLE]: [PageState.CONNECTING],
  [PageState.CONNECTING]: [PageState.LIVE, PageState.PAUSED, PageState.ERROR, PageState.CLOSED],
  [PageState.LIVE]: [PageState.PAUSED, PageState.ERROR, PageState.CLOSED, PageState.CONNECTING],
  [PageState.PAUSED]: [PageState.LIVE, PageState.ERROR, PageState.CLOSED, PageState.CONNECTING],
  [PageState.ERROR]: [PageState.CONNECTING, PageState.CLOSED],
  [PageState.CLOSED]: [PageState.CONNECTING],
});

export class StateError extends Error {
  constructor(current, attempted) {
    super(`illegal page transition: ${current} -> ${attempted}`);
    this.name = "StateError";
    this.current = current;
    this.attempted = attempted;
  }
}

/** Holds the current PageState; listeners get (next, previous, detail) after every change. */
export class PageStateMachine {
  constructor() {
    this.state = PageState.IDLE;
    this.detail = "";
    this._listeners = new Set();
  }

  /** Subscribe; returns an unsubscribe function. */
  subscribe(listener) {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  /** True when `next` is reachable from the current state (same-state moves are no-ops). */
  can(next) {
    return next === this.state || ALLOWED[this.state].includes(next);
  }

  /** Move to `next`; a move to the current state only updates the detail text. */
  transition(next, detail = "") {
    if (!this.can(next)) throw new StateError(this.state, next);
    const previous = this.state;
    this.state = next;
    this.detail = detail;
    if (previous !== next) console.info(`page state ${previous} -> ${next}${detail ? `: ${detail}` : ""}`);
    for (const listener of this._listeners) listener(next, previous, detail);
  }
}
