/**
 * The `control` data channel (docs/api.md "Data channel `control`"): JSON text messages both ways.
 *
 * send() returns false instead of throwing when the channel is not open or its send buffer is
 * above `maxBufferedBytes` (actions are latest-wins, so dropping one under back-pressure is
 * correct; callers that must not drop check the result). Incoming messages that are not JSON
 * objects with a string `type` are reported to `onInvalid` and otherwise ignored.
 */

const MAX_MESSAGE_BYTES = 16 * 1024;

export class ControlChannel {
  constructor(channel, { onEvent, onOpen, onClose, onInvalid, maxBufferedBytes = 256 * 1024 } = {}) {
    this.channel = channel;
    this.maxBufferedBytes = maxBufferedBytes;
    this.sentCount = 0;
    this.droppedCount = 0;
    this._onEvent = onEvent || (() => {});
    this._onInvalid = onInvalid || (() => {});
    channel.addEventListener("open", () => onOpen?.());
    channel.addEventListener("close", () => onClose?.());
    channel.addEventListener("message", (event) => this._receive(event.data));
  }

  get isOpen() {
    return this.channel.readyState === "open";
  }

  /** Send one message object; false when not sent (closed, back-pressure or oversize). */
  send(message) {
    const text = JSON.stringify(message);
    if (!this.isOpen || this.channel.bufferedAmount > this.maxBufferedBytes || text.length > MAX_MESSAGE_BYTES) {
      this.droppedCount += 1;
      return false;
    }
    this.channel.send(text);
    this.sentCount += 1;
    return true;
  }

  _receive(data) {
    if (typeof data !== "string") {
      this._onInvalid("binary message");
      return;
    }
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      this._onInvalid(`not JSON: ${data.slice(0, 80)}`);
      return;
    }
    if (!event || typeof event !== "object" || typeof event.type !== "string") {
      this._onInvalid(`no type: ${data.slice(0, 80)}`);
      return;
    }
    this._onEvent(event);
  }

  close() {
    if (this.channel.readyState !== "closed") this.channel.close();
  }
}
