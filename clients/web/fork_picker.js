/**
 * Fork picker: ask the session for N candidate continuations (POST /fork), watch them live,
 * choose one (POST /choose: the chosen candidate's stream becomes this session's continuation,
 * the others close, the server commits one preference pair per rejected candidate).
 *
 * The candidates are real sessions generated from this moment; they are laid out side by side,
 * one tile each, and every tile plays its candidate live in a small video with its own peer,
 * all opened at once through `openPreview(id, video, token)` (the candidate's own token from
 * the fork answer), which returns {close()} or throws (then the tile says so; choosing still
 * works). A tile shows its video as soon as it plays (`data-playing`), without waiting for the
 * others, and the status counts the candidates playing. The parent waits, paused, until the
 * choice; afterwards it streams on from the chosen candidate and `onChosen(id)` tells the page.
 */

export class ForkPicker {
  constructor(root, { getSession, openPreview, onChosen = () => {}, log = () => {} }) {
    this._root = root;
    this._getSession = getSession;
    this._openPreview = openPreview;
    this._onChosen = onChosen;
    this._log = log;
    this._form = root.querySelector("form");
    this._count = root.querySelector("[name=fork-n]");
    this._prompt = root.querySelector("[name=fork-prompt]");
    this._submit = root.querySelector("button[type=submit]");
    this._list = root.querySelector(".fork-candidates");
    this._status = root.querySelector(".fork-status");
    this._previews = new Map();
    this._form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.fork();
    });
  }

  setEnabled(enabled) {
    this._submit.disabled = !enabled;
  }

  _say(text, tone = "") {
    this._status.textContent = text;
    this._status.dataset.tone = tone;
  }

  async fork() {
    const session = this._getSession();
    if (!session) return;
    const n = Number.parseInt(this._count.value, 10);
    this.reset();
    this._submit.disabled = true;
    this._say(`asking for ${n} candidates…`);
    try {
      const answer = await session.fork(n, this._prompt.value.trim());
      const candidates = Array.isArray(answer?.candidates) ? answer.candidates : [];
      const tokens = new Map((answer?.sessions ?? []).map((s) => [s.id, s.token]));
      this._log("fork", { n, candidates: candidates.length, at_chunk: answer?.at_chunk });
      this._say(
        candidates.length ? `starting ${candidates.length} candidates…` : "the server returned no candidates",
        candidates.length ? "" : "bad",
      );
      const rows = candidates.map((id, index) => this._row(id, index, tokens.get(id)));
      for (const row of rows) this._list.append(row.item);
      this._list.querySelector("button")?.focus();
      await Promise.all(rows.map((row) => this._togglePreview(row.id, row.video, row.watch, row.token)));
    } catch (err) {
      this._say(`fork failed: ${err.message}`, "bad");
    } finally {
      this._submit.disabled = false;
    }
  }

  _row(id, index, token) {
    const item = document.createElement("li");
    item.className = "fork-candidate";
    item.dataset.candidate = id;
    item.dataset.playing = "false";
    const label = document.createElement("span");
    label.className = "fork-label";
    label.textContent = `#${index + 1}`;
    label.title = id;
    const ident = document.createElement("code");
    ident.textContent = id.length > 10 ? `${id.slice(0, 8)}…` : id;
    const video = document.createElement("video");
    video.muted = true;
    video.autoplay = true;
    video.playsInline = true;
    video.setAttribute("aria-label", `preview of candidate ${index + 1}`);
    video.addEventListener("playing", () => this._playing(item), { once: true });
    const watch = document.createElement("button");
    watch.type = "button";
    watch.className = "ghost small";
    watch.textContent = "Watch";
    watch.setAttribute("aria-pressed", "false");
    watch.addEventListener("click", () => this._togglePreview(id, video, watch, token));
    const choose = document.createElement("button");
    choose.type = "button";
    choose.className = "primary small";
    choose.textContent = "Choose";
    choose.addEventListener("click", () => this._choose(id, choose));
    const meta = document.createElement("div");
    meta.className = "fork-meta";
    meta.append(label, ident, watch, choose);
    item.append(video, meta);
    return { item, id, video, watch, token };
  }

  /** A candidate's first frame played: its tile shows it at once, the status counts it. */
  _playing(item) {
    if (!item.isConnected || item.dataset.playing === "true") return;
    item.dataset.playing = "true";
    const tiles = [...this._list.children];
    const playing = tiles.filter((tile) => tile.dataset.playing === "true").length;
    if (this._status.dataset.tone === "good") return; // already chosen
    this._say(`${playing} of ${tiles.length} candidates playing: choose one`);
  }

  async _togglePreview(id, video, button, token) {
    const open = this._previews.get(id);
    if (open) {
      open.close();
      this._previews.delete(id);
      video.hidden = true;
      button.textContent = "Watch";
      button.setAttribute("aria-pressed", "false");
      return;
    }
    button.disabled = true;
    try {
      this._previews.set(id, await this._openPreview(id, video, token));
      video.hidden = false;
      button.textContent = "Hide";
      button.setAttribute("aria-pressed", "true");
    } catch (err) {
      button.textContent = "Not streamed";
      button.title = `No preview: ${err.message}`;
      this._log("fork.preview_failed", { candidate: id, message: err.message });
      return;
    } finally {
      button.disabled = false;
    }
  }

  async _choose(id, button) {
    const session = this._getSession();
    if (!session) return;
    for (const b of this._list.querySelectorAll("button")) b.disabled = true;
    try {
      await session.choose(id);
      this._log("fork.chosen", { candidate: id });
      for (const row of this._list.children) row.classList.toggle("chosen", row.dataset.candidate === id);
      this._say("chosen: the session goes on from it", "good");
      this._closePreviews();
      button.textContent = "Chosen";
      this._onChosen(id);
    } catch (err) {
      this._say(`choose failed: ${err.message}`, "bad");
      for (const b of this._list.querySelectorAll("button")) b.disabled = false;
    }
  }

  _closePreviews() {
    for (const preview of this._previews.values()) preview.close();
    this._previews.clear();
    for (const video of this._list.querySelectorAll("video")) {
      video.srcObject = null;
      video.hidden = true;
    }
  }

  reset() {
    this._closePreviews();
    this._list.replaceChildren();
    this._say("");
  }
}
