/**
 * Keyboard and mouse-drag actions (docs/api.md "Data channel `control`": {"type":"action","keys":[...],"mouse":[dx,dy]}).
 *
 * While any action key is held or the pointer is dragging on the stage, the current action is
 * sent every `periodMs` (default 50 ms = 20 Hz, above the 10 Hz the server latches per chunk);
 * a newly pressed key is sent at once, and one empty action ({"keys":[],"mouse":[0,0]}) follows
 * the release of the last key so the world stops. Keys are named by physical position
 * (KeyboardEvent.code), so WASD works on any layout; the names are the model's (w a s d q e
 * shift; arrows as up/left/down/right, which the server aliases to WASD).
 *
 * `mouse` is a drag *rate*: the pointer movement of the last `mouseWindowMs` in source-video
 * pixels (CSS pixels scaled by videoWidth / clientWidth). The server latches one action per
 * chunk (latest wins) and reads mouse as pixels per chunk, so the page sets the window to the
 * chunk duration (setMouseWindowMs) and a drag that stops moving decays to [0, 0] by itself.
 * Releasing the pointer clears the window at once.
 *
 * Keys typed into text fields, and keys with Ctrl/Alt/Meta held, are never actions. Losing focus
 * or visibility releases everything, so no key stays stuck.
 */

export const ACTION_KEYS = Object.freeze({
  KeyW: "w",
  KeyA: "a",
  KeyS: "s",
  KeyD: "d",
  KeyQ: "q",
  KeyE: "e",
  ShiftLeft: "shift",
  ShiftRight: "shift",
  ArrowUp: "up",
  ArrowLeft: "left",
  ArrowDown: "down",
  ArrowRight: "right",
});

/** True when the event target takes text input (keys there belong to the field). */
export function isTextTarget(target) {
  if (!target || !(target instanceof Element)) return false;
  if (target.isContentEditable) return true;
  const tag = target.tagName;
  if (tag === "TEXTAREA" || tag === "SELECT") return true;
  if (tag !== "INPUT") return false;
  return !["button", "checkbox", "radio", "submit", "reset"].includes(target.type);
}

export class ActionInput {
  /**
   * `send(message) -> boolean` delivers one action; `stage` receives drags; `video` scales them;
   * `onChange(keys, dragging)` lets the view highlight held keys.
   */
  constructor({ send, stage, video, onChange = () => {}, periodMs = 50, mouseWindowMs = 250, keyTarget = window }) {
    this._send = send;
    this._stage = stage;
    this._video = video;
    this._onChange = onChange;
    this._periodMs = periodMs;
    this._keyTarget = keyTarget;
    this._held = new Set();
    this._dragging = false;
    this._pointerId = null;
    this._moves = []; // [atMs, dx, dy] within the mouse window
    this._mouseWindowMs = mouseWindowMs;
    this._timer = null;
    this._wasActive = false;
    this.enabled = false;
    this.sentCount = 0;
    this._handlers = {
      keydown: (e) => this._keyDown(e),
      keyup: (e) => this._keyUp(e),
      blur: () => this.releaseAll(),
      visibilitychange: () => document.hidden && this.releaseAll(),
      pointerdown: (e) => this._pointerDown(e),
      pointermove: (e) => this._pointerMove(e),
      pointerup: (e) => this._pointerUp(e),
      pointercancel: (e) => this._pointerUp(e),
    };
  }

  start() {
    const h = this._handlers;
    this._keyTarget.addEventListener("keydown", h.keydown);
    this._keyTarget.addEventListener("keyup", h.keyup);
    window.addEventListener("blur", h.blur);
    document.addEventListener("visibilitychange", h.visibilitychange);
    for (const name of ["pointerdown", "pointermove", "pointerup", "pointercancel"])
      this._stage.addEventListener(name, h[name]);
    this._timer = setInterval(() => this._tick(), this._periodMs);
  }

  stop() {
    this.releaseAll();
    const h = this._handlers;
    this._keyTarget.removeEventListener("keydown", h.keydown);
    this._keyTarget.removeEventListener("keyup", h.keyup);
    window.removeEventListener("blur", h.blur);
    document.removeEventListener("visibilitychange", h.visibilitychange);
    for (const name of ["pointerdown", "pointermove", "pointerup", "pointercancel"])
      this._stage.removeEventListener(name, h[name]);
    clearInterval(this._timer);
    this._timer = null;
  }

  /** The drag window: how much recent movement one message reports (the chunk duration). */
  setMouseWindowMs(windowMs) {
    if (!(windowMs > 0)) throw new RangeError(`mouse window must be > 0 ms, got ${windowMs}`);
    this._mouseWindowMs = windowMs;
  }

  /** Keys currently held, in a stable order (no duplicates: both Shift keys are "shift"). */
  get keys() {
    return [...new Set(Object.values(ACTION_KEYS))].filter((k) => this._held.has(k));
  }

  get active() {
    return this._held.size > 0 || this._dragging;
  }

  /** Press or release a named action key from an on-screen control (same path as the keyboard). */
  setKey(name, down) {
    const had = this._held.has(name);
    if (down) this._held.add(name);
    else this._held.delete(name);
    if (had !== down) {
      this._onChange(this.keys, this._dragging);
      this._flush();
    }
  }

  releaseAll() {
    if (!this._held.size && !this._dragging) return;
    this._held.clear();
    this._dragging = false;
    this._moves = [];
    this._onChange(this.keys, false);
    this._flush();
  }

  _keyDown(event) {
    const name = ACTION_KEYS[event.code];
    if (!name || !this.enabled || isTextTarget(event.target) || event.ctrlKey || event.metaKey || event.altKey) return;
    event.preventDefault(); // arrows would scroll the page
    if (event.repeat || this._held.has(name)) return;
    this.setKey(name, true);
  }

  _keyUp(event) {
    const name = ACTION_KEYS[event.code];
    if (name && this._held.has(name)) this.setKey(name, false);
  }

  _pointerDown(event) {
    if (!this.enabled || event.button !== 0 || this._dragging) return;
    this._dragging = true;
    this._pointerId = event.pointerId;
    try {
      this._stage.setPointerCapture(event.pointerId);
    } catch {
      // A pointer that is no longer active cannot be captured; the drag still works inside the stage.
    }
    this._onChange(this.keys, true);
  }

  _pointerMove(event) {
    if (!this._dragging || event.pointerId !== this._pointerId) return;
    const scale =
      this._video.videoWidth && this._video.clientWidth ? this._video.videoWidth / this._video.clientWidth : 1;
    this._moves.push([performance.now(), event.movementX * scale, event.movementY * scale]);
  }

  _pointerUp(event) {
    if (!this._dragging || event.pointerId !== this._pointerId) return;
    this._dragging = false;
    this._moves = [];
    if (this._stage.hasPointerCapture?.(event.pointerId)) this._stage.releasePointerCapture(event.pointerId);
    this._onChange(this.keys, false);
    this._flush();
  }

  _tick() {
    if (this.active) this._flush();
  }

  /** Movement within the window, in source pixels, rounded to 0.01. */
  _mouseRate() {
    const since = performance.now() - this._mouseWindowMs;
    this._moves = this._moves.filter(([atMs]) => atMs >= since);
    const sum = [0, 0];
    for (const [, dx, dy] of this._moves) {
      sum[0] += dx;
      sum[1] += dy;
    }
    return sum.map((v) => Math.round(v * 100) / 100 || 0);
  }

  /** Send the current action now; the first idle message after activity is the release. */
  _flush() {
    if (!this.enabled) return;
    const active = this.active;
    if (!active && !this._wasActive) return;
    const message = { type: "action", keys: this.keys, mouse: this._mouseRate() };
    if (this._send(message)) {
      this.sentCount += 1;
      this._wasActive = active;
    }
  }
}
