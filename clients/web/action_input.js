/**
 * Keyboard and mouse-drag actions (API.md: {"type":"action","keys":[...],"mouse":[dx,dy]}).
 *
 * While any action key is held or the pointer is dragging on the stage, the current action is
 * sent every `periodMs` (default 50 ms = 20 Hz, above the 10 Hz the server latches per chunk);
 * a newly pressed key is sent at once, and one empty action ({"keys":[],"mouse":[0,0]}) follows
 * the release of the last key so the world stops. Keys are named by physical position
 * (KeyboardEvent.code), so WASD works on any layout. `mouse` is the drag since the previous
 * message in source-video pixels (CSS pixels scaled by videoWidth / clientWidth).
 *
 * Keys typed into text fields, and keys with Ctrl/Alt/Meta held, are never actions. Losing focus
 * or visibility releases everything, so no key stays stuck.
 */

export const ACTION_KEYS = Object.freeze({
  KeyW: "w",
  KeyA: "a",
  KeyS: "s",
  KeyD: "d",
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
  constructor({ send, stage, video, onChange = () => {}, periodMs = 50, keyTarget = window }) {
    this._send = send;
    this._stage = stage;
    this._video = video;
    this._onChange = onChange;
    this._periodMs = periodMs;
    this._keyTarget = keyTarget;
    this._held = new Set();
    this._dragging = false;
    this._pointerId = null;
    this._mouse = [0, 0];
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
    for (const name of ["pointerdown", "pointermove", "pointerup", "pointercancel"]) this._stage.addEventListener(name, h[name]);
    this._timer = setInterval(() => this._tick(), this._periodMs);
  }

  stop() {
    this.releaseAll();
    const h = this._handlers;
    this._keyTarget.removeEventListener("keydown", h.keydown);
    this._keyTarget.removeEventListener("keyup", h.keyup);
    window.removeEventListener("blur", h.blur);
    document.removeEventListener("visibilitychange", h.visibilitychange);
    for (const name of ["pointerdown", "pointermove", "pointerup", "pointercancel"]) this._stage.removeEventListener(name, h[name]);
    clearInterval(this._timer);
    this._timer = null;
  }

  /** Keys currently held, in a stable order. */
  get keys() {
    return Object.values(ACTION_KEYS).filter((k) => this._held.has(k));
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
    this._stage.setPointerCapture?.(event.pointerId);
    this._onChange(this.keys, true);
  }

  _pointerMove(event) {
    if (!this._dragging || event.pointerId !== this._pointerId) return;
    const scale = this._video.videoWidth && this._video.clientWidth ? this._video.videoWidth / this._video.clientWidth : 1;
    this._mouse[0] += event.movementX * scale;
    this._mouse[1] += event.movementY * scale;
  }

  _pointerUp(event) {
    if (!this._dragging || event.pointerId !== this._pointerId) return;
    this._dragging = false;
    this._stage.releasePointerCapture?.(event.pointerId);
    this._onChange(this.keys, false);
    this._flush();
  }

  _tick() {
    if (this.active || this._mouse[0] || this._mouse[1]) this._flush();
  }

  /** Send the current action now; the first idle message after activity is the release. */
  _flush() {
    if (!this.enabled) return;
    const active = this.active;
    if (!active && !this._wasActive && !this._mouse[0] && !this._mouse[1]) return;
    const mouse = this._mouse.map((v) => Math.round(v * 100) / 100);
    const message = { type: "action", keys: this.keys, mouse };
    if (this._send(message)) {
      this.sentCount += 1;
      this._mouse = [0, 0];
      this._wasActive = active;
    }
  }
}
