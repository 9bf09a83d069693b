/**
 * Input -> applied latency from the two-phase acks (docs/api.md "Events": every input that changes generation
 * is acknowledged by `input.received` {seq, kind} at once, then `<kind>.applied` {seq, chunk,
 * pts}; a cut is a prompt with mode "cut": the server receives it as kind "prompt" and
 * acknowledges it by `prompt.applied` with mode "cut"; `input.superseded` {seq} says a latched
 * input was replaced before any chunk used it). The page keeps cuts apart from switches.
 *
 * The client sends no ids, so inputs are matched to acks by order: the data channel is ordered
 * and the server acknowledges inputs in arrival order. `input.received` gives the oldest
 * unacknowledged input of its kind its seq. An applied event matches by seq (else the oldest
 * pending input of its kind); older pending inputs of the same kind are dropped with it (actions
 * are latched latest-wins, so most never get an applied ack of their own). Latencies are
 * milliseconds on the page's clock.
 */

const KINDS = ["prompt", "cut", "action", "audio"];

/** The server's input kind of what the page tracks as `kind` (a cut is a prompt). */
const inputKind = (kind) => (kind === "cut" ? "prompt" : kind);
const MAX_PENDING = 512;
const WINDOW = 50;

function median(values) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** Kind of an `*.applied` event type ("prompt.applied" -> "prompt"), or null. */
export function appliedKind(type) {
  if (!type.endsWith(".applied")) return null;
  const kind = type.slice(0, -".applied".length);
  return KINDS.includes(kind) ? kind : null;
}

export class AckTracker {
  constructor({ now = () => performance.now() } = {}) {
    this._now = now;
    this._pending = []; // [{kind, sentMs, seq|null, receivedMs|null}] in send order
    this.receivedMs = Object.fromEntries(KINDS.map((k) => [k, []]));
    this.appliedMs = Object.fromEntries(KINDS.map((k) => [k, []]));
    this.lastApplied = null; // {kind, latencyMs, chunk, pts, sentMs, appliedMs}
  }

  /** Record that an input of `kind` was just sent. */
  noteSent(kind) {
    if (!KINDS.includes(kind))
      throw new RangeError(`unknown input kind ${JSON.stringify(kind)}; expected one of ${KINDS}`);
    this._pending.push({ kind, sentMs: this._now(), seq: null, receivedMs: null });
    if (this._pending.length > MAX_PENDING) this._pending.splice(0, this._pending.length - MAX_PENDING);
  }

  /** Feed every server event; returns the matched {kind, latencyMs} for applied events, else null. */
  observe(event) {
    if (event.type === "input.received") return this._received(event);
    if (event.type === "input.superseded") {
      this._pending = this._pending.filter((p) => p.seq !== event.seq);
      return null;
    }
    const kind = appliedKind(event.type);
    return kind ? this._applied(kind, event) : null;
  }

  _received(event) {
    const entry = this._pending.find((p) => p.seq === null && (!event.kind || inputKind(p.kind) === event.kind));
    if (!entry) return null;
    entry.seq = event.seq ?? -1;
    entry.receivedMs = this._now();
    this._push(this.receivedMs[entry.kind], entry.receivedMs - entry.sentMs);
    return null;
  }

  _applied(kind, event) {
    const now = this._now();
    // By seq when the server names it (an unknown seq is an input this page did not send, e.g.
    // the session's initial prompt, seq 0); by order only for servers that omit seq.
    const index =
      event.seq != null
        ? this._pending.findIndex((p) => p.seq === event.seq)
        : this._pending.findIndex((p) => p.kind === (event.mode === "cut" ? "cut" : kind));
    if (index < 0) return null;
    const entry = this._pending[index];
    // Drop the match and everything of the same input kind sent before it (superseded, never
    // applied; a later prompt supersedes earlier switches and cuts alike).
    const family = inputKind(entry.kind);
    this._pending = this._pending.filter((p, i) => i > index || (inputKind(p.kind) !== family && i !== index));
    const latencyMs = now - entry.sentMs;
    this._push(this.appliedMs[entry.kind], latencyMs);
    this.lastApplied = {
      kind: entry.kind,
      latencyMs,
      chunk: event.chunk,
      pts: event.pts,
      sentMs: entry.sentMs,
      appliedMs: now,
    };
    return { kind: entry.kind, latencyMs };
  }

  _push(list, value) {
    list.push(value);
    if (list.length > WINDOW) list.shift();
  }

  /** {kind: {received: median ms|null, applied: median ms|null, count}} over the last WINDOW acks. */
  summary() {
    return Object.fromEntries(
      KINDS.map((k) => [
        k,
        { received: median(this.receivedMs[k]), applied: median(this.appliedMs[k]), count: this.appliedMs[k].length },
      ]),
    );
  }

  get pendingCount() {
    return this._pending.length;
  }
}
