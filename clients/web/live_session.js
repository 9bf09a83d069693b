/**
 * One live dreamrt session as the page sees it: REST session + peer connection + control
 * channel, with the acks, pings, receive stats and server-side counters around them. No DOM.
 *
 * open(prompt) creates the session (POST /v1/sessions), negotiates WebRTC and resolves once the
 * control channel is open; it rejects with the ApiError/NegotiationError that stopped it (the
 * session is then deleted). Afterwards everything is reported through the callbacks:
 *   onEvent(event)        every server event from the control channel
 *   onTrack(stream)       the remote video stream
 *   onStats(sample)       once a second: getStats sample + ping RTT + ack latencies + REST counters
 *   onConnectionLost(why) the peer connection or control channel failed or closed under us
 * Senders return false (never throw) when the channel cannot take the message.
 */

import { AckTracker } from "./ack_tracker.js";
import { ControlChannel } from "./control_channel.js";
import { connectPeer, NegotiationError } from "./peer.js";
import { StatsMonitor } from "./stats_monitor.js";

const CHANNEL_OPEN_TIMEOUT_MS = 15000;
const PING_PERIOD_MS = 1000;
const POLL_PERIOD_MS = 2000;
const DELETE_TIMEOUT_MS = 3000;

function waitForOpen(channel, timeoutMs) {
  if (channel.readyState === "open") return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new NegotiationError(`control channel did not open within ${timeoutMs} ms`)),
      timeoutMs,
    );
    channel.addEventListener(
      "open",
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
    channel.addEventListener(
      "close",
      () => {
        clearTimeout(timer);
        reject(new NegotiationError("control channel closed while connecting"));
      },
      { once: true },
    );
  });
}

export class LiveSession {
  constructor(
    api,
    {
      iceServers = [],
      offerAudio = true,
      onEvent = () => {},
      onTrack = () => {},
      onStats = () => {},
      onConnectionLost = () => {},
    } = {},
  ) {
    this.api = api;
    this.iceServers = iceServers;
    this.offerAudio = offerAudio;
    this._onEvent = onEvent;
    this._onTrack = onTrack;
    this._onStats = onStats;
    this._onConnectionLost = onConnectionLost;
    this.info = null; // POST /v1/sessions answer: {id, token, state, profile}
    this.rest = null; // SessionApi
    this.pc = null;
    this.control = null;
    this.audioSender = null;
    this.acks = new AckTracker();
    this.pingRttMs = null;
    this.server = null; // last GET /v1/sessions/{id}
    this.closed = false;
    this._timers = [];
    this._stats = null;
  }

  get id() {
    return this.info?.id ?? null;
  }

  /** Create the session and connect; see the module comment for failure behaviour. */
  async open(body) {
    this.info = await this.api.createSession(body);
    this.rest = this.api.session(this.info.id, this.info.token);
    if (this.closed) {
      // close() ran while the session was being created: it had nothing to delete yet.
      await this.rest.close().catch(() => {});
      throw new NegotiationError("closed while connecting");
    }
    try {
      await this.attach();
    } catch (err) {
      await this.close();
      throw err;
    }
  }

  /** Connect to an existing session (`info` = {id, token, profile?}), e.g. a chosen fork candidate. */
  async adopt(info) {
    this.info = info;
    this.rest = this.api.session(info.id, info.token);
    try {
      await this.attach();
    } catch (err) {
      await this.close({ deleteSession: false });
      throw err;
    }
  }

  async attach() {
    const { pc, channel, audioSender } = await connectPeer(this.rest, {
      iceServers: this.iceServers,
      offerAudio: this.offerAudio,
    });
    if (this.closed) {
      pc.close();
      throw new NegotiationError("closed while connecting");
    }
    this.pc = pc;
    this.audioSender = audioSender;
    pc.addEventListener("track", (event) => {
      if (event.track.kind === "video") this._onTrack(event.streams[0] || new MediaStream([event.track]));
    });
    for (const receiver of pc.getReceivers()) {
      if (receiver.track?.kind === "video" && receiver.track.readyState === "live")
        this._onTrack(new MediaStream([receiver.track]));
    }
    pc.addEventListener("connectionstatechange", () => {
      if (["failed", "closed"].includes(pc.connectionState) && !this.closed)
        this._onConnectionLost(`peer connection ${pc.connectionState}`);
    });
    this.control = new ControlChannel(channel, {
      onEvent: (event) => this._receive(event),
      onClose: () => !this.closed && this._onConnectionLost("control channel closed"),
      onInvalid: (why) => console.warn(`ignored control message: ${why}`),
    });
    await waitForOpen(channel, CHANNEL_OPEN_TIMEOUT_MS);
    this._stats = new StatsMonitor(pc, { onSample: (sample) => this._emitStats(sample) });
    this._stats.start();
    this._timers.push(setInterval(() => this.control.send({ type: "ping", t: performance.now() }), PING_PERIOD_MS));
    this._timers.push(setInterval(() => this._poll(), POLL_PERIOD_MS));
    this._poll();
  }

  _receive(event) {
    if (event.type === "pong" && typeof event.t === "number") this.pingRttMs = performance.now() - event.t;
    this.acks.observe(event);
    this._onEvent(event);
  }

  async _poll() {
    try {
      this.server = await this.rest.get();
    } catch (err) {
      console.warn(`session poll failed: ${err.message}`);
    }
  }

  _emitStats(sample) {
    this._onStats({ ...sample, pingRttMs: this.pingRttMs, acks: this.acks.summary(), server: this.server });
  }

  /** Prompt over the control channel: mode "switch" (default) or "cut" (a new segment). */
  prompt(text, mode = "switch") {
    const sent = this.control.send(mode === "cut" ? { type: "prompt", text, mode } : { type: "prompt", text });
    if (sent) this.acks.noteSent(mode === "cut" ? "cut" : "prompt");
    return sent;
  }

  /** One action message {type:"action", keys, mouse}; false when dropped. */
  action(message) {
    const sent = this.control.send(message);
    if (sent) this.acks.noteSent("action");
    return sent;
  }

  rate(rating) {
    return this.control.send({ type: "feedback", rating });
  }

  pause() {
    return this.control.send({ type: "pause" });
  }

  resume() {
    return this.control.send({ type: "resume" });
  }

  /**
   * Stop timers, (by default) DELETE the session, then close the peer; idempotent. The DELETE
   * goes first so the server ends a session that still has its viewer (closing the peer first
   * would pause it on the way); it is awaited at most DELETE_TIMEOUT_MS, so a slow server never
   * holds the page.
   */
  async close({ deleteSession = true, keepalive = false } = {}) {
    if (this.closed) return;
    this.closed = true;
    for (const timer of this._timers) clearInterval(timer);
    this._timers = [];
    this._stats?.stop();
    if (deleteSession && this.rest) {
      await this.rest
        .close({ keepalive, timeoutMs: DELETE_TIMEOUT_MS })
        .catch((err) => console.warn(`DELETE session ${this.id}: ${err.message}`));
    }
    this.control?.close();
    this.pc?.close();
  }
}
