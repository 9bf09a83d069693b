/**
 * Push-to-talk: the microphone reaches the session only while the talk control is held.
 *
 * Two transports, one interface (`attach(track)`, `talk(on)`, `close()`):
 * - TrackTransport: the offer carried a send-only audio m-line; talking attaches the microphone
 *   track to that RTCRtpSender with replaceTrack() and releasing detaches it (no renegotiation,
 *   and nothing is sent between presses).
 * - HttpPcmTransport: for servers that do not accept the audio m-line. A 16 kHz AudioContext and
 *   an AudioWorklet capture mono samples while talking, POSTed as s16le every `flushMs` to
 *   /v1/sessions/{id}/audio.
 * The microphone is opened on the first press (permission prompt then) and kept until close().
 */

export const PCM_RATE_HZ = 16000;

/** Float32 samples in [-1, 1] -> little-endian signed 16-bit PCM bytes. */
export function floatToS16le(samples) {
  const out = new DataView(new ArrayBuffer(samples.length * 2));
  for (let i = 0; i < samples.length; i += 1) {
    const clamped = Math.max(-1, Math.min(1, samples[i]));
    out.setInt16(i * 2, clamped < 0 ? clamped * 0x8000 : clamped * 0x7fff, true);
  }
  return new Uint8Array(out.buffer);
}

export class TrackTransport {
  constructor(sender) {
    this.name = "track";
    this._sender = sender;
    this._track = null;
  }

  attach(track) {
    this._track = track;
  }

  async talk(on) {
    await this._sender.replaceTrack(on ? this._track : null);
  }

  async close() {
    await this._sender.replaceTrack(null).catch(() => {});
  }
}

export class HttpPcmTransport {
  /** `post(bytes) -> Promise` sends one PCM block; failures are reported to `onError`. */
  constructor(post, { flushMs = 200, onError = () => {} } = {}) {
    this.name = "http";
    this._post = post;
    this._flushMs = flushMs;
    this._onError = onError;
    this._context = null;
    this._node = null;
    this._blocks = [];
    this._timer = null;
    this.bytesSent = 0;
  }

  async attach(track) {
    this._context = new AudioContext({ sampleRate: PCM_RATE_HZ });
    await this._context.audioWorklet.addModule(new URL("./pcm_worklet.js", import.meta.url));
    const source = this._context.createMediaStreamSource(new MediaStream([track]));
    this._node = new AudioWorkletNode(this._context, "dreamrt-pcm-capture");
    this._node.port.onmessage = (event) => this._blocks.push(event.data);
    source.connect(this._node);
  }

  async talk(on) {
    if (this._context.state === "suspended") await this._context.resume();
    this._node.port.postMessage({ talking: on });
    clearInterval(this._timer);
    this._timer = on ? setInterval(() => this._flush(), this._flushMs) : null;
    // The worklet may still hold a block or two; flush after it has seen the release.
    if (!on) setTimeout(() => this._flush(), 60);
  }

  _flush() {
    if (!this._blocks.length) return;
    const total = this._blocks.reduce((n, b) => n + b.length, 0);
    const joined = new Float32Array(total);
    let offset = 0;
    for (const block of this._blocks) {
      joined.set(block, offset);
      offset += block.length;
    }
    this._blocks = [];
    const bytes = floatToS16le(joined);
    this.bytesSent += bytes.length;
    this._post(bytes).catch((err) => this._onError(err));
  }

  async close() {
    clearInterval(this._timer);
    await this._context?.close().catch(() => {});
  }
}

/** Holds the microphone and a transport; press()/release() are idempotent and ordered. */
export class PushToTalk {
  constructor(transport, { onLevel = () => {}, onStateChange = () => {} } = {}) {
    this.transport = transport;
    this._onLevel = onLevel;
    this._onStateChange = onStateChange;
    this._stream = null;
    this._meter = null;
    this._levelTimer = null;
    this._chain = Promise.resolve();
    this.talking = false;
    this.pressCount = 0;
  }

  /** Serialize press/release so a quick tap cannot leave the track attached. */
  _enqueue(step) {
    this._chain = this._chain.then(step).catch((err) => {
      this.talking = false;
      this._onStateChange(false, err);
    });
    return this._chain;
  }

  press() {
    if (this.talking) return this._chain;
    this.talking = true;
    this.pressCount += 1;
    this._onStateChange(true, null);
    return this._enqueue(async () => {
      await this._open();
      if (this.talking) {
        await this.transport.talk(true);
        this._startMeter();
      }
    });
  }

  release() {
    if (!this.talking) return this._chain;
    this.talking = false;
    this._onStateChange(false, null);
    return this._enqueue(async () => {
      if (this._stream) await this.transport.talk(false);
      this._stopMeter();
    });
  }

  async _open() {
    if (this._stream) return;
    this._stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      video: false,
    });
    await this.transport.attach(this._stream.getAudioTracks()[0]);
  }

  _startMeter() {
    if (!this._meter) {
      const context = new AudioContext();
      const analyser = context.createAnalyser();
      analyser.fftSize = 512;
      context.createMediaStreamSource(this._stream).connect(analyser);
      this._meter = { context, analyser, buffer: new Float32Array(analyser.fftSize) };
    }
    const { analyser, buffer } = this._meter;
    this._levelTimer = setInterval(() => {
      analyser.getFloatTimeDomainData(buffer);
      let sum = 0;
      for (const v of buffer) sum += v * v;
      this._onLevel(Math.min(1, Math.sqrt(sum / buffer.length) * 4));
    }, 60);
  }

  _stopMeter() {
    clearInterval(this._levelTimer);
    this._levelTimer = null;
    this._onLevel(0);
  }

  async close() {
    this.talking = false;
    this._stopMeter();
    await this._chain;
    await this.transport.close();
    await this._meter?.context.close().catch(() => {});
    for (const track of this._stream?.getTracks() || []) track.stop();
    this._stream = null;
  }
}
