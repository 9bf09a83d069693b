/**
 * Live receive statistics from RTCPeerConnection.getStats(), sampled every `periodMs`.
 *
 * fps is the framesDecoded delta over the wall-clock delta between samples (not the browser's
 * own framesPerSecond, which smooths over seconds). Bitrate is the bytesReceived delta. Each
 * sample is passed to `onSample`; a getStats failure is reported once per sample, never thrown.
 */

export function videoInbound(report) {
  for (const stat of report.values()) {
    if (stat.type === "inbound-rtp" && (stat.kind === "video" || stat.mediaType === "video")) return stat;
  }
  return null;
}

function selectedPairRtt(report) {
  for (const stat of report.values()) {
    if (stat.type === "transport" && stat.selectedCandidatePairId) {
      return report.get(stat.selectedCandidatePairId)?.currentRoundTripTime ?? null;
    }
  }
  for (const stat of report.values()) {
    if (stat.type === "candidate-pair" && stat.nominated && stat.state === "succeeded")
      return stat.currentRoundTripTime ?? null;
  }
  return null;
}

export class StatsMonitor {
  constructor(pc, { periodMs = 1000, onSample = () => {}, onError = () => {} } = {}) {
    this._pc = pc;
    this._periodMs = periodMs;
    this._onSample = onSample;
    this._onError = onError;
    this._previous = null;
    this._timer = null;
    this.latest = null;
  }

  start() {
    this._timer = setInterval(() => this.sample(), this._periodMs);
  }

  stop() {
    clearInterval(this._timer);
    this._timer = null;
  }

  /** Take one sample now; resolves with it (or null when stats are unavailable). */
  async sample() {
    let report;
    try {
      report = await this._pc.getStats();
    } catch (err) {
      this._onError(err);
      return null;
    }
    const video = videoInbound(report);
    const nowMs = performance.now();
    const current = {
      atMs: nowMs,
      framesDecoded: video?.framesDecoded ?? 0,
      framesDropped: video?.framesDropped ?? 0,
      freezeCount: video?.freezeCount ?? 0,
      bytesReceived: video?.bytesReceived ?? 0,
      packetsLost: video?.packetsLost ?? 0,
      width: video?.frameWidth ?? 0,
      height: video?.frameHeight ?? 0,
      codec: video?.codecId ? (report.get(video.codecId)?.mimeType?.split("/")[1] ?? "") : "",
      jitterBufferMs: video?.jitterBufferEmittedCount
        ? (1000 * video.jitterBufferDelay) / video.jitterBufferEmittedCount
        : null,
      iceRttMs: (() => {
        const rtt = selectedPairRtt(report);
        return rtt == null ? null : rtt * 1000;
      })(),
      fps: null,
      bitrateKbps: null,
    };
    const previous = this._previous;
    if (previous) {
      const dtS = (nowMs - previous.atMs) / 1000;
      if (dtS > 0) {
        current.fps = Math.max(0, current.framesDecoded - previous.framesDecoded) / dtS;
        current.bitrateKbps = (Math.max(0, current.bytesReceived - previous.bytesReceived) * 8) / 1000 / dtS;
      }
    }
    this._previous = current;
    this.latest = current;
    this._onSample(current);
    return current;
  }
}
