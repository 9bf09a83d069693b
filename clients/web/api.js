/**
 * REST client for the dreamrt API (docs/api.md "REST"). Every method resolves with the parsed JSON
 * answer (or null for empty answers) and rejects with an ApiError that carries the HTTP status,
 * a readable message (422 answers name the offending field) and, for 503, retryAfterS.
 */

export class ApiError extends Error {
  constructor(status, message, { retryAfterS = null, route = "" } = {}) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.retryAfterS = retryAfterS;
    this.route = route;
  }
}

/** Turn an error body (FastAPI {"detail": str | [{loc, msg}]}, or text) into one line. */
function describeError(status, body) {
  // dreamrt's {detail, code}, or OpenAI's {error: {message, ...}} on /v1/models, /v1/videos, /v1/images
  const detail =
    body && typeof body === "object" ? (body.detail ?? body.message ?? body.error?.message ?? body.error) : body;
  if (Array.isArray(detail)) {
    return detail
      .map((item) => {
        const field = Array.isArray(item.loc) ? item.loc.filter((p) => p !== "body").join(".") : "";
        return field ? `${field}: ${item.msg}` : item.msg;
      })
      .join("; ");
  }
  if (typeof detail === "string" && detail) return detail;
  if (detail && typeof detail === "object") return JSON.stringify(detail);
  return `HTTP ${status}`;
}

async function readBody(response) {
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

export class ApiClient {
  /** `baseUrl` "" means same origin; `apiKey` authorizes routes that are not session-scoped. */
  constructor({ baseUrl = "", apiKey = "" } = {}) {
    this.baseUrl = baseUrl;
    this.apiKey = apiKey;
  }

  /** One call; `timeoutMs` (0 = none) aborts it with an ApiError of status 0. */
  async request(method, path, { body, token, contentType, keepalive = false, timeoutMs = 0 } = {}) {
    const headers = {};
    const bearer = token || this.apiKey;
    if (bearer) headers.Authorization = `Bearer ${bearer}`;
    let payload;
    if (body instanceof ArrayBuffer || ArrayBuffer.isView(body)) {
      headers["Content-Type"] = contentType || "application/octet-stream";
      payload = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    let response;
    try {
      const signal = timeoutMs > 0 ? AbortSignal.timeout(timeoutMs) : undefined;
      response = await fetch(`${this.baseUrl}${path}`, { method, headers, body: payload, keepalive, signal });
    } catch (err) {
      const why =
        err.name === "TimeoutError" ? `no answer within ${timeoutMs} ms` : `cannot reach the server (${err.message})`;
      throw new ApiError(0, why, { route: path });
    }
    const parsed = await readBody(response);
    if (!response.ok) {
      const retry = Number.parseFloat(response.headers.get("Retry-After") || "");
      throw new ApiError(response.status, describeError(response.status, parsed), {
        retryAfterS: Number.isFinite(retry) ? retry : null,
        route: path,
      });
    }
    return parsed;
  }

  health() {
    return this.request("GET", "/healthz");
  }

  /**
   * GET /v1/models -> {object: "list", data: [{id, object: "model", served, examples, controls, ...}]}:
   * resolves with `data`, every card of the server.
   */
  async models() {
    return (await this.request("GET", "/v1/models")).data;
  }

  /** POST /v1/sessions -> {id, token, state, profile: {fps, width, height}}. */
  createSession(body) {
    return this.request("POST", "/v1/sessions", { body });
  }

  /** A client bound to one session and its token. */
  session(id, token) {
    return new SessionApi(this, id, token);
  }
}

/** The session-scoped routes; `token` is the one POST /v1/sessions returned. */
export class SessionApi {
  constructor(client, id, token) {
    this.client = client;
    this.id = id;
    this.token = token;
    this.prefix = `/v1/sessions/${encodeURIComponent(id)}`;
  }

  _call(method, suffix, body, extra = {}) {
    return this.client.request(method, `${this.prefix}${suffix}`, { body, token: this.token, ...extra });
  }

  get() {
    return this._call("GET", "");
  }

  offer(description) {
    return this._call("POST", "/offer", { sdp: description.sdp, type: description.type });
  }

  prompt(text, mode = "switch") {
    return this._call("POST", "/prompt", { text, mode });
  }

  actions(keys, mouse) {
    return this._call("POST", "/actions", { keys, mouse });
  }

  /** Raw PCM s16le mono 16 kHz. */
  audio(pcmBytes) {
    return this._call("POST", "/audio", pcmBytes, { contentType: "application/octet-stream" });
  }

  feedback(rating, chunk) {
    return this._call("POST", "/feedback", chunk == null ? { rating } : { rating, chunk });
  }

  fork(n, prompt) {
    return this._call("POST", "/fork", prompt ? { n, prompt } : { n });
  }

  choose(candidate) {
    return this._call("POST", "/choose", { candidate });
  }

  pause() {
    return this._call("POST", "/pause");
  }

  resume() {
    return this._call("POST", "/resume");
  }

  /** DELETE the session; `keepalive` lets it outlive a closing page. */
  close({ keepalive = false, timeoutMs = 0 } = {}) {
    return this._call("DELETE", "", undefined, { keepalive, timeoutMs });
  }
}
