/**
 * Page configuration from the URL query string, with localStorage for the settings a user
 * edits in the page. Nothing here talks to the network.
 *
 *   ?prompt=TEXT      pre-fills the prompt box
 *   ?autostart=1      starts a session on load (benchmarks, kiosks)
 *   ?ice=JSON|URLS    RTCIceServer list: a JSON array, or comma-separated STUN/TURN URLs
 *   ?key=TOKEN        API token for servers that require auth (sent as a Bearer token)
 *   ?audio=auto|track|http   push-to-talk transport (see microphone.js)
 *   ?api=URL          API base URL when the page is served from elsewhere (default: same origin)
 *   ?decoder=full|tiny  the session's decoder (default: the model's; the page offers the choice
 *                     when the served card has both)
 */

const STORAGE_KEY = "dreamrt.settings";
const AUDIO_TRANSPORTS = ["auto", "track", "http"];
const DECODERS = ["full", "tiny"];

export class ConfigError extends Error {
  constructor(field, message) {
    super(`${field}: ${message}`);
    this.name = "ConfigError";
    this.field = field;
  }
}

/** Parse an ICE server list: "" -> [], JSON array, or "stun:a,turn:b" (no credentials). */
export function parseIceServers(text) {
  const trimmed = (text || "").trim();
  if (!trimmed) return [];
  if (trimmed.startsWith("[")) {
    let parsed;
    try {
      parsed = JSON.parse(trimmed);
    } catch (err) {
      throw new ConfigError("ice", `not valid JSON (${err.message})`);
    }
    if (!Array.isArray(parsed) || !parsed.every((s) => s && (typeof s.urls === "string" || Array.isArray(s.urls)))) {
      throw new ConfigError("ice", "expected an array of {urls, username?, credential?}");
    }
    return parsed;
  }
  return trimmed
    .split(",")
    .map((url) => url.trim())
    .filter(Boolean)
    .map((urls) => ({ urls }));
}

function loadStored(storage) {
  try {
    return JSON.parse(storage?.getItem(STORAGE_KEY) || "{}") || {};
  } catch {
    return {};
  }
}

/** Persist the user-editable settings ({ice, key}) for the next visit. */
export function storeSettings(settings, storage = globalThis.localStorage) {
  storage?.setItem(STORAGE_KEY, JSON.stringify({ ice: settings.ice || "", key: settings.key || "" }));
}

/** Read the configuration; the query string wins over stored settings. */
export function readConfig(search = globalThis.location?.search || "", storage = globalThis.localStorage) {
  const params = new URLSearchParams(search);
  const stored = loadStored(storage);
  const iceText = params.get("ice") ?? stored.ice ?? "";
  const audio = params.get("audio") || "auto";
  if (!AUDIO_TRANSPORTS.includes(audio)) {
    throw new ConfigError("audio", `expected one of ${AUDIO_TRANSPORTS.join(", ")}, got ${JSON.stringify(audio)}`);
  }
  const decoder = params.get("decoder") || "";
  if (decoder && !DECODERS.includes(decoder)) {
    throw new ConfigError("decoder", `expected one of ${DECODERS.join(", ")}, got ${JSON.stringify(decoder)}`);
  }
  return {
    prompt: params.get("prompt") || "",
    autostart: params.get("autostart") === "1",
    iceText,
    iceServers: parseIceServers(iceText),
    apiKey: params.get("key") ?? stored.key ?? "",
    audioTransport: audio,
    apiBase: (params.get("api") || "").replace(/\/+$/, ""),
    decoder,
  };
}
