/**
 * Composition root of the dreamrt page: wires the DOM to a LiveSession, the inputs (prompt,
 * actions, push-to-talk, ratings, fork picker) and the views (state, stats, event log).
 *
 * window.dreamrt exposes the running app for tests and benchmarks: {state, session, pc, events,
 * frames (FrameClock), log (EventLog), guide (ModelGuide: the served card), start(prompt)}.
 * Performance marks "dreamrt.start", "dreamrt.connected" (control channel open) and
 * "dreamrt.first_frame" time the start-up. The prompt box offers the served card's examples; an
 * empty Start uses the first one.
 */

import { ActionInput } from "./action_input.js";
import { ApiClient } from "./api.js";
import { ConfigError, readConfig } from "./config.js";
import { EventLog } from "./event_log.js";
import { ForkPicker } from "./fork_picker.js";
import { FrameClock } from "./frame_clock.js";
import { LiveSession } from "./live_session.js";
import { Keycaps } from "./keycaps.js";
import { ModelGuide, decoderChoices, describeSession } from "./model_guide.js";
import { HttpPcmTransport, PushToTalk, TrackTransport } from "./microphone.js";
import { PageState, PageStateMachine } from "./page_state.js";
import { bindSettingsForm, bindShortcuts } from "./page_keys.js";
import { StatsView } from "./stats_view.js";
import { LatencyBar } from "./latency_bar.js";

const $ = (id) => document.getElementById(id);

const OVERLAY = {
  [PageState.IDLE]: { title: "Describe a world and press Start", action: null },
  [PageState.CONNECTING]: { title: "Connecting…", action: null },
  [PageState.LIVE]: { title: "", action: null },
  [PageState.PAUSED]: { title: "Paused", action: "Resume" },
  [PageState.ERROR]: { title: "Something went wrong", action: "Try again" },
  [PageState.CLOSED]: { title: "Session ended", action: "Start again" },
};

/** Server session states (docs/api.md "Events", `session.state`) -> page states; others leave the page state alone. */
const SERVER_STATE = {
  live: PageState.LIVE,
  paused: PageState.PAUSED,
  closed: PageState.CLOSED,
  failed: PageState.ERROR,
};

class App {
  constructor(config) {
    this.config = config;
    this.api = new ApiClient({ baseUrl: config.apiBase, apiKey: config.apiKey });
    this.machine = new PageStateMachine();
    this.session = null;
    this.talk = null;
    this.firstFrameSeen = false;
    this.video = $("video");
    this.stage = $("stage");
    this.prompt = $("prompt");
    this.frames = new FrameClock(this.video);
    this.keycaps = new Keycaps(document.querySelector(".keycaps"));
    this.stats = new StatsView();
    this.latencyBar = new LatencyBar($("latency-bar"), $("latency-caption"));
    this.log = new EventLog($("event-log"), { verboseToggle: $("log-verbose"), countLabel: $("event-count") });
    this.actions = new ActionInput({
      send: (message) => this.session?.action(message) ?? false,
      stage: this.stage,
      video: this.video,
      onChange: (keys, dragging) => this.keycaps.showHeld(keys, dragging),
    });
    this.fork = new ForkPicker($("fork"), {
      getSession: () => this.session?.rest ?? null,
      openPreview: (id, video, token) => this._openPreview(id, video, token),
      log: (type, fields) => this.log.note(type, fields),
    });
    this.guide = new ModelGuide({ chips: $("examples"), legend: $("controls-legend"), onPick: (t) => this._pick(t) });
    this.machine.subscribe((next, previous, detail) => this._renderState(next, previous, detail));
  }

  // ---- lifecycle -----------------------------------------------------------------------------

  init() {
    this._bindComposer();
    this._bindControls();
    bindShortcuts({
      talk: () => this.talk,
      spaceOwners: () => [document.body, this.stage, this.video, document.documentElement],
      focusPrompt: () => this.prompt.focus(),
      togglePause: () => this._togglePause(),
    });
    this._bindKeycaps();
    bindSettingsForm(this.config, this.api);
    this.actions.start();
    this.frames.start();
    window.addEventListener("pagehide", () => this.session?.close({ keepalive: true }));
    this.prompt.value = this.config.prompt;
    this._renderState(PageState.IDLE, PageState.IDLE, "");
    this.guide
      .load(this.api, { prompt: this.prompt, stage: this.stage, keycaps: this.keycaps })
      .then((card) => this._showDecoders(card))
      .catch((err) => this.log.note("card_unavailable", { message: err.message }));
    if (this.config.autostart && this.prompt.value.trim()) this.start(this.prompt.value.trim());
  }

  async start(promptText) {
    await this._teardown();
    this.machine.transition(PageState.CONNECTING, "creating session");
    performance.mark("dreamrt.start");
    this.firstFrameSeen = false;
    this.frames.reset();
    this.stats.clear();
    this.latencyBar.clear();
    this.fork.reset();
    this.log.note("connecting", { prompt: promptText });
    const session = new LiveSession(this.api, {
      iceServers: this.config.iceServers,
      offerAudio: this.config.audioTransport !== "http",
      onEvent: (event) => this._onEvent(session, event),
      onTrack: (stream) => this._onTrack(session, stream),
      onStats: (sample) => session === this.session && this.stats.render(sample),
      onConnectionLost: (why) => this._onConnectionLost(session, why),
    });
    this.session = session;
    const phase = setTimeout(() => {
      if (session === this.session && this.machine.state === PageState.CONNECTING)
        this.machine.transition(PageState.CONNECTING, "negotiating WebRTC");
    }, 150);
    try {
      // "now": the prompt encode and the first chunk run while WebRTC negotiates
      await session.open({ prompt: promptText, start: "now", ...this._decoderChoice() });
      performance.mark("dreamrt.connected");
    } catch (err) {
      if (session !== this.session) return; // superseded by a newer start() or end()
      this.session = null;
      this._fail(
        err.status === 503
          ? `server busy${err.retryAfterS ? `, retry in ${err.retryAfterS} s` : ""}: ${err.message}`
          : err.message,
      );
      return;
    } finally {
      clearTimeout(phase);
    }
    if (session !== this.session) return;
    $("session-id").textContent = session.id;
    $("session-profile").textContent = describeSession(session.info);
    this.stats.setProfile(session.info.profile);
    this.log.note("connected", { session: session.id, audio: session.audioSender ? "track" : "http" });
    this._setupTalk(session);
    if (this.machine.state === PageState.CONNECTING)
      this.machine.transition(PageState.CONNECTING, "waiting for the first frame");
    this._setControlsEnabled(true);
  }

  /** The decoder picker: shown only when the served card has more than one decoder. */
  _showDecoders(card) {
    const { options, selected } = decoderChoices(card, this.config.decoder);
    const select = $("decoder");
    select.replaceChildren(
      ...options.map((name) => {
        const option = document.createElement("option");
        option.value = name;
        option.textContent = name === "tiny" ? "tiny (faster)" : "full VAE";
        option.selected = name === selected;
        return option;
      }),
    );
    $("decoder-pick").hidden = options.length === 0;
  }

  /** {decoder} for POST /v1/sessions: the picker's, else ?decoder=, else none (the model's). */
  _decoderChoice() {
    const pick = $("decoder-pick").hidden ? "" : $("decoder").value;
    const decoder = pick || this.config.decoder;
    return decoder ? { decoder } : {};
  }

  async end() {
    await this._teardown();
    if (this.machine.can(PageState.CLOSED)) this.machine.transition(PageState.CLOSED, "");
  }

  async _teardown() {
    const session = this.session;
    this.session = null;
    this.actions.enabled = false;
    this.actions.releaseAll();
    this._setControlsEnabled(false);
    this.fork.reset();
    await this.talk?.close();
    this.talk = null;
    if (session) await session.close();
    this.video.srcObject = null;
  }

  _fail(message) {
    this.log.note("error", { message });
    this.actions.enabled = false;
    this.actions.releaseAll();
    this._setControlsEnabled(false);
    this.talk?.close();
    this.talk = null;
    this.session?.close();
    this.session = null;
    if (this.machine.can(PageState.ERROR)) this.machine.transition(PageState.ERROR, message);
  }

  // ---- session callbacks -----------------------------------------------------------------------

  _onTrack(session, stream) {
    if (session !== this.session) return;
    this.video.srcObject = stream;
    this.video.play().catch(() => {});
    this.frames
      .waitFor(() => true, { includePast: true, timeoutMs: 30000 })
      .then(
        () => {
          if (session !== this.session || this.firstFrameSeen) return;
          this.firstFrameSeen = true;
          performance.mark("dreamrt.first_frame");
          this.log.note("first_frame", { ms: Math.round(this.frames.firstFrameMs) });
          if (this.machine.state === PageState.CONNECTING) this._goLive();
        },
        () => session === this.session && this._fail("no video frame arrived within 30 s"),
      );
  }

  _goLive() {
    this.machine.transition(PageState.LIVE, "");
    this.actions.enabled = true;
  }

  _onEvent(session, event) {
    if (session !== this.session) return;
    this.log.add(event);
    if (event.type === "session.state" && SERVER_STATE[event.state]) {
      const next = SERVER_STATE[event.state];
      if (next === PageState.LIVE && !this.firstFrameSeen) return; // live once frames show
      if (next === PageState.ERROR) this._fail(event.message || event.reason || "the session failed");
      else if (next === PageState.CLOSED)
        this._teardown().then(
          () => this.machine.can(PageState.CLOSED) && this.machine.transition(PageState.CLOSED, event.reason || ""),
        );
      else if (this.machine.can(next)) {
        this.machine.transition(next, "");
        this.actions.enabled = next === PageState.LIVE;
      }
    } else if (event.type === "media.chunk" && event.frames > 0 && event.fps > 0) {
      this.actions.setMouseWindowMs((1000 * event.frames) / event.fps);
    } else if (event.type === "input.shown") {
      this.latencyBar.show(event); // the last input's wait / generate / send
    } else if (event.type === "error") {
      this._toast(`${event.code ?? "error"}: ${event.message ?? ""}`);
    }
    const applied = session.acks.lastApplied;
    if (event.type.endsWith(".applied") && applied) this.stats.showApplied(applied.kind, applied.latencyMs);
  }

  _onConnectionLost(session, why) {
    if (session !== this.session) return;
    this._fail(`connection lost (${why})`);
  }

  _toast(text) {
    const detail = $("state-detail");
    detail.textContent = text;
    clearTimeout(this._toastTimer);
    this._toastTimer = setTimeout(() => {
      detail.textContent = this.machine.detail;
    }, 4000);
  }

  // ---- push-to-talk ------------------------------------------------------------------------------

  _setupTalk(session) {
    let transport = null;
    if (session.audioSender) transport = new TrackTransport(session.audioSender);
    else if (this.config.audioTransport !== "track") {
      transport = new HttpPcmTransport((bytes) => session.rest.audio(bytes), {
        onError: (err) => this.log.note("audio_error", { message: err.message }),
      });
    }
    $("talk-transport").textContent = transport
      ? `Audio goes ${transport.name === "track" ? "as a WebRTC track" : "as PCM over HTTP"}.`
      : "The server takes no audio track.";
    if (!transport) return;
    this.talk = new PushToTalk(transport, {
      onLevel: (level) => {
        $("talk-level-bar").style.width = `${Math.round(level * 100)}%`;
      },
      onStateChange: (talking, err) => {
        $("talk").setAttribute("aria-pressed", String(talking));
        this.keycaps.setTalking(talking);
        if (err) this.log.note("microphone_error", { message: err.message });
        if (talking) this.log.note("talk", { transport: transport.name });
      },
    });
  }

  // ---- DOM bindings ------------------------------------------------------------------------------

  _bindComposer() {
    const form = $("prompt-form");
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this._submitPrompt("switch");
    });
    $("prompt-cut").addEventListener("click", () => this._submitPrompt("cut"));
    this.prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this._submitPrompt(event.ctrlKey || event.metaKey ? "cut" : "switch");
      } else if (event.key === "Escape") {
        this.stage.focus();
      }
    });
  }

  _submitPrompt(mode) {
    const live = this.session && [PageState.LIVE, PageState.PAUSED, PageState.CONNECTING].includes(this.machine.state);
    if (!this.prompt.value.trim() && !live) this.prompt.value = this.guide.firstExample; // empty Start
    const text = this.prompt.value.trim();
    if (!text) {
      this.prompt.focus();
      return;
    }
    if (!live) {
      this.start(text);
      return;
    }
    if (this.session.prompt(text, mode))
      this.log.note("prompt_sent", { mode, text: text.length > 60 ? `${text.slice(0, 57)}…` : text });
    else this._toast("prompt not sent: the control channel is not open");
  }

  /** A chip fills the prompt box; while a session is live or paused it is sent at once. */
  _pick(text) {
    this.prompt.value = text;
    if (this.session && [PageState.LIVE, PageState.PAUSED].includes(this.machine.state)) this._submitPrompt("switch");
    else this.prompt.focus();
  }

  _bindControls() {
    $("end-session").addEventListener("click", () => this.end());
    $("overlay-action").addEventListener("click", () => {
      if (this.machine.state === PageState.PAUSED) this.session?.resume();
      else {
        const text = this.prompt.value.trim() || this.guide.firstExample;
        if (text) this.start(text);
        else this.prompt.focus();
      }
    });
    $("pause").addEventListener("click", () => this._togglePause());
    for (const [id, rating] of [
      ["rate-up", 1],
      ["rate-down", -1],
    ]) {
      $(id).addEventListener("click", () => this._rate(rating, $(id)));
    }
    const talk = $("talk");
    talk.addEventListener("pointerdown", (event) => {
      if (event.button === 0) {
        talk.setPointerCapture(event.pointerId);
        this.talk?.press();
      }
    });
    for (const name of ["pointerup", "pointercancel", "lostpointercapture"])
      talk.addEventListener(name, () => this.talk?.release());
    talk.addEventListener("keydown", (event) => {
      if ((event.key === "Enter" || event.key === " ") && !event.repeat) {
        event.preventDefault();
        this.talk?.press();
      }
    });
    talk.addEventListener("keyup", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        this.talk?.release();
      }
    });
  }

  _rate(rating, button) {
    if (!this.session?.rate(rating)) {
      this._toast("rating not sent: the control channel is not open");
      return;
    }
    for (const b of document.querySelectorAll(".rate")) b.classList.remove("sent");
    button.classList.add("sent");
    $("rate-status").textContent = rating > 0 ? "Rated up — thanks." : "Rated down — thanks.";
    this.log.note("feedback_sent", { rating });
  }

  _togglePause() {
    if (!this.session) return;
    if (this.machine.state === PageState.PAUSED) this.session.resume();
    else if (this.machine.state === PageState.LIVE) this.session.pause();
  }

  /** On-screen keycaps press the same action keys (they take pointers only on touch screens). */
  _bindKeycaps() {
    this.keycaps.bind({
      press: (name) => (name === "talk" ? this.talk?.press() : this.actions.enabled && this.actions.setKey(name, true)),
      release: (name) => (name === "talk" ? this.talk?.release() : this.actions.setKey(name, false)),
    });
  }

  /** A candidate's live preview: its own receive-only peer, with the candidate's own token. */
  async _openPreview(id, video, candidateToken) {
    const token = candidateToken ?? this.session?.info?.token;
    const preview = new LiveSession(this.api, {
      iceServers: this.config.iceServers,
      offerAudio: false,
      onTrack: (stream) => {
        video.srcObject = stream;
        video.play().catch(() => {});
      },
    });
    await preview.adopt({ id, token });
    return { close: () => preview.close({ deleteSession: false }) };
  }

  // ---- views ---------------------------------------------------------------------------------------

  _setControlsEnabled(enabled) {
    for (const id of ["talk", "rate-up", "rate-down", "pause", "prompt-cut", "end-session"]) $(id).disabled = !enabled;
    if (!enabled) $("talk").disabled = true;
    else $("talk").disabled = !this.talk;
    this.fork.setEnabled(enabled);
  }

  _renderState(state, previous, detail) {
    document.body.dataset.state = state;
    $("state-label").textContent = state;
    $("state-detail").textContent = detail;
    const overlay = OVERLAY[state];
    $("overlay").setAttribute("aria-hidden", String(state === PageState.LIVE));
    $("overlay-title").textContent = state === PageState.ERROR ? "Could not stream" : overlay.title;
    $("overlay-message").textContent = state === PageState.PAUSED ? "Press P or Resume to continue." : detail;
    const action = $("overlay-action");
    action.hidden = !overlay.action;
    action.textContent = overlay.action || "";
    const active = [PageState.LIVE, PageState.PAUSED, PageState.CONNECTING].includes(state);
    $("prompt-submit").textContent = active ? "Switch" : "Start";
    $("pause").textContent = state === PageState.PAUSED ? "Resume" : "Pause";
    if (state === PageState.LIVE && previous === PageState.CONNECTING && document.activeElement !== this.prompt)
      this.stage.focus();
  }
}

function boot() {
  let config;
  try {
    config = readConfig();
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    document.body.dataset.state = "error";
    $("state-label").textContent = "error";
    $("overlay-title").textContent = "Bad page configuration";
    $("overlay-message").textContent = err.message;
    return;
  }
  const app = new App(config);
  window.dreamrt = {
    app,
    get state() {
      return app.machine.state;
    },
    get session() {
      return app.session;
    },
    get pc() {
      return app.session?.pc ?? null;
    },
    get events() {
      return app.log.events;
    },
    frames: app.frames,
    log: app.log,
    guide: app.guide,
    start: (prompt) => app.start(prompt),
  };
  app.init();
}

boot();
