/**
 * The breakdown of the last input, as a small bar beside the live stats.
 *
 * `input.shown` (docs/api.md "Events") carries the server's stages of one input in seconds after it
 * was received: latched, started, generated, decoded, enqueued, sent. The bar shows three
 * segments, in proportion:
 *
 *   wait      received -> started   (the plan in flight, a chunk boundary, the queue)
 *   generate  started  -> decoded   (text encode / re-cache, the denoising steps, the decode)
 *   send      decoded  -> sent      (media queue and pacing until the frame went on the wire)
 *
 * An input without runtime stages (a repeated key, audio) has no wait/generate split: its
 * whole time until enqueued counts as generate. `breakdown(event)` is pure (tested on its own).
 */

export const SEGMENTS = ["wait", "generate", "send"];

/** {kind, totalMs, wait, generate, send} in milliseconds, or null if the event has no sent. */
export function breakdown(event) {
  const l = event?.latency;
  if (!l || l.sent_s == null) return null;
  const ms = (s) => (s == null ? null : 1000 * s);
  const sent = ms(l.sent_s);
  const started = ms(l.started_s) ?? 0;
  const ready = ms(l.decoded_s) ?? ms(l.enqueued_s) ?? sent;
  const wait = Math.max(0, Math.min(started, sent));
  const generate = Math.max(0, Math.min(ready, sent) - wait);
  return { kind: event.kind, totalMs: sent, wait, generate, send: Math.max(0, sent - wait - generate) };
}

function label(value) {
  return value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`;
}

export class LatencyBar {
  /** `root`: the bar element (three child spans with data-segment), `caption`: its text. */
  constructor(root, caption) {
    this.root = root;
    this.caption = caption;
    this.last = null;
  }

  /** Show `input.shown`'s breakdown; returns it (null: nothing to show). */
  show(event) {
    const parts = breakdown(event);
    if (!parts) return null;
    this.last = parts;
    const total = Math.max(parts.totalMs, 1e-6);
    for (const name of SEGMENTS) {
      const span = this.root.querySelector(`[data-segment="${name}"]`);
      span.style.flexGrow = String(parts[name] / total);
      span.title = `${name} ${label(parts[name])}`;
      span.textContent = parts[name] / total >= 0.18 ? label(parts[name]) : "";
    }
    this.root.hidden = false;
    this.caption.textContent =
      `last ${parts.kind}: ${label(parts.totalMs)} to the wire — ` +
      SEGMENTS.map((name) => `${name} ${label(parts[name])}`).join(", ");
    return parts;
  }

  clear() {
    this.last = null;
    this.root.hidden = true;
    this.caption.textContent = "last input: –";
  }
}
