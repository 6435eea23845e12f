// lipstream demo page: one WebRTC call to the server, controls that make the avatar
// speak, and live receive stats (also published as window.lipstreamStats for tests).
//
// Signalling is one HTTP exchange: aiortc has no trickle ICE, so the offer is sent only
// once ICE gathering is complete and carries every candidate.

const ICE_GATHERING_TIMEOUT_MS = 5000;
const CONNECT_TIMEOUT_MS = 20000;
const STATS_INTERVAL_MS = 1000;
const HANG_UP_TIMEOUT_MS = 5000;

const EMPTY_STATS = Object.freeze({
  fps: null,
  framesDecoded: 0,
  width: null,
  height: null,
  codec: null,
  rttMs: null,
  state: "disconnected",
  timestamp: null, // ms, the inbound video report's own clock: lets tests compute fps
});

const $ = (id) => document.getElementById(id);
const ui = {
  avatar: $("avatar"),
  startMic: $("start-mic"),
  startNoMic: $("start-no-mic"),
  hangUp: $("hang-up"),
  playSample: $("play-sample"),
  interrupt: $("interrupt"),
  sayForm: $("say-form"),
  sayText: $("say-text"),
  say: $("say"),
  status: $("status"),
  video: $("video"),
  stats: {
    state: $("stat-state"),
    fps: $("stat-fps"),
    frames: $("stat-frames"),
    resolution: $("stat-resolution"),
    codec: $("stat-codec"),
    rtt: $("stat-rtt"),
  },
};

// Tests turn the browser's voice processing off (?raw_audio=1): it can eat synthetic speech.
const rawAudio = new URLSearchParams(location.search).get("raw_audio") === "1";

let avatarsLoaded = false;
// The call in progress: {pc, sessionId, localStream, statsTimer, connectTimer}, or null.
let call = null;

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

/** fetch() a JSON API; a non-2xx answer throws ApiError with the server's message. */
async function api(method, path, { json, body, contentType, timeoutMs } = {}) {
  const init = { method, headers: {} };
  if (timeoutMs) init.signal = AbortSignal.timeout(timeoutMs);
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    init.body = body;
    init.headers["Content-Type"] = contentType;
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new Error(`Cannot reach the server (${method} ${path}): ${err.message}`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null; // an error page from a proxy, say: report the HTTP status instead
  }
  if (!response.ok) {
    const message =
      data?.error?.message ?? `${method} ${path} failed: HTTP ${response.status} ${response.statusText}`;
    throw new ApiError(response.status, data?.error?.code ?? "http_error", message);
  }
  return data;
}

function showStatus(text, kind = "info") {
  ui.status.textContent = text;
  ui.status.dataset.kind = kind;
}

function showError(err) {
  console.warn(err);
  showStatus(err?.message || String(err), "error");
}

/** Enable what makes sense in this phase: "idle", "connecting" or "connected". */
function setCallState(phase) {
  document.body.dataset.call = phase;
  const idle = phase === "idle";
  ui.avatar.disabled = !idle || !avatarsLoaded;
  ui.startMic.disabled = !idle || !avatarsLoaded;
  ui.startNoMic.disabled = !idle || !avatarsLoaded;
  ui.hangUp.disabled = idle;
  for (const control of [ui.playSample, ui.interrupt, ui.sayText, ui.say]) {
    control.disabled = phase !== "connected";
  }
}

function publishStats(stats) {
  window.lipstreamStats = Object.freeze(stats);
  const dash = "–";
  ui.stats.state.textContent = stats.state;
  ui.stats.fps.textContent = stats.fps == null ? dash : String(Math.round(stats.fps));
  ui.stats.frames.textContent = stats.framesDecoded ? String(stats.framesDecoded) : dash;
  ui.stats.resolution.textContent = stats.width ? `${stats.width}×${stats.height}` : dash;
  ui.stats.codec.textContent = stats.codec ?? dash;
  ui.stats.rtt.textContent = stats.rttMs == null ? dash : `${stats.rttMs} ms`;
}

/** Pick the figures the page shows out of an RTCStatsReport (Chromium, Firefox, Safari). */
function readStats(report, state) {
  let video = null;
  let selectedPairId = null;
  const pairs = [];
  for (const s of report.values()) {
    if (s.type === "inbound-rtp" && (s.kind ?? s.mediaType) === "video") video = s;
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
    width: video?.frameWidth ?? (ui.video.videoWidth || null),
    height: video?.frameHeight ?? (ui.video.videoHeight || null),
    codec: codec?.mimeType ?? null,
    rttMs: rtt == null ? null : Math.round(rtt * 10000) / 10,
    state,
    timestamp: video?.timestamp ?? null,
  };
}

async function updateStats(current) {
  if (call !== current) return;
  try {
    const report = await current.pc.getStats();
    if (call === current) publishStats(readStats(report, current.pc.connectionState));
  } catch (err) {
    console.warn("getStats failed", err); // the next tick tries again
  }
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

async function openMicrophone() {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error(
      "This page cannot use a microphone: browsers allow it only over HTTPS or on localhost. " +
        "Start without microphone instead.",
    );
  }
  const processing = !rawAudio;
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing },
      video: false,
    });
  } catch (err) {
    if (err.name === "NotAllowedError") {
      throw new Error("Microphone access was denied: allow it for this site, or start without microphone.");
    }
    if (err.name === "NotFoundError") {
      throw new Error("No microphone was found: connect one, or start without microphone.");
    }
    throw err;
  }
}

function attachTrack(event) {
  let stream = event.streams[0];
  if (!stream) {
    // A track without a stream id: collect the tracks in a stream of our own.
    stream = ui.video.srcObject instanceof MediaStream ? ui.video.srcObject : new MediaStream();
    stream.addTrack(event.track);
  }
  if (ui.video.srcObject !== stream) ui.video.srcObject = stream;
  ui.video.play().catch((err) => {
    if (err.name === "NotAllowedError") {
      ui.video.controls = true;
      showStatus("The browser blocked playback with sound: press play on the video.", "error");
    }
  });
}

function onConnectionState(current) {
  if (call !== current) return;
  const state = current.pc.connectionState;
  publishStats({ ...window.lipstreamStats, state });
  if (state === "connected") {
    clearTimeout(current.connectTimer);
    setCallState("connected");
    showStatus(current.localStream ? "Connected: speak, and the avatar lip-syncs your voice." : "Connected.");
  } else if (state === "disconnected") {
    showStatus("The connection was interrupted; waiting for it to recover…", "error");
  } else if (state === "failed") {
    fail(
      current,
      new Error(
        "The media connection failed. If the server is on another network, " +
          "it needs a TURN server in server.ice_servers.",
      ),
    );
  }
}

/** End `current` because of `err` (unless it has already ended) and show why. */
function fail(current, err) {
  if (call !== current) return;
  hangUp().catch((deleteErr) => console.warn("hang-up after failure", deleteErr));
  showError(err);
}

async function start(withMic) {
  if (call) return;
  const avatar = ui.avatar.value;
  if (!avatar) {
    showStatus("Pick an avatar first.", "error");
    return;
  }
  const current = { pc: null, sessionId: null, localStream: null, statsTimer: null, connectTimer: null };
  call = current;
  setCallState("connecting");
  try {
    if (withMic) {
      showStatus("Asking for the microphone…");
      current.localStream = await openMicrophone();
      if (call !== current) {
        for (const track of current.localStream.getTracks()) track.stop();
        return;
      }
    }
    showStatus("Connecting…");
    const config = await api("GET", "/webrtc-config");
    if (call !== current) return;
    const pc = new RTCPeerConnection({ iceServers: config?.iceServers ?? [] });
    current.pc = pc;
    pc.addEventListener("track", attachTrack);
    pc.addEventListener("connectionstatechange", () => onConnectionState(current));
    pc.addTransceiver("video", { direction: "recvonly" });
    const micTrack = current.localStream?.getAudioTracks()[0];
    if (micTrack) {
      pc.addTransceiver(micTrack, { direction: "sendrecv", streams: [current.localStream] });
    } else {
      pc.addTransceiver("audio", { direction: "recvonly" });
    }
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, ICE_GATHERING_TIMEOUT_MS);
    if (call !== current) return;
    const offer = pc.localDescription;
    const answer = await api("POST", "/offer", { json: { sdp: offer.sdp, type: offer.type, avatar } });
    if (call !== current) {
      // Hung up while the server was answering: end the session it just made.
      await endSession(answer.session_id);
      return;
    }
    current.sessionId = answer.session_id;
    await pc.setRemoteDescription({ type: answer.type, sdp: answer.sdp });
    current.statsTimer = setInterval(() => updateStats(current), STATS_INTERVAL_MS);
    current.connectTimer = setTimeout(() => {
      if (pc.connectionState !== "connected") {
        fail(current, new Error(`No media connection after ${CONNECT_TIMEOUT_MS / 1000} s.`));
      }
    }, CONNECT_TIMEOUT_MS);
    showStatus("Connecting media…");
  } catch (err) {
    if (call === current) fail(current, err);
    else showError(err);
  }
}

/** End a session on the server; one that has already ended is fine. */
async function endSession(sessionId) {
  try {
    await api("DELETE", `/sessions/${encodeURIComponent(sessionId)}`, { timeoutMs: HANG_UP_TIMEOUT_MS });
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 404)) throw err;
  }
}

/** End the call: the page goes idle at once; rejects if the server refuses the hang-up. */
async function hangUp() {
  const current = call;
  if (!current) return;
  call = null;
  clearInterval(current.statsTimer);
  clearTimeout(current.connectTimer);
  ui.video.srcObject = null;
  publishStats({ ...EMPTY_STATS });
  setCallState("idle");
  try {
    if (current.sessionId) await endSession(current.sessionId);
  } finally {
    // Close only after the server has answered: a closed connection makes the server end
    // the session on its own, and the hang-up would then race it.
    current.pc?.close();
    for (const track of current.localStream?.getTracks() ?? []) track.stop();
  }
}

function sessionPath(action) {
  if (!call?.sessionId) throw new Error("Start a call first.");
  return `/sessions/${encodeURIComponent(call.sessionId)}/${action}`;
}

function queued(data) {
  const ms = data?.queued_ms;
  return typeof ms === "number" ? ` (${(ms / 1000).toFixed(1)} s queued)` : "";
}

async function playSample() {
  const path = sessionPath("audio");
  const wav = await fetch("/static/sample.wav");
  if (!wav.ok) throw new Error(`Cannot load the sample: HTTP ${wav.status}`);
  const data = await api("POST", path, { body: await wav.blob(), contentType: "audio/wav" });
  showStatus(`Speaking the sample${queued(data)}.`);
}

async function say() {
  const text = ui.sayText.value.trim();
  if (!text) {
    showStatus("Type something for the avatar to say.", "error");
    return;
  }
  const data = await api("POST", sessionPath("say"), { json: { text } });
  showStatus(`Saying “${text}”${queued(data)}.`);
}

async function interrupt() {
  await api("POST", sessionPath("interrupt"));
  showStatus("Interrupted.");
}

async function loadAvatars() {
  try {
    const data = await api("GET", "/avatars");
    const avatars = data?.avatars ?? [];
    if (avatars.length === 0) {
      ui.avatar.replaceChildren(new Option("No avatars installed", ""));
      showStatus("The server has no avatars: add one under avatars.root or enable the demo.", "error");
      return;
    }
    ui.avatar.replaceChildren(...avatars.map((a) => new Option(a.name ?? a.id, a.id)));
    avatarsLoaded = true;
    setCallState("idle");
    showStatus("Pick an avatar and start a call.");
  } catch (err) {
    ui.avatar.replaceChildren(new Option("Could not load avatars", ""));
    showError(err);
  }
}

/** Run an async action from a UI event, showing its error in the status line. */
function handle(action) {
  return (event) => {
    event?.preventDefault();
    action().catch(showError);
  };
}

ui.startMic.addEventListener("click", handle(() => start(true)));
ui.startNoMic.addEventListener("click", handle(() => start(false)));
ui.hangUp.addEventListener(
  "click",
  handle(async () => {
    await hangUp();
    showStatus("Call ended.");
  }),
);
ui.playSample.addEventListener("click", handle(playSample));
ui.interrupt.addEventListener("click", handle(interrupt));
ui.sayForm.addEventListener("submit", handle(say));
window.addEventListener("pagehide", () => {
  // Leaving the page: end the session without waiting (keepalive outlives the page).
  if (call?.sessionId) {
    fetch(`/sessions/${encodeURIComponent(call.sessionId)}`, { method: "DELETE", keepalive: true })
      .catch(() => {}); // the page is going away: nobody is left to tell
  }
  call?.pc?.close();
});

publishStats({ ...EMPTY_STATS });
setCallState("idle");
loadAvatars();
