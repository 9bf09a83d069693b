/**
 * The on-stage keycaps (.keycap[data-key]): they light up while their key is held, press the
 * same action keys on touch screens, and show only the inputs the served model obeys.
 *
 * data-key is an action key name ("w", "shift", ...), an arrow ("up", ...), "drag" (the
 * mouse: display only) or "talk" (push-to-talk).
 */

export class Keycaps {
  /** `root`: the .keycaps container. */
  constructor(root) {
    this.root = root;
    this.caps = Array.from(root.querySelectorAll(".keycap"));
  }

  /** `press(name)` / `release(name)` run on pointer down / up over a cap ("drag" takes none). */
  bind({ press, release }) {
    for (const cap of this.caps) {
      const name = cap.dataset.key;
      if (name === "drag") continue;
      cap.addEventListener("pointerdown", (event) => {
        event.stopPropagation(); // not a drag on the stage
        cap.setPointerCapture(event.pointerId);
        press(name);
      });
      for (const type of ["pointerup", "pointercancel"]) cap.addEventListener(type, () => release(name));
    }
  }

  /** Light the caps of the held `keys` (and "drag" while dragging); "talk" is lit by setTalking. */
  showHeld(keys, dragging) {
    for (const cap of this.caps) {
      const name = cap.dataset.key;
      if (name === "talk") continue;
      cap.classList.toggle("held", name === "drag" ? dragging : keys.includes(name));
    }
    this.root.classList.toggle("active", keys.length > 0 || dragging);
  }

  setTalking(talking) {
    this.caps.find((cap) => cap.dataset.key === "talk")?.classList.toggle("held", talking);
  }

  /** Show only the caps whose data-key is in `names` (a Set). */
  showOnly(names) {
    for (const cap of this.caps) cap.hidden = !names.has(cap.dataset.key);
  }
}
