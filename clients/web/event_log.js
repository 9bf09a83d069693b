/**
 * The event log view: the data channel's server events (and a few page notes), newest last.
 *
 * Every event is kept in `events` (bounded, for tests and debugging: window.dreamrt.events);
 * the DOM shows at most `maxRows`. High-rate events (media.chunk, pong, input.received,
 * input.superseded and input.shown, which the latency bar shows) are counted but shown only
 * when "verbose" is on, so the log stays readable at 20 Hz input.
 */

const QUIET_TYPES = new Set(["media.chunk", "pong", "input.received", "input.superseded", "input.shown"]);
const MAX_EVENTS = 5000;

function tone(type) {
  if (type === "error" || type.endsWith(".failed") || type === "page.error") return "bad";
  if (type.endsWith(".applied")) return "good";
  if (type.startsWith("session.") || type.startsWith("page.")) return "info";
  return "";
}

function summarize(event) {
  const { type, event_id: _id, time_s: _time, ...rest } = event;
  const text = JSON.stringify(rest);
  return text === "{}" ? "" : text.slice(1, -1).replaceAll('"', "").replaceAll(",", ", ").replaceAll(":", ": ");
}

export class EventLog {
  constructor(list, { maxRows = 200, verboseToggle = null, countLabel = null } = {}) {
    this._list = list;
    this._maxRows = maxRows;
    this._countLabel = countLabel;
    this.events = [];
    this.counts = new Map();
    this.verbose = Boolean(verboseToggle?.checked);
    verboseToggle?.addEventListener("change", () => {
      this.verbose = verboseToggle.checked;
    });
  }

  /** Record one event ({type, ...}); `direction` is "in" (server) or "note" (the page itself). */
  add(event, direction = "in") {
    const atMs = performance.now();
    this.events.push({ ...event, _atMs: atMs, _direction: direction });
    if (this.events.length > MAX_EVENTS) this.events.splice(0, this.events.length - MAX_EVENTS);
    this.counts.set(event.type, (this.counts.get(event.type) || 0) + 1);
    if (this._countLabel) this._countLabel.textContent = String(this.events.length);
    if (QUIET_TYPES.has(event.type) && !this.verbose) return;
    this._render(event, direction);
  }

  /** A page-side note (connection steps, errors) shown in the same log. */
  note(type, fields = {}) {
    this.add({ type: `page.${type}`, ...fields }, "note");
  }

  has(type) {
    return this.counts.has(type);
  }

  _render(event, direction) {
    const row = document.createElement("li");
    row.className = `log-row ${tone(event.type)} ${direction}`;
    const time = document.createElement("time");
    time.textContent = new Date().toLocaleTimeString([], { hour12: false });
    const type = document.createElement("span");
    type.className = "log-type";
    type.textContent = event.type;
    const body = document.createElement("span");
    body.className = "log-body";
    body.textContent = summarize(event);
    row.append(time, type, body);
    const stick = this._list.scrollTop + this._list.clientHeight >= this._list.scrollHeight - 8;
    this._list.append(row);
    while (this._list.childElementCount > this._maxRows) this._list.firstElementChild.remove();
    if (stick) this._list.scrollTop = this._list.scrollHeight;
  }

  clear() {
    this._list.replaceChildren();
  }
}
