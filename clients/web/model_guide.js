/**
 * The served model's guide: its example prompts as one-click chips and its controls legend,
 * read from the card GET /v1/models serves ({id, served, examples, controls}).
 *
 * A control is {kind: "key" | "mouse" | "audio", inputs: [names], does: text}; key names are
 * the ones the action message takes ("w", "shift", ...), "drag" is the mouse and "talk" the
 * microphone. The on-stage keycaps show only what the card obeys: an arrow is shown with its
 * WASD key (the server aliases them), Q/E/drag/talk only when a control names them.
 */

/** Key name -> label on a <kbd>. */
const KEY_LABELS = {
  w: "W", a: "A", s: "S", d: "D", q: "Q", e: "E", space: "Space", shift: "Shift", drag: "drag", talk: "Space",
};
/** Arrow keycaps (data-key) -> the WASD key they alias. */
const ARROW_OF = { up: "w", left: "a", down: "s", right: "d" };

/** The card this server serves: the one named `modelId` (GET /healthz), else the first served. */
export function pickServedCard(cards, modelId = "") {
  if (!Array.isArray(cards)) return null;
  return cards.find((c) => c.id === modelId) ?? cards.find((c) => c.served) ?? null;
}

/** The keycap names (data-key of .keycap) the card's controls use. */
export function keycapsFor(controls) {
  const caps = new Set();
  for (const control of controls ?? []) {
    if (control.kind === "mouse") caps.add("drag");
    else if (control.kind === "audio") caps.add("talk");
    else for (const key of control.inputs) caps.add(key);
  }
  for (const [arrow, key] of Object.entries(ARROW_OF)) if (caps.has(key)) caps.add(arrow);
  return caps;
}

/**
 * The decoders a session of `card` may pick ({decoders, default_decoder} of GET /v1/models):
 * {options, selected}; `wanted` (e.g. ?decoder=tiny) wins when the card has it. No options when
 * the card has fewer than two (nothing to pick).
 */
export function decoderChoices(card, wanted = "") {
  const options = Array.isArray(card?.decoders) ? card.decoders : [];
  if (options.length < 2) return { options: [], selected: options[0] ?? "" };
  const selected = options.includes(wanted) ? wanted : card.default_decoder ?? options[0];
  return { options, selected };
}

/** The session line of the top bar: "832×480 @ 16 fps · tiny decoder" (POST /v1/sessions). */
export function describeSession(info) {
  const p = info?.profile;
  if (!p) return "";
  const decoder = info.decoder ? ` · ${info.decoder} decoder` : "";
  return `${p.width}×${p.height} @ ${p.fps} fps${decoder}`;
}

/** One line per control, e.g. "W A S D — move the sprite" (the stage's aria label). */
export function describeControl(control) {
  const keys = control.inputs.map((name) => KEY_LABELS[name] ?? name);
  const how = control.kind === "audio" ? `hold ${keys.join(" ")}` : keys.join(" ");
  return `${how} — ${control.does}`;
}

export class ModelGuide {
  /**
   * `chips`: container for the example buttons; `legend`: list for the controls; `onPick(text)`
   * is called when a chip is clicked.
   */
  constructor({ chips, legend, onPick }) {
    this.chips = chips;
    this.legend = legend;
    this.onPick = onPick;
    this.card = null;
  }

  /**
   * Fetch the served card (GET /healthz names it, GET /v1/models describes it) and show it: the
   * chips and legend, the first example as the prompt box's placeholder, only the keycaps the
   * card obeys, and its controls in the stage's aria label. Resolves with the card (null when
   * the server names none); rejects with the ApiError of a failed call (the page keeps its
   * defaults then).
   */
  async load(api, { prompt, stage, keycaps }) {
    const [health, cards] = await Promise.all([api.health(), api.models()]);
    const card = pickServedCard(cards, health?.model);
    if (!card) return null;
    this.render(card);
    if (this.firstExample) prompt.placeholder = `Describe a world… e.g. ${this.firstExample}`;
    keycaps.showOnly(keycapsFor(card.controls));
    const legend = (card.controls ?? []).map(describeControl).join("; ");
    stage.setAttribute("aria-label", `Generated video. ${legend || "This model takes prompts only."}`);
    return card;
  }

  /** The default prompt: the card's first example ("" before a card is shown). */
  get firstExample() {
    return this.card?.examples?.[0] ?? "";
  }

  /** Show `card`'s examples and controls (a card without any leaves that part as it was). */
  render(card) {
    this.card = card;
    const examples = card.examples ?? [];
    if (examples.length) {
      this.chips.replaceChildren(
        ...examples.map((text) => {
          const chip = document.createElement("button");
          chip.type = "button";
          chip.className = "chip";
          chip.textContent = text;
          chip.addEventListener("click", () => this.onPick(text));
          return chip;
        }),
      );
      this.chips.hidden = false;
    }
    const controls = card.controls ?? [];
    if (controls.length || examples.length) {
      this.legend.replaceChildren(...controls.map((control) => this._legendItem(control)));
      if (!controls.length) this.legend.append(this._note(`${card.id} takes prompts only.`));
    }
  }

  _legendItem(control) {
    const item = document.createElement("li");
    item.dataset.kind = control.kind;
    if (control.kind === "audio") item.append("hold ");
    for (const name of control.inputs) {
      const kbd = document.createElement("kbd");
      kbd.textContent = KEY_LABELS[name] ?? name;
      item.append(kbd);
    }
    if (control.kind === "key" && control.inputs.some((k) => Object.values(ARROW_OF).includes(k)))
      item.append(" / arrows");
    item.append(` — ${control.does}`);
    return item;
  }

  _note(text) {
    const item = document.createElement("li");
    item.className = "fine";
    item.textContent = text;
    return item;
  }
}
