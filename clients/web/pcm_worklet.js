/**
 * AudioWorklet that forwards mono Float32 blocks to the main thread while `talking` is set.
 * Loaded with audioWorklet.addModule(); runs in an AudioContext created at 16 kHz, so the
 * browser has already resampled the microphone.
 */
class PcmCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.talking = false;
    this.port.onmessage = (event) => {
      this.talking = Boolean(event.data?.talking);
    };
  }

  process(inputs) {
    const channels = inputs[0];
    if (this.talking && channels && channels.length) {
      this.port.postMessage(channels[0].slice(0));
    }
    return true;
  }
}

registerProcessor("dreamrt-pcm-capture", PcmCapture);
