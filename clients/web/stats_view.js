/** Renders LiveSession stats samples into the stats card and the stage HUD. */

function ms(value) {
  if (value == null) return "–";
  return value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`;
}

export class StatsView {
  constructor(doc = document) {
    const $ = (id) => doc.getElementById(id);
    this.el = {
      fps: $("stat-fps"),
      target: $("stat-target"),
      frames: $("stat-frames"),
      stalls: $("stat-stalls"),
      promptLatency: $("stat-prompt-latency"),
      actionLatency: $("stat-action-latency"),
      rtt: $("stat-rtt"),
      bitrate: $("stat-bitrate"),
      video: $("stat-video"),
      jitter: $("stat-jitter"),
      segment: $("stat-segment"),
      audio: $("stat-audio"),
      hudFps: $("hud-fps"),
      hudLatency: $("hud-latency"),
    };
    this.targetFps = null;
  }

  setProfile(profile) {
    this.targetFps = profile?.fps ?? null;
    this.el.target.textContent = this.targetFps ? `${this.targetFps} fps` : "–";
  }

  /** `sample`: StatsMonitor sample + {pingRttMs, acks, server}. */
  render(sample) {
    const { el } = this;
    const fps = sample.fps;
    el.fps.textContent = fps == null ? "–" : fps.toFixed(1);
    el.fps.classList.toggle("warn", fps != null && this.targetFps != null && fps < 0.8 * this.targetFps);
    el.hudFps.textContent = fps == null ? "– fps" : `${fps.toFixed(0)} fps`;
    el.frames.textContent = String(sample.framesDecoded);
    const stalls = sample.server?.stalls;
    el.stalls.textContent = stalls == null ? "–" : String(stalls);
    el.stalls.classList.toggle("warn", Boolean(stalls));
    const prompt = sample.acks.prompt.applied ?? sample.acks.cut.applied;
    el.promptLatency.textContent = ms(prompt);
    el.actionLatency.textContent = ms(sample.acks.action.applied);
    el.rtt.textContent = ms(sample.pingRttMs ?? sample.iceRttMs);
    el.bitrate.textContent = sample.bitrateKbps == null ? "–" : `${Math.round(sample.bitrateKbps)} kbps`;
    el.video.textContent = sample.width
      ? `${sample.width}×${sample.height}${sample.codec ? ` ${sample.codec}` : ""}`
      : "–";
    el.jitter.textContent = ms(sample.jitterBufferMs);
    el.segment.textContent = sample.server?.segment == null ? "–" : String(sample.server.segment);
    const audioS = sample.server?.audio_seconds_in;
    el.audio.textContent = audioS == null ? "–" : `${audioS.toFixed(1)} s`;
  }

  /** Flash the latest input -> applied latency in the HUD. */
  showApplied(kind, latencyMs) {
    this.el.hudLatency.textContent = `${kind} ${ms(latencyMs)}`;
  }

  clear() {
    for (const key of Object.keys(this.el))
      if (!["hudFps", "hudLatency", "target"].includes(key)) this.el[key].textContent = "–";
    this.el.hudFps.textContent = "– fps";
    this.el.hudLatency.textContent = "";
  }
}
