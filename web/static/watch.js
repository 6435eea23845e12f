// lipstream viewer page: plays the session named by ?session=<id> with watch() from
// ./lipstream.js (WHEP, receive-only). Like the demo page it publishes, for tests,
// window.lipstreamStats (the viewer's receive stats, refreshed every second) and
// window.lipstreamEvents (the session events received on its data channel, in order).

import { LipstreamError, watch } from "./lipstream.js";

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
  audioEnergy: null,
});

const $ = (id) => document.getElementById(id);
const ui = {
  sessionId: $("session-id"),
  watch: $("watch"),
  leave: $("leave"),
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
    audio: $("stat-audio"),
  },
};

const sessionId = new URLSearchParams(location.search).get("session");
// The viewer being made or watching: {abort, viewer, statsTimer, speaking}, or null.
let current = null;

function showStatus(text, kind = "info") {
  ui.status.textContent = text;
  ui.status.dataset.kind = kind;
}

function showError(err) {
  console.warn(err);
  showStatus(err?.message || String(err), "error");
}

/** Enable what makes sense in this phase: "idle", "connecting" or "watching". */
function setPhase(phase) {
  document.body.dataset.viewer = phase;
  ui.watch.disabled = phase !== "idle" || !sessionId;
  ui.leave.disabled = phase === "idle";
}

function publishStats(stats) {
  window.lipstreamStats = Object.freeze({ ...stats });
  const dash = "–";
  ui.stats.state.textContent = stats.state;
  ui.stats.fps.textContent = stats.fps == null ? dash : String(Math.round(stats.fps));
  ui.stats.frames.textContent = stats.framesDecoded ? String(stats.framesDecoded) : dash;
  ui.stats.resolution.textContent = stats.width ? `${stats.width}×${stats.height}` : dash;
  ui.stats.codec.textContent = stats.codec ?? dash;
  ui.stats.rtt.textContent = stats.rttMs == null ? dash : `${stats.rttMs} ms`;
  ui.stats.audio.textContent = stats.audioEnergy == null ? dash : stats.audioEnergy.toPrecision(3);
}

async function updateStats(live) {
  try {
    const stats = await live.viewer.stats();
    if (current !== live) return;
    stats.width ??= ui.video.videoWidth || null;
    stats.height ??= ui.video.videoHeight || null;
    publishStats(stats);
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
  if (event.avatar) parts.push(`avatar ${event.avatar}`);
  if (event.clip) parts.push(`clip ${event.clip}`);
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
  showSpeaking(live);
  if (event.type !== "queued_ms") ui.eventLog.textContent = describe(event); // it comes often
}

/** The page goes idle: the viewer (if any) is over as far as the page is concerned. */
function resetPage(live) {
  if (current !== live) return;
  current = null;
  clearInterval(live.statsTimer);
  live.abort.abort();
  ui.video.srcObject = null;
  publishStats({ ...EMPTY_STATS });
  showSpeaking(null);
  setPhase("idle");
}

async function start() {
  if (current || !sessionId) return;
  const live = { abort: new AbortController(), viewer: null, statsTimer: null, speaking: new Set() };
  current = live;
  window.lipstreamEvents = [];
  ui.eventLog.textContent = "–";
  setPhase("connecting");
  showStatus("Connecting…");
  try {
    const viewer = await watch({ sessionId, video: ui.video, signal: live.abort.signal });
    live.viewer = viewer;
    viewer.addEventListener("event", (event) => onServerEvent(live, event.detail));
    viewer.addEventListener("connectionstatechange", (event) => {
      if (current === live) publishStats({ ...window.lipstreamStats, state: event.detail.state });
    });
    viewer.addEventListener("ended", (event) => onEnded(live, event.detail));
    live.statsTimer = setInterval(() => updateStats(live), STATS_INTERVAL_MS);
    publishStats({ ...window.lipstreamStats, state: viewer.pc.connectionState });
    setPhase("watching");
    showStatus("Watching.");
    ui.video.play().catch((err) => {
      if (err.name === "NotAllowedError" && current === live) {
        showStatus("The browser blocked playback with sound: press play on the video.", "error");
      }
    });
  } catch (err) {
    if (current !== live) return; // left while connecting: nothing to report
    resetPage(live);
    showError(err);
  }
}

/** The viewer ended without the Leave button: the session ended, or the connection failed. */
function onEnded(live, { reason, error }) {
  if (current !== live) return;
  resetPage(live);
  if (error) showError(error);
  else showStatus(`The session ended: ${reason}.`);
}

async function leave() {
  const live = current;
  if (!live) return;
  resetPage(live); // aborts a viewer still connecting: watch() makes it leave
  await live.viewer?.leave();
  showStatus("Left the session.");
}

/** Run an async action from a UI event, showing its error in the status line. */
function handle(action) {
  return (event) => {
    event?.preventDefault();
    action().catch((err) => {
      if (err instanceof LipstreamError && err.code === "call_ended") showStatus("The viewer has ended.");
      else showError(err);
    });
  };
}

ui.watch.addEventListener("click", handle(start));
ui.leave.addEventListener("click", handle(leave));
// Leaving the page: lipstream.js ends the viewer itself (a keepalive DELETE).

window.lipstreamEvents = [];
publishStats({ ...EMPTY_STATS });
showSpeaking(null);
setPhase("idle");
ui.sessionId.textContent = sessionId ?? "–";
if (sessionId) handle(start)();
else showStatus("No session to watch: open this page as watch.html?session=<id>.", "error");
