/**
 * WebRTC negotiation with a dreamrt session: one offer, one answer, no trickle ICE.
 *
 * The offer carries a `control` data channel, a receive-only video m-line and, when asked, a
 * send-only audio m-line with no track yet: push-to-talk later attaches the microphone with
 * RTCRtpSender.replaceTrack(), which needs no renegotiation. The server does no trickle, so the
 * offer is posted only once ICE gathering is complete (or after `gatherTimeoutMs`, with whatever
 * candidates exist by then).
 */

export class NegotiationError extends Error {
  constructor(message) {
    super(message);
    this.name = "NegotiationError";
  }
}

/** Resolve when `pc.iceGatheringState` is "complete" or after `timeoutMs` (whichever first). */
export function iceGatheringComplete(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => finish(false), timeoutMs);
    function onChange() {
      if (pc.iceGatheringState === "complete") finish(true);
    }
    function onCandidate(event) {
      if (event.candidate === null) finish(true);
    }
    function finish(complete) {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", onChange);
      pc.removeEventListener("icecandidate", onCandidate);
      resolve(complete);
    }
    pc.addEventListener("icegatheringstatechange", onChange);
    pc.addEventListener("icecandidate", onCandidate);
  });
}

/** True when the answer accepted our audio m-line (a non-zero port, not inactive/sendonly). */
export function answerAcceptsAudio(answerSdp) {
  const sections = answerSdp.split(/\r?\nm=/).slice(1);
  const audio = sections.find((section) => section.startsWith("audio "));
  if (!audio) return false;
  const port = Number.parseInt(audio.split(" ")[1], 10);
  if (!port) return false;
  return !/\r?\na=(inactive|sendonly)\b/.test(audio);
}

/**
 * Open a peer connection to `sessionApi`'s session.
 * Returns {pc, channel, audioSender (null when no audio m-line was offered or accepted)}.
 * On failure the peer connection is closed and a NegotiationError (or the ApiError of the
 * offer route) is thrown.
 */
export async function connectPeer(sessionApi, { iceServers = [], offerAudio = true, gatherTimeoutMs = 5000 } = {}) {
  const pc = new RTCPeerConnection({ iceServers });
  try {
    const channel = pc.createDataChannel("control", { ordered: true });
    pc.addTransceiver("video", { direction: "recvonly" });
    const audioTransceiver = offerAudio ? pc.addTransceiver("audio", { direction: "sendonly" }) : null;
    await pc.setLocalDescription(await pc.createOffer());
    const complete = await iceGatheringComplete(pc, gatherTimeoutMs);
    if (!complete) console.warn(`ICE gathering incomplete after ${gatherTimeoutMs} ms; offering what we have`);
    const answer = await sessionApi.offer(pc.localDescription);
    if (!answer || answer.type !== "answer" || typeof answer.sdp !== "string") {
      throw new NegotiationError(`the server's answer is not an SDP answer: ${JSON.stringify(answer).slice(0, 120)}`);
    }
    await pc.setRemoteDescription(answer);
    const audioSender = audioTransceiver && answerAcceptsAudio(answer.sdp) ? audioTransceiver.sender : null;
    return { pc, channel, audioSender };
  } catch (err) {
    pc.close();
    throw err;
  }
}
