/**
 * Presented-frame clock: every frame the <video> presents, via requestVideoFrameCallback.
 *
 * Each record is {atMs (callback time, performance.now() clock), expectedDisplayMs, rtp90k,
 * presentedFrames}. `rtp90k` is the frame's RTP timestamp unwrapped from 32 bits and counted from
 * the first presented frame (90 kHz, like the server's PTS), or null when the browser gives no
 * rtpTimestamp. The ring keeps the last `capacity` frames. `firstFrameMs` is the time of the
 * first presented frame since navigation start: the "page load -> first frame" figure.
 */

export class FrameClock {
  constructor(video, { capacity = 600 } = {}) {
    this._video = video;
    this._capacity = capacity;
    this._handle = null;
    this._firstRtp = null;
    this._waiters = [];
    this.frames = [];
    this.firstFrameMs = null;
    this.firstRtpTimestamp = null;
  }

  get supported() {
    return typeof this._video.requestVideoFrameCallback === "function";
  }

  start() {
    if (!this.supported || this._handle !== null) return;
    const onFrame = (nowMs, meta) => {
      this._record(nowMs, meta);
      this._handle = this._video.requestVideoFrameCallback(onFrame);
    };
    this._handle = this._video.requestVideoFrameCallback(onFrame);
  }

  stop() {
    if (this._handle !== null) this._video.cancelVideoFrameCallback(this._handle);
    this._handle = null;
  }

  /** Forget past frames (a new stream restarts RTP time). */
  reset() {
    this.frames = [];
    this._firstRtp = null;
    this.firstRtpTimestamp = null;
    this.firstFrameMs = null;
  }

  _record(nowMs, meta) {
    let rtp90k = null;
    if (typeof meta.rtpTimestamp === "number") {
      if (this._firstRtp === null) {
        this._firstRtp = meta.rtpTimestamp;
        this.firstRtpTimestamp = meta.rtpTimestamp;
      }
      const last = this.frames.length ? this.frames[this.frames.length - 1].rtp90k : 0;
      // Unwrap: the 32-bit delta from the first frame, lifted to the epoch nearest the last frame.
      const delta = (meta.rtpTimestamp - this._firstRtp) >>> 0;
      const epoch = 2 ** 32;
      rtp90k = delta + Math.round((last - delta) / epoch) * epoch;
    }
    const frame = {
      atMs: performance.now(),
      callbackMs: nowMs,
      expectedDisplayMs: meta.expectedDisplayTime,
      rtp90k,
      presentedFrames: meta.presentedFrames,
    };
    if (this.firstFrameMs === null) this.firstFrameMs = frame.atMs;
    this.frames.push(frame);
    if (this.frames.length > this._capacity) this.frames.splice(0, this.frames.length - this._capacity);
    this._waiters = this._waiters.filter(({ predicate, resolve }) => {
      if (!predicate(frame)) return true;
      resolve(frame);
      return false;
    });
  }

  /** Resolve with the first frame (already presented or future) that satisfies `predicate`. */
  waitFor(predicate, { includePast = false, timeoutMs = 10000 } = {}) {
    if (includePast) {
      const past = this.frames.find(predicate);
      if (past) return Promise.resolve(past);
    }
    return new Promise((resolve, reject) => {
      const waiter = { predicate, resolve };
      this._waiters.push(waiter);
      setTimeout(() => {
        if (!this._waiters.includes(waiter)) return;
        this._waiters = this._waiters.filter((w) => w !== waiter);
        reject(new Error(`no matching frame within ${timeoutMs} ms`));
      }, timeoutMs);
    });
  }
}
