// lipstream.js: the browser client for a lipstream server (docs/apps.md). An ES module
// with no dependencies and no build step; the server serves it at /static/lipstream.js
// and any page may import it, from any origin the server lists in server.cors_origins.
//
//   import { connect, openMicrophone, LipstreamError } from "https://avatar.example/static/lipstream.js";
//
//   const call = await connect({ baseUrl: "https://avatar.example", avatar: "demo", token });
//   document.querySelector("video").srcObject = call.stream;     // H.264 video + audio
//   call.addEventListener("speech_started", (e) => console.log("speaking", e.detail.utterance));
//   call.addEventListener("speech_ended", (e) => console.log("done", e.detail.duration_ms));
//   await call.say("Hello there!");                              // 202: {queued_ms, utterance}
//   await call.interrupt();                                      // the avatar stops at once
//   await call.switchAvatar("other");                            // the same call, another face
//   await call.setIdleClip("thinking");                          // what it plays while silent
//
//   const stream = await call.streamAudio({ format: "f32le", rate: 24000 });
//   stream.send(float32Chunk);                                   // TTS output as it arrives
//   stream.end();                                                // the utterance is complete
//   await call.hangUp();
//
//   // Watch a session (WHEP): one no caller owns, made by createSession(), or a call.
//   const { session_id } = await createSession("https://avatar.example", { avatar: "demo", token });
//   const viewer = await watch({ baseUrl: "https://avatar.example", sessionId: session_id, video, token });
//   viewer.addEventListener("speech_started", (e) => console.log("speaking", e.detail.utterance));
//   await viewer.leave();                                        // the session goes on
//
// Every error the server answers ({"error": {"code", "message"}}) rejects with a
// LipstreamError carrying its HTTP status, code and Retry-After.
//
// Signalling is one HTTP exchange: the server does not trickle ICE, so the offer is sent
// once ICE gathering is complete (or has run for iceGatheringTimeoutMs) with every
// candidate in it. A viewer's offer is the body of `POST /sessions/{id}/whep` itself
// (`application/sdp`, as WHEP players send it).

const DEFAULT_ICE_GATHERING_TIMEOUT_MS = 5000;
const DEFAULT_CONNECT_TIMEOUT_MS = 20000;
const HANG_UP_TIMEOUT_MS = 5000;
const EVENTS_CHANNEL = "lipstream";
const SDP = "application/sdp";
// Typed arrays use the platform's byte order; the wire is little-endian.
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * What went wrong, for any failure of this module. `status` is the HTTP status of the
 * server's answer, or 0 when no answer was involved; `code` is the server's error code
 * (`model_not_found`, `session_not_found`, `unauthorized`, `rate_limited`,
 * `bad_stream_format`, …) or one of this module's own: `network_error`, `http_error` (an
 * answer without a JSON error body, e.g. from a proxy), `insecure_context`,
 * `microphone_denied`, `no_microphone`, `connect_timeout`, `connection_failed`,
 * `stream_failed`, `stream_closed`, `call_ended`.
 */
export class LipstreamError extends Error {
  /**
   * @param {number} status HTTP status, 0 when there was no HTTP answer
   * @param {string} code machine-readable cause
   * @param {string} message what happened, for a person
   * @param {{retryAfter?: number|null, cause?: unknown}} [options]
   */
  constructor(status, code, message, { retryAfter = null, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = "LipstreamError";
    /** @type {number} */
    this.status = status;
    /** @type {string} */
    this.code = code;
    /** Seconds to wait before trying again (the Retry-After header), or null. @type {number|null} */
    this.retryAfter = retryAfter;
  }
}

/** The server that served this module, by default (its /static/ parent, proxy prefix kept). */
function baseOf(baseUrl) {
  const base = new URL(baseUrl ?? new URL("..", import.meta.url), globalThis.location?.href);
  if (!base.pathname.endsWith("/")) base.pathname += "/";
  return base;
}

function urlOf(baseUrl, path) {
  return new URL(path.replace(/^\/+/, ""), baseOf(baseUrl));
}

function sessionPath(sessionId, action = "") {
  return `sessions/${encodeURIComponent(sessionId)}${action ? `/${action}` : ""}`;
}

function retryAfterOf(response) {
  const value = response.headers.get("Retry-After");
  if (value == null) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return seconds;
  const date = Date.parse(value);
  return Number.isNaN(date) ? null : Math.max(0, Math.ceil((date - Date.now()) / 1000));
}

/** A LipstreamError from a non-2xx answer (its JSON error body, else its status line). */
async function errorFrom(response, what) {
  let data = null;
  try {
    data = JSON.parse(await response.text());
  } catch {
    data = null; // an error page from a proxy, say: report the HTTP status instead
  }
  const error = data?.error;
  const retryAfter = retryAfterOf(response);
  if (error && typeof error.code === "string") {
    return new LipstreamError(response.status, error.code, error.message || error.code, { retryAfter });
  }
  const message = `${what} failed: HTTP ${response.status} ${response.statusText}`.trim();
  return new LipstreamError(response.status, "http_error", message, { retryAfter });
}

/** fetch() one request of the API. Resolves its Response once it is a success; rejects with a LipstreamError. */
async function send(baseUrl, method, path, { json, body, contentType, token, timeoutMs, signal } = {}) {
  const url = urlOf(baseUrl, path);
  const headers = {};
  const init = { method, headers, mode: "cors" };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    init.body = body;
    if (contentType) headers["Content-Type"] = contentType;
  }
  const signals = [signal, timeoutMs ? AbortSignal.timeout(timeoutMs) : null].filter(Boolean);
  if (signals.length) init.signal = signals.length > 1 && AbortSignal.any ? AbortSignal.any(signals) : signals[0];
  const what = `${method} ${url.pathname}`;
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    if (signal?.aborted) throw signal.reason;
    throw new LipstreamError(0, "network_error", `Cannot reach the server (${what}): ${err.message}`, {
      cause: err,
    });
  }
  if (!response.ok) throw await errorFrom(response, what);
  return response;
}

/**
 * fetch() a JSON API. Resolves the parsed body (null when empty); rejects with a
 * LipstreamError.
 */
async function request(baseUrl, method, path, options = {}) {
  const response = await send(baseUrl, method, path, options);
  const text = await response.text();
  try {
    return text ? JSON.parse(text) : null;
  } catch (err) {
    const what = `${method} ${new URL(response.url).pathname}`;
    throw new LipstreamError(response.status, "http_error", `${what} answered something that is not JSON`, {
      cause: err,
    });
  }
}

/**
 * The avatars a caller may pick, each with the idle clips it can play while silent.
 * @param {string|URL} [baseUrl] the server (default: the one that served this module)
 * @param {{token?: string}} [options]
 * @returns {Promise<Array<{id: string, name: string, clips?: string[]}>>}
 */
export async function listAvatars(baseUrl, { token } = {}) {
  const data = await request(baseUrl, "GET", "avatars", { token });
  return data?.avatars ?? [];
}

/**
 * The server's WebRTC configuration: `iceServers` (STUN/TURN, ready for
 * `new RTCPeerConnection()`) and `delay` (what the server adds, and what a browser
 * typically adds on top).
 * @param {string|URL} [baseUrl] the server (default: the one that served this module)
 * @param {{token?: string}} [options]
 * @returns {Promise<{iceServers: RTCIceServer[], delay: object}>}
 */
export async function webrtcConfig(baseUrl, { token } = {}) {
  return (await request(baseUrl, "GET", "webrtc-config", { token })) ?? { iceServers: [] };
}

/**
 * Ask for the microphone, with a message a person can act on when it cannot be had
 * (rejects with a LipstreamError: `insecure_context`, `microphone_denied`, `no_microphone`).
 * @param {{raw?: boolean}} [options] raw: turn the browser's echo cancellation, noise
 *   suppression and gain control off (they can eat synthetic speech)
 * @returns {Promise<MediaStream>}
 */
export async function openMicrophone({ raw = false } = {}) {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new LipstreamError(
      0,
      "insecure_context",
      "This page cannot use a microphone: browsers allow it only over HTTPS or on localhost. " +
        "Start without microphone instead.",
    );
  }
  const processing = !raw;
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing },
      video: false,
    });
  } catch (err) {
    if (err.name === "NotAllowedError" || err.name === "SecurityError") {
      throw new LipstreamError(
        0,
        "microphone_denied",
        "Microphone access was denied: allow it for this site, or start without microphone.",
        { cause: err },
      );
    }
    if (err.name === "NotFoundError" || err.name === "OverconstrainedError") {
      throw new LipstreamError(0, "no_microphone", "No microphone was found: connect one, or start without microphone.", {
        cause: err,
      });
    }
    throw err;
  }
}

/**
 * `sdp` asking for the avatar's silence as Opus DTX (`usedtx=1`, RFC 7587): while the
 * avatar listens the server sends two audio packets per 400 ms instead of 50 a second,
 * and the browser plays that silence as it does in any WebRTC call. Only the copy sent
 * to the server changes; the browser's own description is left as it made it.
 */
export function withOpusDtx(sdp) {
  const pt = /^a=rtpmap:(\d+) opus\//im.exec(sdp)?.[1];
  if (!pt) return sdp;
  const fmtp = new RegExp(`^a=fmtp:${pt} (.*)$`, "m");
  const line = fmtp.exec(sdp);
  if (line) {
    return /(^|;)\s*usedtx=/.test(line[1]) ? sdp : sdp.replace(fmtp, (found) => `${found};usedtx=1`);
  }
  return sdp.replace(new RegExp(`^(a=rtpmap:${pt} .*)$`, "m"), `$1\r\na=fmtp:${pt} usedtx=1`);
}

/** Resolve once ICE gathering is complete, or after timeoutMs with what was gathered. */
function iceGatheringComplete(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => {
      if (pc.iceGatheringState === "complete") done();
    };
    const timer = setTimeout(done, timeoutMs);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

function connectionFailed() {
  return new LipstreamError(
    0,
    "connection_failed",
    "The media connection failed. If the server is on another network, it needs a TURN server " +
      "in server.ice_servers (or turn.urls and turn.secret).",
  );
}

function abortError(signal) {
  return signal.reason ?? new DOMException("The call was aborted.", "AbortError");
}

/**
 * Start a call: one WebRTC session with an avatar. Resolves once the media connection
 * (and the events data channel, when asked for) is up.
 *
 * @param {object} options
 * @param {string|URL} [options.baseUrl] the server (default: the one that served this module)
 * @param {string} [options.avatar] avatar id (see listAvatars); the server's default is `demo`
 * @param {string} [options.token] session token, when the server has auth.jwt_secret set
 * @param {MediaStream|null} [options.microphone] audio to send: the avatar lip-syncs it
 *   (see openMicrophone); the caller keeps ownership and stops its tracks
 * @param {boolean} [options.receiveAudio=true] receive the avatar's audio with the video
 * @param {boolean} [options.dataChannel=true] open the `lipstream` data channel: speech
 *   events arrive on the call, and interrupt() uses it
 * @param {boolean} [options.opusDtx=true] ask for the avatar's silence as Opus DTX
 *   (`usedtx=1`: few audio packets while it listens; see withOpusDtx)
 * @param {number} [options.iceGatheringTimeoutMs=5000] send the offer after this long
 *   even if ICE gathering has not completed
 * @param {number} [options.connectTimeoutMs=20000] how long the media connection may take
 *   once the server has answered (rejects with `connect_timeout`)
 * @param {AbortSignal} [options.signal] aborts the attempt (a session already made is ended)
 * @returns {Promise<Call>}
 */
export async function connect({
  baseUrl,
  avatar,
  token,
  microphone = null,
  receiveAudio = true,
  dataChannel = true,
  opusDtx = true,
  iceGatheringTimeoutMs = DEFAULT_ICE_GATHERING_TIMEOUT_MS,
  connectTimeoutMs = DEFAULT_CONNECT_TIMEOUT_MS,
  signal,
} = {}) {
  signal?.throwIfAborted();
  const config = await request(baseUrl, "GET", "webrtc-config", { token, signal });
  signal?.throwIfAborted();
  const pc = new RTCPeerConnection({ iceServers: config?.iceServers ?? [] });
  const call = new Call(pc, { baseUrl, token });
  try {
    pc.addTransceiver("video", { direction: "recvonly" });
    const micTrack = microphone?.getAudioTracks()[0];
    if (micTrack) {
      pc.addTransceiver(micTrack, { direction: receiveAudio ? "sendrecv" : "sendonly", streams: [microphone] });
    } else if (receiveAudio) {
      pc.addTransceiver("audio", { direction: "recvonly" });
    }
    if (dataChannel) call._useChannel(pc.createDataChannel(EVENTS_CHANNEL));
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, iceGatheringTimeoutMs);
    signal?.throwIfAborted();
    const offer = pc.localDescription;
    // Not aborted midway: the server may have made the session, and only its answer names it.
    const answer = await request(baseUrl, "POST", "offer", {
      json: {
        sdp: opusDtx ? withOpusDtx(offer.sdp) : offer.sdp,
        type: offer.type,
        avatar: avatar || undefined,
      },
      token,
    });
    call._started(answer, avatar);
    signal?.throwIfAborted(); // aborted while the server answered: end the session it made
    await pc.setRemoteDescription({ type: answer.type, sdp: answer.sdp });
    call._watchTransport();
    await call._connected(connectTimeoutMs, signal);
    return call;
  } catch (err) {
    await call._end("connect failed", err, { hangUp: true }).catch(() => {});
    throw signal?.aborted ? abortError(signal) : err;
  }
}

/**
 * Open a session that no caller owns (`POST /sessions`): the avatar's media runs from
 * now on, for viewers (see watch()). It speaks what the session API gives it
 * (`POST /sessions/{id}/say`, `/audio`, the audio stream) and ends with endSession().
 * @param {string|URL} [baseUrl] the server (default: the one that served this module)
 * @param {{avatar?: string, token?: string}} [options] avatar: an avatar id (the server's
 *   default is `demo`); token: when the server has auth.jwt_secret set
 * @returns {Promise<{session_id: string, avatar: string, whep: string, delay: object}>}
 *   `whep`: the path viewers offer to
 */
export async function createSession(baseUrl, { avatar, token } = {}) {
  return request(baseUrl, "POST", "sessions", { json: { avatar: avatar || undefined }, token });
}

/**
 * End a session (`DELETE /sessions/{id}`): one made by createSession(), or a call. Its
 * viewers get `session_ended` and end with it. Rejects with `session_not_found` if it
 * has already ended.
 * @param {string|URL} [baseUrl] the server (default: the one that served this module)
 * @param {string} sessionId
 * @param {{token?: string}} [options]
 * @returns {Promise<void>}
 */
export async function endSession(baseUrl, sessionId, { token } = {}) {
  if (!sessionId) throw new TypeError("endSession() needs the sessionId of the session to end");
  await request(baseUrl, "DELETE", sessionPath(sessionId), { token });
}

/** The ICE servers of a Link header (RFC 9725: `<url>; rel="ice-server"; username=…; credential=…`). */
function iceServersOf(link) {
  const servers = [];
  const links = /<([^>]*)>((?:\s*;\s*[^;,=\s]+\s*=\s*(?:"(?:[^"\\]|\\.)*"|[^;,]*))*)/g;
  for (const [, url, params] of (link ?? "").matchAll(links)) {
    const fields = {};
    for (const [, name, raw] of params.matchAll(/;\s*([^;,=\s]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;,]*)/g)) {
      fields[name.toLowerCase()] = raw.startsWith('"') ? raw.slice(1, -1).replace(/\\(.)/g, "$1") : raw.trim();
    }
    if (!(fields.rel ?? "").split(/\s+/).includes("ice-server")) continue;
    const server = { urls: url.trim() };
    if (fields.username !== undefined) server.username = fields.username;
    if (fields.credential !== undefined) server.credential = fields.credential;
    servers.push(server);
  }
  return servers;
}

/**
 * Watch a session over WHEP: receive its video, audio and events, and send nothing. Any
 * session can be watched: one made by createSession(), or a call. Resolves once the
 * media connection (and the events data channel, when asked for) is up.
 *
 * The offer is receive-only (H.264 video, Opus audio unless `receiveAudio` is false, the
 * `lipstream` data channel unless `dataChannel` is false), sent with every ICE candidate
 * in it as the body of `POST /sessions/{id}/whep`; the answer's Location is the viewer
 * (leave() deletes it). Refusals reject with the server's LipstreamError:
 * `session_not_found`, `too_many_viewers` (retryAfter set), `unauthorized`, `bad_offer`.
 *
 * @param {object} options
 * @param {string|URL} [options.baseUrl] the server (default: the one that served this module)
 * @param {string} options.sessionId the session to watch
 * @param {HTMLMediaElement|null} [options.video] an element to play the session in (its
 *   srcObject is set to viewer.stream once connected); or attach viewer.stream yourself
 * @param {string} [options.token] session token, when the server has auth.jwt_secret set
 * @param {RTCIceServer[]} [options.iceServers] STUN/TURN servers; by default the server's
 *   (`GET /webrtc-config`, the same as the answer's Link headers list: the offer carries
 *   every candidate, so they must be known before it is made)
 * @param {boolean} [options.receiveAudio=true] receive the avatar's voice with the video
 * @param {boolean} [options.dataChannel=true] open the `lipstream` data channel: the
 *   session's events arrive on the viewer
 * @param {boolean} [options.opusDtx=true] ask for the avatar's silence as Opus DTX (see withOpusDtx)
 * @param {number} [options.iceGatheringTimeoutMs=5000] as for connect()
 * @param {number} [options.connectTimeoutMs=20000] as for connect()
 * @param {AbortSignal} [options.signal] aborts the attempt (a viewer already answered leaves)
 * @returns {Promise<Viewer>}
 */
export async function watch({
  baseUrl,
  sessionId,
  video = null,
  token,
  iceServers,
  receiveAudio = true,
  dataChannel = true,
  opusDtx = true,
  iceGatheringTimeoutMs = DEFAULT_ICE_GATHERING_TIMEOUT_MS,
  connectTimeoutMs = DEFAULT_CONNECT_TIMEOUT_MS,
  signal,
} = {}) {
  if (!sessionId || typeof sessionId !== "string") {
    throw new TypeError("watch() needs the sessionId of the session to watch");
  }
  if (video != null && !(video instanceof HTMLMediaElement)) {
    throw new TypeError("watch({video}) takes a <video> (or <audio>) element");
  }
  signal?.throwIfAborted();
  const servers = iceServers ?? (await request(baseUrl, "GET", "webrtc-config", { token, signal }))?.iceServers;
  signal?.throwIfAborted();
  const pc = new RTCPeerConnection({ iceServers: servers ?? [] });
  const viewer = new Viewer(pc, { baseUrl, token, sessionId });
  try {
    pc.addTransceiver("video", { direction: "recvonly" });
    if (receiveAudio) pc.addTransceiver("audio", { direction: "recvonly" });
    if (dataChannel) viewer._useChannel(pc.createDataChannel(EVENTS_CHANNEL));
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, iceGatheringTimeoutMs);
    signal?.throwIfAborted();
    const offer = pc.localDescription.sdp;
    // Not aborted midway: the server may have made the viewer, and only its answer names it.
    const response = await send(baseUrl, "POST", sessionPath(sessionId, "whep"), {
      body: opusDtx ? withOpusDtx(offer) : offer,
      contentType: SDP,
      token,
    });
    const answer = await response.text();
    viewer._joined(response.headers.get("Location"), response.headers.get("Link"));
    signal?.throwIfAborted(); // aborted while the server answered: the viewer leaves
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
    viewer._watchTransport();
    await viewer._connected(connectTimeoutMs, signal);
    if (video) {
      video.srcObject = viewer.stream;
      video.play().catch((err) => {
        if (err.name === "NotAllowedError") video.controls = true; // autoplay with sound refused: press play
      });
    }
    return viewer;
  } catch (err) {
    await viewer._end("watch failed", err, { hangUp: true }).catch(() => {});
    throw signal?.aborted ? abortError(signal) : err;
  }
}

/**
 * A call in progress, made by connect(). An EventTarget dispatching:
 * - each server event received on the `lipstream` data channel (docs/apps.md) as a
 *   CustomEvent of its type (`speech_started`, `speech_ended` with `played_ms` and
 *   `interrupted`, `interrupted` with `played`, `avatar_changed`, `idle_clip_changed`,
 *   `queued_ms`, `session_ended`, `error` for a data channel request the server refused,
 *   …) whose `detail` is the event's JSON; every one is also dispatched as `event`, for
 *   logs;
 * - `connectionstatechange` (detail: `{state}`, the peer connection's state);
 * - `ended` once, when the call is over for any reason (detail: `{reason, error}`; error
 *   is null after hangUp() and when the server ended the session (reason: the
 *   `session_ended` event's, or `ended by the server` when the connection closed without
 *   it), a LipstreamError after a failure).
 */
export class Call extends EventTarget {
  /** @internal use connect() */
  constructor(pc, { baseUrl, token }) {
    super();
    /** The peer connection. @type {RTCPeerConnection} */
    this.pc = pc;
    /** The server's session id (null until the server has answered). @type {string|null} */
    this.sessionId = null;
    /** The avatar's video and audio: attach it to a <video>. @type {MediaStream} */
    this.stream = new MediaStream();
    /** The delay the server adds to this call (`server_ms` and its parts). @type {object|null} */
    this.delay = null;
    /** The `lipstream` data channel, or null. @type {RTCDataChannel|null} */
    this.dataChannel = null;
    /** The `seq` of the last server event received (0: none yet). @type {number} */
    this.lastSeq = 0;
    /** The avatar the call shows: the one asked for, then each `avatar_changed`'s. @type {string|null} */
    this.avatar = null;
    /** The idle clip playing while the avatar is silent, once known. @type {string|null} */
    this.idleClip = null;
    this._baseUrl = baseUrl;
    this._token = token;
    this._ended = null; // the hang-up promise, once the call is ending
    this._streams = new Set();
    this._onPageHide = () => this._leavePage();
    pc.addEventListener("track", (event) => {
      if (!this.stream.getTrackById(event.track.id)) this.stream.addTrack(event.track);
    });
    pc.addEventListener("connectionstatechange", () => this._onConnectionState());
    globalThis.addEventListener?.("pagehide", this._onPageHide);
  }

  /** True once the call has ended (or is ending). @type {boolean} */
  get closed() {
    return this._ended !== null;
  }

  /**
   * Speak text through the server's text-to-speech engine.
   * @param {string} text
   * @param {{voice?: string}} [options] an engine voice such as `en`, `en-us`, `en+f3`
   * @returns {Promise<{duration_ms: number, queued_ms: number, utterance?: number}>}
   */
  say(text, { voice } = {}) {
    return this._request("POST", "say", { json: voice ? { text, voice } : { text } });
  }

  /**
   * Speak audio: a file (WAV, MP3, OGG, FLAC…) or raw PCM, named by contentType
   * (`audio/wav`, `audio/L16; rate=16000`, …; a Blob's own type by default).
   * @param {Blob|ArrayBuffer|ArrayBufferView} audio
   * @param {string} [contentType]
   * @returns {Promise<{duration_ms: number, queued_ms: number, utterance?: number}>}
   */
  pushAudio(audio, contentType) {
    const type = contentType || (audio instanceof Blob ? audio.type : "");
    if (!type) return Promise.reject(new TypeError("pushAudio needs a contentType for this audio"));
    return this._request("POST", "audio", { body: audio, contentType: type });
  }

  /**
   * Drop queued audio and frames: the avatar is idle again at once. Sent on the data
   * channel when it is open (an `interrupted` event follows), else as
   * `POST /sessions/{id}/interrupt`; `{transport: "http"}` always uses the request.
   * @param {{transport?: "auto"|"http"}} [options]
   * @returns {Promise<{dropped_ms?: number, via: "datachannel"|"http"}>}
   */
  async interrupt({ transport = "auto" } = {}) {
    if (transport !== "http" && this.dataChannel?.readyState === "open") {
      this.dataChannel.send(JSON.stringify({ type: "interrupt" }));
      return { via: "datachannel" };
    }
    return { ...(await this._request("POST", "interrupt")), via: "http" };
  }

  /**
   * Show another avatar in this call (`POST /sessions/{id}/avatar`): resolves once its
   * model is loaded and the switch is scheduled, with `{avatar, previous, changed, frame,
   * media_ms}` (`frame`: the first frame of the new avatar, null when `changed` is
   * false); `avatar_changed` follows
   * when that frame is sent, and the <video> follows a new frame size by itself. Rejects
   * with `model_not_found`, `avatar_incompatible` (another fps or audio features),
   * `avatar_switch_busy`, `no_capacity`, `shutting_down`, `model_load_failed`…: the call
   * goes on with the old avatar. `{transport: "datachannel"}` sends it on the data
   * channel instead and resolves at once (`{via: "datachannel"}`); the outcome is then an
   * `avatar_changed` or `error` event.
   * @param {string} avatar an avatar id (see listAvatars)
   * @param {{transport?: "http"|"datachannel"}} [options]
   * @returns {Promise<object>}
   */
  async switchAvatar(avatar, { transport = "http" } = {}) {
    if (transport === "datachannel") return this._sendOnChannel({ type: "switch_avatar", avatar });
    const answer = await this._request("POST", "avatar", { json: { avatar } });
    if (answer?.avatar) this.avatar = answer.avatar;
    return { ...answer, via: "http" };
  }

  /**
   * Play the idle clip `clip` while the avatar is silent (`POST /sessions/{id}/idle`):
   * resolves with `{clip, previous, clips}`; an unknown clip rejects with
   * `clip_not_found`, whose message names the avatar's clips. `{transport:
   * "datachannel"}` as for switchAvatar.
   * @param {string} clip a clip of the avatar's (listAvatars, or state().clips)
   * @param {{transport?: "http"|"datachannel"}} [options]
   * @returns {Promise<object>}
   */
  async setIdleClip(clip, { transport = "http" } = {}) {
    if (transport === "datachannel") return this._sendOnChannel({ type: "set_idle_clip", clip });
    const answer = await this._request("POST", "idle", { json: { clip } });
    if (answer?.clip) this.idleClip = answer.clip;
    return { ...answer, via: "http" };
  }

  /**
   * The session's state and counters (`GET /sessions/{id}`): `avatar`, `idle_clip`,
   * `clips`, frames sent, delay figures, `app_audio`…
   * @returns {Promise<object>}
   */
  state() {
    return this._request("GET", "");
  }

  /**
   * The figures a page shows, from the peer connection's stats: `fps`, `framesDecoded`,
   * `width`, `height`, `codec` (e.g. `video/H264`), `rttMs`, `state` (the connection
   * state) and `timestamp` (ms, the inbound video report's own clock); and how the link
   * treats the video: `bytesReceived`, `packetsReceived`, `packetsLost`, `freezes` (the
   * browser's own count), `jitterBufferMs` (the mean jitter-buffer delay so far),
   * `audioConcealed` (the share of the voice's samples the browser had to make up) and
   * `audioEnergy` (the voice's total audio energy so far: it grows only while the avatar
   * is heard).
   * Two readings give the received bitrate: bytes over the timestamps' difference.
   * @returns {Promise<{fps: number|null, framesDecoded: number, width: number|null,
   *   height: number|null, codec: string|null, rttMs: number|null, state: string,
   *   timestamp: number|null, bytesReceived: number, packetsReceived: number,
   *   packetsLost: number, freezes: number|null, jitterBufferMs: number|null,
   *   audioConcealed: number|null, audioEnergy: number|null}>}
   */
  async stats() {
    return readStats(await this.pc.getStats(), this.pc.connectionState);
  }

  /**
   * Open a WebSocket that streams PCM audio in as it is made (a streaming TTS, say):
   * `GET /sessions/{id}/audio/stream`. Resolves once the server is ready; a refusal
   * rejects with the server's LipstreamError, asked over plain HTTP
   * (`bad_stream_format`, `session_not_found`, `unauthorized`, `stream_busy` for a
   * second stream into the session), else with `stream_failed` (a proxy on the way
   * that does not pass WebSockets).
   * @param {{format?: "s16le"|"f32le", rate?: number}} [options] the wire format (rate:
   *   16000, 22050, 24000, 44100 or 48000 Hz); typed arrays given to send() are converted
   *   to it, ArrayBuffers must already be in it
   * @returns {Promise<AudioStream>}
   */
  async streamAudio({ format = "s16le", rate = 16000 } = {}) {
    this._requireLive();
    const url = urlOf(this._baseUrl, sessionPath(this.sessionId, "audio/stream"));
    url.search = new URLSearchParams({ format, rate: String(rate), channels: "1" }).toString();
    if (this._token) url.searchParams.set("token", this._token); // browsers cannot set headers
    const stream = new AudioStream(url, format, rate);
    this._streams.add(stream);
    stream.addEventListener("close", () => this._streams.delete(stream));
    await stream._opened;
    return stream;
  }

  /**
   * End the call: the session on the server, then the peer connection. Resolves once the
   * server has answered (a session it has already ended is fine); calling it again
   * returns the same promise.
   * @returns {Promise<void>}
   */
  hangUp() {
    return this._end("hung up", null, { hangUp: true });
  }

  // --- internals ------------------------------------------------------------------------

  _useChannel(channel) {
    this.dataChannel = channel;
    channel.addEventListener("message", (event) => {
      if (typeof event.data !== "string") return;
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        console.warn("lipstream: a data channel message that is not JSON", event.data);
        return;
      }
      if (message && typeof message.type === "string") this._serverEvent(message);
    });
  }

  _sendOnChannel(message) {
    this._requireLive();
    if (this.dataChannel?.readyState !== "open") {
      throw new LipstreamError(0, "stream_closed", "The call's data channel is not open.");
    }
    this.dataChannel.send(JSON.stringify(message));
    return { via: "datachannel" };
  }

  _serverEvent(message) {
    if (typeof message.seq === "number") this.lastSeq = Math.max(this.lastSeq, message.seq);
    if (message.type === "avatar_changed") this.avatar = message.avatar ?? this.avatar;
    else if (message.type === "idle_clip_changed") this.idleClip = message.clip ?? this.idleClip;
    this.dispatchEvent(new CustomEvent(message.type, { detail: message }));
    this.dispatchEvent(new CustomEvent("event", { detail: message }));
    if (message.type === "session_ended" && !this.closed) {
      this._end(message.reason ?? "session ended", null, { hangUp: false });
    }
  }

  _started(answer, avatar) {
    this.sessionId = answer.session_id;
    this.avatar = answer.avatar ?? avatar ?? null;
    this.delay = answer.delay ?? null;
  }

  /** Resolve once connected (and the data channel is open); reject on failure or timeout. */
  _connected(timeoutMs, signal) {
    const channel = this.dataChannel;
    const ready = () => this.pc.connectionState === "connected" && (!channel || channel.readyState === "open");
    if (ready()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const cleanup = () => {
        clearTimeout(timer);
        this.pc.removeEventListener("connectionstatechange", check);
        channel?.removeEventListener("open", check);
        channel?.removeEventListener("close", check);
        signal?.removeEventListener("abort", check);
      };
      const check = () => {
        let error = null;
        if (signal?.aborted) error = abortError(signal);
        else if (this.pc.connectionState === "failed" || this.pc.connectionState === "closed") {
          error = connectionFailed();
        } else if (channel?.readyState === "closed") {
          error = new LipstreamError(0, "connection_failed", "The server closed the events data channel.");
        }
        if (error) {
          cleanup();
          reject(error);
        } else if (ready()) {
          cleanup();
          resolve();
        }
      };
      const timer = setTimeout(() => {
        cleanup();
        const what = this.pc.connectionState === "connected" ? "No events data channel" : "No media connection";
        reject(new LipstreamError(0, "connect_timeout", `${what} after ${timeoutMs / 1000} s.`));
      }, timeoutMs);
      this.pc.addEventListener("connectionstatechange", check);
      channel?.addEventListener("open", check);
      channel?.addEventListener("close", check);
      signal?.addEventListener("abort", check);
    });
  }

  _onConnectionState() {
    const state = this.pc.connectionState;
    this.dispatchEvent(new CustomEvent("connectionstatechange", { detail: { state } }));
    if (state === "failed" && !this.closed && this.sessionId) {
      if (this._closedByServer()) this._end("ended by the server", null, { hangUp: false });
      else this._end("connection failed", connectionFailed(), { hangUp: true }).catch(() => {});
    }
  }

  _dtlsTransport() {
    return this.pc.sctp?.transport ?? this.pc.getReceivers()[0]?.transport ?? null;
  }

  /** True once the server has closed DTLS cleanly (close_notify): it ended the session. */
  _closedByServer() {
    return this._dtlsTransport()?.state === "closed";
  }

  /** End the call as soon as the server closes DTLS: the connection state would take
   * seconds to turn "failed" (ICE consent) after it. */
  _watchTransport() {
    const transport = this._dtlsTransport();
    transport?.addEventListener("statechange", () => {
      if (transport.state === "closed" && !this.closed && this.sessionId) {
        this._end("ended by the server", null, { hangUp: false });
      }
    });
  }

  /** End the call once; `hangUp` ends the server's session first. */
  _end(reason, error, { hangUp }) {
    if (this._ended) return this._ended;
    this._ended = (async () => {
      globalThis.removeEventListener?.("pagehide", this._onPageHide);
      for (const stream of this._streams) stream.close();
      try {
        if (hangUp && this._endPath()) await this._deleteOnServer();
      } finally {
        // Close only after the server has answered: a closed connection makes the server
        // end the session on its own, and the hang-up would then race it.
        this.pc.close();
        this.dispatchEvent(new CustomEvent("connectionstatechange", { detail: { state: "closed" } }));
        this.dispatchEvent(new CustomEvent("ended", { detail: { reason, error } }));
      }
    })();
    return this._ended;
  }

  /** What ending it deletes on the server: the call's session (null before it has one). */
  _endPath() {
    return this.sessionId ? sessionPath(this.sessionId) : null;
  }

  async _deleteOnServer() {
    try {
      await request(this._baseUrl, "DELETE", this._endPath(), {
        token: this._token,
        timeoutMs: HANG_UP_TIMEOUT_MS,
      });
    } catch (err) {
      if (!(err instanceof LipstreamError && err.status === 404)) throw err;
    }
  }

  /** Leaving the page: end the session without waiting (keepalive outlives the page). */
  _leavePage() {
    if (this.closed) return;
    this._ended = Promise.resolve();
    const path = this._endPath();
    if (path) {
      const headers = this._token ? { Authorization: `Bearer ${this._token}` } : {};
      fetch(urlOf(this._baseUrl, path), { method: "DELETE", headers, keepalive: true }).catch(
        () => {}, // the page is going away: nobody is left to tell
      );
    }
    for (const stream of this._streams) stream.close();
    this.pc.close();
  }

  _requireLive() {
    if (this.closed) throw new LipstreamError(0, "call_ended", "The call has ended.");
    if (!this.sessionId) throw new LipstreamError(0, "call_ended", "The call has no session yet.");
  }

  async _request(method, action, options = {}) {
    this._requireLive();
    return request(this._baseUrl, method, sessionPath(this.sessionId, action), { ...options, token: this._token });
  }
}

/**
 * A viewer of a session, made by watch(): what a Call receives (`stream`, the session's
 * events on the `lipstream` data channel, `stats()`, `state()`), and nothing sent. It
 * dispatches what a Call does; `ended` has the reason `left` after leave(), or the
 * `session_ended` event's when the session ends. The session's own requests (say(),
 * pushAudio(), interrupt(), … over HTTP) work as a call's do; the data channel carries
 * events only, so interrupt() always goes over HTTP.
 */
export class Viewer extends Call {
  /** @internal use watch() */
  constructor(pc, { baseUrl, token, sessionId }) {
    super(pc, { baseUrl, token });
    this.sessionId = sessionId;
    /** The viewer on the server (its answer's Location: leave() deletes it), once answered. @type {string|null} */
    this.location = null;
    /** The viewer's id, once answered. @type {string|null} */
    this.viewerId = null;
    /** The ICE servers the server listed for this viewer (its answer's Link headers). @type {RTCIceServer[]} */
    this.iceServers = [];
  }

  /**
   * Stop watching: `DELETE` the viewer, then close the peer connection; the session goes
   * on. Resolves once the server has answered (a viewer already gone is fine); calling it
   * again returns the same promise.
   * @returns {Promise<void>}
   */
  leave() {
    return this._end("left", null, { hangUp: true });
  }

  /** leave(). @returns {Promise<void>} */
  close() {
    return this.leave();
  }

  /** leave(): a viewer never ends the session it watches (endSession() does). @returns {Promise<void>} */
  hangUp() {
    return this.leave();
  }

  /** Call.interrupt(), always over HTTP (a viewer's data channel takes no requests). */
  interrupt(options = {}) {
    return super.interrupt({ ...options, transport: "http" });
  }

  _joined(location, link) {
    // A page of another origin reads the Location only if the server exposes it; without
    // it, leave() closes the connection and the server drops the viewer when it notices.
    this.location = location;
    this.viewerId = location ? decodeURIComponent(location.replace(/\/+$/, "").split("/").pop()) : null;
    this.iceServers = iceServersOf(link);
  }

  _endPath() {
    return this.location;
  }
}

/**
 * An audio stream into a call (Call.streamAudio()): PCM goes in as it is made, and the
 * avatar starts speaking on the first chunk. An EventTarget dispatching each server
 * message as a CustomEvent of its type (`ready`, `queued_ms`, `speech_started`,
 * `speech_ended`, `interrupted`, `avatar_changed`, `idle_clip_changed`, `session_ended`,
 * and `error` for a refused message: detail `{code, message, …}`, the stream stays
 * open), each also as `message`; and `close` once (detail: `{code, reason, wasClean}`).
 */
export class AudioStream extends EventTarget {
  /** @internal use Call.streamAudio() */
  constructor(url, format, rate) {
    super();
    /** `s16le` or `f32le`: the bytes send() puts on the wire. @type {string} */
    this.format = format;
    /** Samples per second. @type {number} */
    this.rate = rate;
    /** The last `queued_ms` the server reported (audio waiting in the session). @type {number|null} */
    this.queuedMs = null;
    /** The server's `ready` message (max_buffer_ms…), once open. @type {object|null} */
    this.ready = null;
    this._url = url;
    this._socket = new WebSocket(url.href.replace(/^http/, "ws"));
    this._socket.binaryType = "arraybuffer";
    this._opened = new Promise((resolve, reject) => {
      this._resolveOpen = resolve;
      this._rejectOpen = reject;
    });
    this._socket.addEventListener("message", (event) => this._onMessage(event));
    this._socket.addEventListener("close", (event) => this._onClose(event));
  }

  /** Bytes queued in the browser, not yet sent (back-pressure). @type {number} */
  get bufferedAmount() {
    return this._socket.bufferedAmount;
  }

  /** True while audio can be sent. @type {boolean} */
  get open() {
    return this.ready !== null && this._socket.readyState === WebSocket.OPEN;
  }

  /**
   * Send audio. An Int16Array or Float32Array (mono samples in [-1, 1] for floats) is
   * converted to the stream's format; an ArrayBuffer must already be in it. Chunks longer
   * than one second are split (the server takes at most 1 s per message).
   * @param {Int16Array|Float32Array|ArrayBuffer} audio
   */
  send(audio) {
    if (!this.open) throw new LipstreamError(0, "stream_closed", "The audio stream is not open.");
    const bytes = toWireBytes(audio, this.format);
    const width = this.format === "s16le" ? 2 : 4;
    const step = this.rate * width;
    for (let at = 0; at < bytes.byteLength; at += step) {
      this._socket.send(bytes.subarray(at, Math.min(at + step, bytes.byteLength)));
    }
  }

  /** The open utterance is complete: `speech_ended` follows once it has played. */
  end() {
    this._sendJson({ type: "end" });
  }

  /** Drop everything queued in the session (as Call.interrupt() does). */
  interrupt() {
    this._sendJson({ type: "interrupt" });
  }

  /** Show another avatar (as Call.switchAvatar()); `avatar_changed` or `error` follows. */
  switchAvatar(avatar) {
    this._sendJson({ type: "switch_avatar", avatar });
  }

  /** Play the idle clip `clip` while silent; `idle_clip_changed` or `error` follows. */
  setIdleClip(clip) {
    this._sendJson({ type: "set_idle_clip", clip });
  }

  /** Close the stream; its open utterance plays out. */
  close() {
    if (this._socket.readyState <= WebSocket.OPEN) this._socket.close(1000);
  }

  _sendJson(message) {
    if (!this.open) throw new LipstreamError(0, "stream_closed", "The audio stream is not open.");
    this._socket.send(JSON.stringify(message));
  }

  _onMessage(event) {
    if (typeof event.data !== "string") return;
    let message;
    try {
      message = JSON.parse(event.data);
    } catch {
      console.warn("lipstream: a stream message that is not JSON", event.data);
      return;
    }
    if (!message || typeof message.type !== "string") return;
    if (message.type === "ready") {
      this.ready = message;
      this._resolveOpen(this);
    }
    if (typeof message.queued_ms === "number") this.queuedMs = message.queued_ms;
    this.dispatchEvent(new CustomEvent(message.type, { detail: message }));
    this.dispatchEvent(new CustomEvent("message", { detail: message }));
  }

  async _onClose(event) {
    if (!this.ready) this._rejectOpen(await this._refusal(event));
    this.dispatchEvent(
      new CustomEvent("close", { detail: { code: event.code, reason: event.reason, wasClean: event.wasClean } }),
    );
  }

  /**
   * Why the stream did not open. Browsers hide a refused handshake's answer, so ask the
   * same URL over plain HTTP: the server checks the session, the token, the format and
   * whether a stream is open already before anything else and answers their JSON error
   * (400 bad_stream_format, 401, 404, 409 stream_busy). Past those it wants a WebSocket
   * (400 websocket_required): then something between us and it refused the upgrade.
   */
  async _refusal(event) {
    let answer = null;
    try {
      await request(this._url.origin, "GET", this._url.pathname + this._url.search);
    } catch (err) {
      answer = err instanceof LipstreamError ? err : null;
    }
    const known = answer && !["http_error", "network_error", "websocket_required"].includes(answer.code);
    if (known) return answer;
    const closed = `close code ${event.code}${event.reason ? `: ${event.reason}` : ""}`;
    const why =
      answer?.code === "websocket_required"
        ? "the server would take this stream, so a proxy on the way does not pass WebSockets"
        : "the server could not be asked why";
    return new LipstreamError(0, "stream_failed", `The audio stream did not open (${closed}): ${why}.`);
  }
}

/** The bytes of `audio` in `format` (little-endian), as a Uint8Array. */
function toWireBytes(audio, format) {
  if (audio instanceof ArrayBuffer) return new Uint8Array(audio);
  if (audio instanceof Int16Array) {
    if (format === "s16le") return littleEndian(audio, 2);
    return littleEndian(Float32Array.from(audio, (s) => s / 32768), 4);
  }
  if (audio instanceof Float32Array) {
    if (format === "f32le") return littleEndian(audio, 4);
    const pcm = new Int16Array(audio.length);
    for (let i = 0; i < audio.length; i++) {
      const s = Math.max(-1, Math.min(1, audio[i]));
      pcm[i] = Math.round(s < 0 ? s * 0x8000 : s * 0x7fff);
    }
    return littleEndian(pcm, 2);
  }
  throw new TypeError("send() takes an Int16Array, a Float32Array or an ArrayBuffer");
}

function littleEndian(samples, width) {
  const bytes = new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength);
  if (LITTLE_ENDIAN) return bytes;
  const out = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i += width) {
    for (let j = 0; j < width; j++) out[i + j] = bytes[i + width - 1 - j];
  }
  return out;
}

/** Pick the figures a page shows out of an RTCStatsReport (Chromium, Firefox, Safari). */
function readStats(report, state) {
  let video = null;
  let audio = null;
  let selectedPairId = null;
  const pairs = [];
  for (const s of report.values()) {
    if (s.type === "inbound-rtp" && (s.kind ?? s.mediaType) === "video") video = s;
    else if (s.type === "inbound-rtp" && (s.kind ?? s.mediaType) === "audio") audio = s;
    else if (s.type === "transport" && s.selectedCandidatePairId) selectedPairId = s.selectedCandidatePairId;
    else if (s.type === "candidate-pair") pairs.push(s);
  }
  const pair =
    pairs.find((p) => p.id === selectedPairId) ??
    pairs.find((p) => p.selected) ?? // Firefox marks the pair instead of the transport
    pairs.find((p) => p.nominated && p.state === "succeeded");
  const codec = video?.codecId ? report.get(video.codecId) : undefined;
  const rtt = pair?.currentRoundTripTime;
  return {
    fps: video?.framesPerSecond ?? null,
    framesDecoded: video?.framesDecoded ?? 0,
    width: video?.frameWidth ?? null,
    height: video?.frameHeight ?? null,
    codec: codec?.mimeType ?? null,
    rttMs: rtt == null ? null : Math.round(rtt * 10000) / 10,
    state,
    timestamp: video?.timestamp ?? null,
    bytesReceived: video?.bytesReceived ?? 0,
    packetsReceived: video?.packetsReceived ?? 0,
    packetsLost: Math.max(0, video?.packetsLost ?? 0),
    freezes: video?.freezeCount ?? null,
    jitterBufferMs: video?.jitterBufferEmittedCount
      ? Math.round((1000 * video.jitterBufferDelay) / video.jitterBufferEmittedCount)
      : null,
    audioConcealed: audio?.totalSamplesReceived
      ? audio.concealedSamples / audio.totalSamplesReceived
      : null,
    audioEnergy: audio?.totalAudioEnergy ?? null,
  };
}
