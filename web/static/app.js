// lipstream demo page: the UI around one call made with ./lipstream.js (the browser
// client any page can use). It publishes, for tests, window.lipstreamStats (the call's
// receive stats, refreshed every second) and window.lipstreamEvents (the server events
// received on the call's data channel, in order). During a call the avatar picker
// switches the running call's avatar and the clip picker sets its idle clip, and a link
// opens the call's session in the viewer page (watch.html) in a new tab.

import { connect, listAvatars, LipstreamError, openMicrophone } from "./lipstream.js";

const STATS_INTERVAL_MS = 1000;
const EVENT_LOG_LENGTH = 200;

const EMPTY_STATS = Object.freeze({
  fps: null,
  framesDecoded: 0,
  width: null,
  height: null,
  codec: null,
  rttMs: null,
  state: "disconnected",
  timestamp: null, // ms, the inbound video report's own clock: lets tests compute fps
  bytesReceived: 0,
  packetsReceived: 0,
  packetsLost: 0,
  freezes: null,
  jitterBufferMs: null,
  audioConcealed: null,
  kbps: null,
});

const $ = (id) => document.getElementById(id);
const ui = {
  avatar: $("avatar"),
  idleClip: $("idle-clip"),
  startMic: $("start-mic"),
  startNoMic: $("start-no-mic"),
  hangUp: $("hang-up"),
  watch: $("watch"),
  watchLink: $("watch-link"),
  playSample: $("play-sample"),
  interrupt: $("interrupt"),
  sayForm: $("say-form"),
  sayText: $("say-text"),
  say: $("say"),
  status: $("status"),
  video: $("video"),
  speaking: $("avatar-speaking"),
  eventLog: $("event-log"),
  stats: {
    state: $("stat-state"),
    fps: $("stat-fps"),
    frames: $("stat-frames"),
    resolution: $("stat-resolution"),
    codec: $("stat-codec"),
    rtt: $("stat-rtt"),
    bitrate: $("stat-bitrate"),
    loss: $("stat-loss"),
    jitter: $("stat-jitter"),
    freezes: $("stat-freezes"),
  },
};

// Tests turn the browser's voice processing off (?raw_audio=1): it can eat synthetic speech.
const rawAudio = new URLSearchParams(location.search).get("raw_audio") === "1";

let avatarsLoaded = false;
// The avatars from GET /avatars, by id: {id, name, clips}.
const avatarsById = new Map();
// The call being made or in progress: {abort, call, microphone, statsTimer, speaking,
// switching}, or null.
let current = null;

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
  const connected = phase === "connected";
  // In a call the picker switches its avatar; not while a switch is loading.
  ui.avatar.disabled = !avatarsLoaded || !(idle || (connected && !current?.switching));
  ui.idleClip.disabled = !connected || ui.idleClip.options.length === 0 || !ui.idleClip.value;
  ui.startMic.disabled = !idle || !avatarsLoaded;
  ui.startNoMic.disabled = !idle || !avatarsLoaded;
  ui.hangUp.disabled = idle;
  for (const control of [ui.playSample, ui.interrupt, ui.sayText, ui.say]) {
    control.disabled = phase !== "connected";
  }
}

/** Offer the viewer page for the call's session, or nothing (`sessionId` null). */
function showWatchLink(sessionId) {
  ui.watch.hidden = !sessionId;
  const viewer = new URL("watch.html", import.meta.url);
  if (sessionId) viewer.searchParams.set("session", sessionId);
  ui.watchLink.href = viewer.href;
}

// The link's figures need two readings: the received bitrate over the last second
// (kbit/s) and the video's loss over the call so far.
function linkFigures(stats, previous) {
  const elapsed = previous?.timestamp && stats.timestamp ? stats.timestamp - previous.timestamp : 0;
  // a reading without a new report (a state change) keeps the last figure
  const kbps = elapsed > 0 ? (8 * (stats.bytesReceived - previous.bytesReceived)) / elapsed : stats.kbps;
  const packets = stats.packetsReceived + stats.packetsLost;
  return { kbps: kbps == null ? null : Math.round(kbps), loss: packets ? stats.packetsLost / packets : null };
}

function publishStats(stats, previous = null) {
  const { kbps, loss } = linkFigures(stats, previous);
  window.lipstreamStats = Object.freeze({ ...stats, kbps, videoLoss: loss });
  const dash = "–";
  ui.stats.state.textContent = stats.state;
  ui.stats.fps.textContent = stats.fps == null ? dash : String(Math.round(stats.fps));
  ui.stats.frames.textContent = stats.framesDecoded ? String(stats.framesDecoded) : dash;
  ui.stats.resolution.textContent = stats.width ? `${stats.width}×${stats.height}` : dash;
  ui.stats.codec.textContent = stats.codec ?? dash;
  ui.stats.rtt.textContent = stats.rttMs == null ? dash : `${stats.rttMs} ms`;
  ui.stats.bitrate.textContent = kbps == null ? dash : `${kbps} kbit/s`;
  ui.stats.loss.textContent = loss == null ? dash : `${(100 * loss).toFixed(1)} %`;
  ui.stats.jitter.textContent = stats.jitterBufferMs == null ? dash : `${stats.jitterBufferMs} ms`;
  ui.stats.freezes.textContent = stats.freezes == null ? dash : String(stats.freezes);
}

async function updateStats(live) {
  try {
    const stats = await live.call.stats();
    if (current !== live) return;
    stats.width ??= ui.video.videoWidth || null;
    stats.height ??= ui.video.videoHeight || null;
    publishStats(stats, window.lipstreamStats);
  } catch (err) {
    console.warn("getStats failed", err); // the next tick tries again
  }
}

/** Show whether the avatar is speaking: some utterance has started and not ended. */
function showSpeaking(live) {
  const speaking = live !== null && live.speaking.size > 0;
  ui.speaking.textContent = speaking ? "speaking" : "idle";
  ui.speaking.dataset.speaking = String(speaking);
}

function describe(event) {
  const parts = [];
  if (event.utterance != null) parts.push(`utterance ${event.utterance}`);
  if (event.source) parts.push(event.source);
  if (event.utterances) parts.push(`utterances ${event.utterances.join(", ") || "none"}`);
  if (event.avatar) parts.push(`avatar ${event.avatar}`);
  if (event.clip) parts.push(`clip ${event.clip}`);
  if (event.previous) parts.push(`was ${event.previous}`);
  if (typeof event.frame === "number") parts.push(`frame ${event.frame}`);
  if (Array.isArray(event.frame_size)) parts.push(event.frame_size.join("×"));
  for (const key of ["queued_ms", "duration_ms", "played_ms", "dropped_ms"]) {
    if (typeof event[key] === "number") parts.push(`${key.replace("_ms", "")} ${Math.round(event[key])} ms`);
  }
  if (Array.isArray(event.played)) {
    const played = event.played.map((p) => `${p.utterance}: ${Math.round(p.played_ms)} ms`);
    parts.push(`played ${played.join(", ") || "none"}`);
  }
  if (event.type === "speech_ended" && event.interrupted) parts.push("cut");
  if (event.code) parts.push(`${event.code}: ${event.message ?? ""}`);
  if (event.reason) parts.push(event.reason);
  return `#${event.seq ?? "?"} ${event.type}${parts.length ? `: ${parts.join(", ")}` : ""}`;
}

function onServerEvent(live, event) {
  if (current !== live) return;
  window.lipstreamEvents.push(Object.freeze({ ...event }));
  if (window.lipstreamEvents.length > EVENT_LOG_LENGTH) window.lipstreamEvents.shift();
  if (event.type === "speech_started") live.speaking.add(event.utterance);
  else if (event.type === "speech_ended") live.speaking.delete(event.utterance);
  else if (event.type === "interrupted" || event.type === "session_ended") live.speaking.clear();
  if (event.type === "avatar_changed") {
    ui.avatar.value = event.avatar;
    refreshClips(live).catch((err) => console.warn("cannot read the idle clips", err));
  } else if (event.type === "idle_clip_changed" && [...ui.idleClip.options].some((o) => o.value === event.clip)) {
    ui.idleClip.value = event.clip;
  }
  showSpeaking(live);
  if (event.type !== "queued_ms") ui.eventLog.textContent = describe(event); // it comes often
}

function attachStream(stream) {
  ui.video.srcObject = stream;
  ui.video.play().catch((err) => {
    if (err.name === "NotAllowedError") {
      ui.video.controls = true;
      showStatus("The browser blocked playback with sound: press play on the video.", "error");
    }
  });
}

/** The page goes idle: the call (if any) is over as far as the page is concerned. */
function resetPage(live) {
  if (current !== live) return;
  current = null;
  clearInterval(live.statsTimer);
  live.abort.abort();
  for (const track of live.microphone?.getTracks() ?? []) track.stop();
  ui.video.srcObject = null;
  showWatchLink(null);
  showClips([], null);
  publishStats({ ...EMPTY_STATS });
  showSpeaking(null);
  setCallState("idle");
}

async function start(withMic) {
  if (current) return;
  const avatar = ui.avatar.value;
  if (!avatar) {
    showStatus("Pick an avatar first.", "error");
    return;
  }
  const live = {
    abort: new AbortController(),
    call: null,
    microphone: null,
    statsTimer: null,
    speaking: new Set(),
    switching: false,
  };
  current = live;
  window.lipstreamEvents = [];
  ui.eventLog.textContent = "–";
  setCallState("connecting");
  try {
    if (withMic) {
      showStatus("Asking for the microphone…");
      live.microphone = await openMicrophone({ raw: rawAudio });
      if (current !== live) {
        for (const track of live.microphone.getTracks()) track.stop();
        return;
      }
    }
    showStatus("Connecting…");
    const call = await connect({ avatar, microphone: live.microphone, signal: live.abort.signal });
    live.call = call;
    call.addEventListener("event", (event) => onServerEvent(live, event.detail));
    call.addEventListener("connectionstatechange", (event) => onConnectionState(live, event.detail.state));
    call.addEventListener("ended", (event) => onEnded(live, event.detail));
    attachStream(call.stream);
    live.statsTimer = setInterval(() => updateStats(live), STATS_INTERVAL_MS);
    publishStats({ ...window.lipstreamStats, state: call.pc.connectionState });
    showClips(avatarsById.get(avatar)?.clips ?? [], null);
    showWatchLink(call.sessionId);
    setCallState("connected");
    refreshClips(live).catch((err) => console.warn("cannot read the idle clips", err));
    showStatus(live.microphone ? "Connected: speak, and the avatar lip-syncs your voice." : "Connected.");
  } catch (err) {
    if (current !== live) return; // hung up while connecting: nothing to report
    resetPage(live);
    showError(err);
  }
}

function onConnectionState(live, state) {
  if (current !== live) return;
  publishStats({ ...window.lipstreamStats, state });
  if (state === "disconnected") {
    showStatus("The connection was interrupted; waiting for it to recover…", "error");
  } else if (state === "connected") {
    showStatus("Connected.");
  }
}

/** The call ended without the hang-up button: the connection failed or the server ended it. */
function onEnded(live, { reason, error }) {
  if (current !== live) return;
  resetPage(live);
  if (error) showError(error);
  else showStatus(`The call ended: ${reason}.`);
}

/** End the call: the page goes idle at once; rejects if the server refuses the hang-up. */
async function hangUp() {
  const live = current;
  if (!live) return;
  resetPage(live); // aborts a call still connecting: connect() ends the session it made
  await live.call?.hangUp();
}

function liveCall() {
  if (!current?.call) throw new Error("Start a call first.");
  return current.call;
}

function queued(data) {
  const ms = data?.queued_ms;
  return typeof ms === "number" ? ` (${(ms / 1000).toFixed(1)} s queued)` : "";
}

async function playSample() {
  const call = liveCall();
  const wav = await fetch("/static/sample.wav");
  if (!wav.ok) throw new Error(`Cannot load the sample: HTTP ${wav.status}`);
  const data = await call.pushAudio(await wav.blob(), "audio/wav");
  showStatus(`Speaking the sample${queued(data)}.`);
}

async function say() {
  const text = ui.sayText.value.trim();
  if (!text) {
    showStatus("Type something for the avatar to say.", "error");
    return;
  }
  const data = await liveCall().say(text);
  showStatus(`Saying “${text}”${queued(data)}.`);
}

async function interrupt() {
  // Over HTTP, so the page reports what the server did rather than what it sent.
  await liveCall().interrupt({ transport: "http" });
  showStatus("Interrupted.");
}

/** Fill the clip picker: the avatar's idle clips, `selected` chosen (else the first). */
function showClips(clips, selected) {
  ui.idleClip.replaceChildren(...clips.map((clip) => new Option(clip, clip)));
  if (selected && clips.includes(selected)) ui.idleClip.value = selected;
  if (clips.length === 0) ui.idleClip.replaceChildren(new Option("–", ""));
  setCallState(document.body.dataset.call ?? "idle");
}

/** The call's avatar, its clips and the one playing, as the server has them now. */
async function refreshClips(live) {
  const state = await live.call.state();
  if (current !== live) return;
  if (state.avatar) ui.avatar.value = state.avatar;
  const clips = state.clips ?? avatarsById.get(state.avatar)?.clips ?? [];
  showClips(clips, state.idle_clip ?? null);
}

/** The avatar picker changed: before a call it only picks; during one it switches. */
async function pickAvatar() {
  const live = current;
  const avatar = ui.avatar.value;
  if (!live?.call || document.body.dataset.call !== "connected") return;
  const shown = live.call.avatar;
  if (!avatar || avatar === shown) return;
  live.switching = true;
  setCallState("connected");
  showStatus(`Switching to ${avatarsById.get(avatar)?.name ?? avatar}…`);
  try {
    const switched = await live.call.switchAvatar(avatar);
    if (current !== live) return;
    showStatus(
      switched.changed
        ? `Switched to ${avatarsById.get(avatar)?.name ?? avatar} from frame ${switched.frame}.`
        : `Already showing ${avatar}.`,
    );
    // The clips now are the new avatar's (avatar_changed refreshes them again).
    showClips(avatarsById.get(avatar)?.clips ?? [], null);
  } catch (err) {
    if (current === live) ui.avatar.value = live.call.avatar ?? shown ?? ""; // the call goes on as it was
    throw err;
  } finally {
    live.switching = false;
    if (current === live) setCallState("connected");
  }
}

/** The clip picker changed: play that clip while the avatar is silent. */
async function pickIdleClip() {
  const live = current;
  const clip = ui.idleClip.value;
  if (!live?.call || !clip) return;
  const previous = live.call.idleClip;
  try {
    const set = await live.call.setIdleClip(clip);
    if (current === live) showStatus(`Idle clip: ${set.clip ?? clip}.`);
  } catch (err) {
    if (current === live && previous) ui.idleClip.value = previous;
    throw err;
  }
}

async function loadAvatars() {
  try {
    const avatars = await listAvatars();
    if (avatars.length === 0) {
      ui.avatar.replaceChildren(new Option("No avatars installed", ""));
      showStatus("The server has no avatars: add one under avatars.root or enable the demo.", "error");
      return;
    }
    avatarsById.clear();
    for (const a of avatars) avatarsById.set(a.id, a);
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
    action().catch((err) => {
      if (err instanceof LipstreamError && err.code === "call_ended") showStatus("The call has ended.");
      else showError(err);
    });
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
ui.avatar.addEventListener("change", handle(pickAvatar));
ui.idleClip.addEventListener("change", handle(pickIdleClip));
// Leaving the page: lipstream.js ends the call itself (a keepalive DELETE).

window.lipstreamEvents = [];
publishStats({ ...EMPTY_STATS });
showSpeaking(null);
setCallState("idle");
loadAvatars();
