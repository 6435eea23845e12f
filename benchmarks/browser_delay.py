"""Mic → heard and mouth ↔ sound, measured in a real browser, 1 and 3 calls, quiet and hogged.

Headless Debian Chromium (driven by Playwright, as in ``tests/test_demo_page.py``) calls
the server (demo avatar, default settings) with a fake microphone that plays short
buzz bursts at irregular intervals; 1 call, then 3 calls at once (3 tabs of one browser,
``benchmarks/chromium.py``). Each call runs quiet, then a CPU hog (one busy Python
process per core) runs for 2 s, then the call goes on quiet.

**Mic → heard.** In the page, the microphone and the call's returned audio go into one
AudioWorklet through a channel merger, so both are sampled by the same render quantum
(128 samples), on the AudioContext's clock; a burst's delay is the distance between its
onset at the microphone and its onset in the returned audio. That covers the browser's
capture and send path, the network (loopback), the server and the browser's receive path
(its WebRTC jitter buffer and decoder), not the sound card's output buffer. The server
sends the audio back ``session.delay_s`` (the configured figure) after it is on the
session timeline; the excess is the receive path into the server, the send path out and
the browser's own buffers. A burst's echo is the first onset in the returned audio
between the configured delay (less 20 ms) and :data:`ECHO_WINDOW_S` after it; the bursts
are further apart than that, so a burst cannot take another's echo, and a burst with no
echo in the window is *lost* (counted as out of budget).

**Mouth ↔ sound.** ``video.requestVideoFrameCallback`` fires for the frames the page
presents (``presentedFrames`` is kept: a frame the compositor never showed has no
callback, as a viewer never saw it); the callback draws the frame's mouth region to a
canvas and sums its darkness (the demo model draws an open dark mouth, wider the louder
the audio). The region is the union, over the avatar's frames, of where the compositor
puts the model's mouth: each crop rect (``rects.json``) is resized to the 328-px crop
whose inner 320 px the model sees (``docs/design/model.md`` §3), so the model's mouth
centre and size, in fractions of 320 (``inference_core/assets/demo_models.py``), map into
the full frame. A frame is timed by its ``expectedDisplayTime``: when the compositor
shows it, on the page's ``performance.now()`` clock.

The audio is timed on the AudioContext's clock. ``getOutputTimestamp()``, sampled every
200 ms, pairs a context time with the ``performance.now()`` at which that sample leaves
the output; ``performanceTime - contextTime`` interpolated between the pairs maps each
onset of the returned audio onto the frames' clock as the moment it is played. Not one
constant: when the audio thread misses its deadline (a loaded machine) the context clock
stops while time goes on, and the difference steps up. Offset = mouth onset (the first
presented frame whose darkness rises over a quarter of its range) minus the nearest
sound onset; positive: the mouth is late. Frames are 40 ms apart and shown on 60 Hz
ticks, so one offset is known to about ±20 ms. What is "played" here is the returned
audio as Web Audio receives it from the muted ``<video>`` element's audio path, through
a FIFO that may hold it a little longer than the element's own output would.

**The hog.** Python spawns one busy-loop process per core that sleeps until an absolute
``time.time()`` and spins until 2.0 s later. Each page's ``performance.now()`` is tied to
``time.time()`` by the quickest of a few round trips, so the hog's start and end are on
the same clock as the bursts. *Recovery* is measured against the delay that call had
before the hog: the configured delay plus the browser's own buffers (≈65 ms), which no
server setting removes, so "within 50 ms of the configured delay" would never hold,
even quiet. It is the time from the hog's end until the first burst, heard, from which
every later burst's delay is within 50 ms of that steady figure; a lost burst counts as
out. Bursts are 0.45–0.70 s apart, so this is an upper bound, late by up to one interval.

Why one module: the page script, the analysis of what it records and the report are
one measurement. The burst spacing, the echo window, the onset rules and the clocks the
page keeps must change together; the analysis is tested without a browser
(``tests/test_browser_delay_analysis.py``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
import wave
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.chromium import CHROMIUM, caller_pages
from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.live_server import live_server
from inference_core.assets import ensure_demo_avatar
from inference_core.assets.demo_models import (
    DEFAULT_MOUTH_CENTER,
    DEFAULT_MOUTH_HALF_WIDTH,
    DEFAULT_MOUTH_MAX_HALF_HEIGHT,
)
from web.app_keys import SESSIONS

RATE = 48_000
BURST_S = 0.12
# Irregular gaps, so no periodic delay can pair a burst with another's echo. The
# shortest onset-to-onset distance (0.45 s) exceeds the echo window plus its 20 ms lead.
GAPS_S = (0.33, 0.47, 0.39, 0.58, 0.35, 0.51, 0.43, 0.55, 0.37, 0.49, 0.41, 0.53, 0.45)
ECHO_WINDOW_S = 0.4  # an echo later than configured + this is not measured: lost
ONSET_QUIET_S = 0.25  # an onset needs this much quiet before it
MOUTH_QUIET_S = 0.15  # the mouth closes ~60 ms after the sound, so less quiet is left
BLOCK = 128  # samples per energy value: one Web Audio render quantum
BROWSER_BUFFERS_MS = 80.0  # what the target allows the browser's own buffers (issue 12)
RECOVERY_TOLERANCE_MS = 50.0
HOG_S = 2.0
WARM_UP_S = 3.0  # bursts this soon after the page starts listening are not counted

HOG = """
import sys, time
start, end = float(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
while time.time() < end:
    pass
"""

# Runs in the page (the server's origin): call, then record what the module docstring says.
PAGE_SCRIPT = """
async ({avatar, box, frameSize}) => {
  const {withOpusDtx} = await import('/static/lipstream.js');
  const ctx = new AudioContext({sampleRate: 48000});
  const mic = await navigator.mediaDevices.getUserMedia({audio: {
    echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  const pc = new RTCPeerConnection({iceServers: []});
  mic.getTracks().forEach(t => pc.addTrack(t, mic));
  pc.addTransceiver('video', {direction: 'recvonly'});
  const remote = new MediaStream();
  const gotAudio = new Promise(resolve => { pc.ontrack = e => {
    remote.addTrack(e.track); if (e.track.kind === 'audio') resolve(); }; });
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise(resolve => {
    if (pc.iceGatheringState === 'complete') return resolve();
    pc.onicegatheringstatechange = () => {
      if (pc.iceGatheringState === 'complete') resolve(); };
  });
  const response = await fetch('/offer', {method: 'POST',
    headers: {'content-type': 'application/json'},
    // As the demo page's lipstream.js: the avatar's silence as Opus DTX.
    body: JSON.stringify({sdp: withOpusDtx(pc.localDescription.sdp), type: 'offer', avatar})});
  const answer = await response.json();
  await pc.setRemoteDescription({type: answer.type, sdp: answer.sdp});
  await gotAudio;
  // Chrome only pulls a remote WebRTC stream's audio while a media element plays it.
  const video = document.createElement('video');
  video.srcObject = remote; video.muted = true; video.style.width = '320px';
  document.body.appendChild(video);
  await video.play();
  const probe = {chunks: [], clock: [], frames: [], session: answer.session_id,
                 outputLatency: ctx.outputLatency, baseLatency: ctx.baseLatency};
  const worklet = `registerProcessor('energy', class extends AudioWorkletProcessor {
    constructor() { super(); this.mic = []; this.remote = []; this.first = -1; }
    flush() {
      if (this.mic.length)
        this.port.postMessage({first: this.first, mic: this.mic, remote: this.remote});
      this.mic = []; this.remote = []; this.first = -1;
    }
    process(inputs) {
      const x = inputs[0];
      // A chunk holds consecutive quanta only: a quantum not processed starts a new one.
      if (this.first >= 0 && currentFrame !== this.first + 128 * this.mic.length) this.flush();
      if (this.first < 0) this.first = currentFrame;
      for (const [ch, out] of [[0, this.mic], [1, this.remote]]) {
        const s = x[ch]; let e = 0;
        if (s) for (let i = 0; i < s.length; i++) e += s[i] * s[i];
        out.push(s ? Math.sqrt(e / s.length) : 0);
      }
      if (this.mic.length >= 125) this.flush();
      return true;
    }
  });`;
  await ctx.audioWorklet.addModule(
    URL.createObjectURL(new Blob([worklet], {type: 'text/javascript'})));
  const node = new AudioWorkletNode(ctx, 'energy', {outputChannelCount: [1]});
  node.port.onmessage = e => probe.chunks.push(e.data);
  const merger = ctx.createChannelMerger(2);
  ctx.createMediaStreamSource(mic).connect(merger, 0, 0);
  ctx.createMediaStreamSource(remote).connect(merger, 0, 1);
  merger.connect(node); node.connect(ctx.destination);
  setInterval(() => {
    const t = ctx.getOutputTimestamp();
    if (t.contextTime > 0) probe.clock.push([t.contextTime, t.performanceTime]);
  }, 200);
  const canvas = document.createElement('canvas');
  canvas.width = box[2]; canvas.height = box[3];
  const g = canvas.getContext('2d', {willReadFrequently: true});
  const onFrame = (now, meta) => {
    const sx = video.videoWidth / frameSize[0], sy = video.videoHeight / frameSize[1];
    g.drawImage(video, box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy,
                0, 0, box[2], box[3]);
    const px = g.getImageData(0, 0, box[2], box[3]).data;
    let dark = 0;
    for (let i = 0; i < px.length; i += 4) {
      const luma = (77 * px[i] + 150 * px[i + 1] + 29 * px[i + 2]) >> 8;
      if (luma < 160) dark += 160 - luma;
    }
    probe.frames.push([meta.expectedDisplayTime, dark / (box[2] * box[3]),
                      meta.presentedFrames]);
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
  window.__probe = probe;
  return answer.session_id;
}
"""


# --- analysis: pure functions of recorded signals (tests/test_browser_delay_analysis.py)


@dataclass(frozen=True)
class Burst:
    """One microphone burst: when it was said and how long until it was heard."""

    said_s: float
    delay_ms: float | None  # None: no echo within the window (lost)


def rising_edges(
    times: Sequence[float], values: Sequence[float], threshold: float, quiet_s: float
) -> list[float]:
    """Times where ``values`` rises over ``threshold`` after ``quiet_s`` at or below it.

    The quiet rule keeps a burst one onset even when its level dips inside it. The
    start of the record counts as quiet.
    """
    found: list[float] = []
    last_loud = -np.inf
    for t, v in zip(times, values, strict=True):
        if v > threshold:
            if t - last_loud >= quiet_s:
                found.append(float(t))
            last_loud = t
    return found


def onsets(energy: Sequence[float], seconds_per_value: float, quiet_s: float = 0.5) -> list[float]:
    """Times where the energy rises over a tenth of its peak after ``quiet_s`` below it."""
    values = np.asarray(energy, dtype=float)
    if not len(values) or values.max() <= 0:
        return []
    times = np.arange(len(values)) * seconds_per_value
    return rising_edges(times.tolist(), values.tolist(), 0.1 * values.max(), quiet_s)


def mouth_onsets(
    times: Sequence[float], openness: Sequence[float], quiet_s: float = MOUTH_QUIET_S
) -> list[float]:
    """Presented frames where the mouth starts to open: over a quarter of the way from
    its usual level (the median: the mouth is shut most of the time) to its open level
    (the 99th percentile). A quarter, not a tenth: the face fades in over 3 frames and
    video compression adds noise to a shut mouth. A spread under 8 median absolute
    deviations is that noise alone: the mouth never opened."""
    values = np.asarray(openness, dtype=float)
    if len(values) < 2:
        return []
    shut, wide = float(np.median(values)), float(np.percentile(values, 99))
    noise = float(np.median(np.abs(values - shut)))
    if wide - shut <= max(8 * noise, 1e-9):
        return []
    return rising_edges(times, values.tolist(), shut + 0.25 * (wide - shut), quiet_s)


def match_bursts(
    said: Sequence[float], heard: Sequence[float], earliest_s: float, window_s: float
) -> list[Burst]:
    """Each said onset with the first heard onset in ``(said + earliest, + window)``.

    Nothing comes back sooner than the configured delay: an onset before it (the call's
    first sound, the fake microphone's file starting over) belongs to another burst.
    """
    bursts = []
    for s in said:
        later = [h - s for h in heard if earliest_s < h - s < earliest_s + window_s]
        bursts.append(Burst(s, 1000 * later[0] if later else None))
    return bursts


def burst_delays_ms(
    energy: dict[str, Any],
    configured_ms: float,
    *,
    quiet_s: float = 0.5,
    window_s: float = 1.0,
) -> list[float]:
    """Each microphone burst's delay to its echo in the returned audio (lost ones left out)."""
    step = energy["block"] / energy["rate"]
    said = onsets(energy["mic"], step, quiet_s)
    heard = onsets(energy["remote"], step, quiet_s)
    bursts = match_bursts(said, heard, configured_ms / 1000 - 0.02, window_s)
    return [b.delay_ms for b in bursts if b.delay_ms is not None]


def av_offsets_ms(
    sound_s: Sequence[float], mouth_s: Sequence[float], max_apart_s: float = 0.2
) -> list[float]:
    """Mouth onset minus sound onset (ms) for each sound with a mouth onset near it."""
    offsets = []
    for s in sound_s:
        near = [m - s for m in mouth_s if abs(m - s) <= max_apart_s]
        if near:
            offsets.append(1000 * min(near, key=abs))
    return offsets


def recovery_s(
    bursts: Sequence[Burst], hog_end_s: float, steady_ms: float, tolerance_ms: float
) -> float:
    """Seconds from ``hog_end_s`` until the first heard burst from which every later one
    is within ``tolerance_ms`` of ``steady_ms``; a lost burst counts as out. ``inf`` if
    the last burst is still out, or none is heard after the hog: not seen back.

    A lost burst has no heard time: it is placed where a steady one would have been heard.
    """

    def heard(b: Burst) -> float:
        return b.said_s + (steady_ms if b.delay_ms is None else b.delay_ms) / 1000

    after = sorted((b for b in bursts if heard(b) >= hog_end_s), key=heard)
    if not after:
        return math.inf
    bad = [
        i
        for i, b in enumerate(after)
        if b.delay_ms is None or abs(b.delay_ms - steady_ms) > tolerance_ms
    ]
    if bad and bad[-1] == len(after) - 1:
        return math.inf
    return heard(after[bad[-1] + 1 if bad else 0]) - hog_end_s


def context_to_perf_s(ctx_s: np.ndarray, clock: np.ndarray) -> np.ndarray:
    """What to add to AudioContext times to put them on the ``performance.now()`` clock (s).

    ``clock`` rows are ``getOutputTimestamp()`` pairs ``(contextTime s, performanceTime
    ms)``. Their difference is not constant: when the audio thread misses its deadline
    (a loaded machine) the context clock stops while time goes on, and the difference
    steps up. So each time takes the difference interpolated between its nearest pairs.
    """
    return np.asarray(np.interp(ctx_s, clock[:, 0], clock[:, 1] / 1000 - clock[:, 0]), float)


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


# --- the run: signals in, figures out


def write_bursts(path: Path) -> Path:
    """Buzz bursts (a 110 Hz sawtooth up to 7.6 kHz, 120 ms) after the gaps of :data:`GAPS_S`.

    A buzz, not a tone: the demo model opens its mouth by the loudness averaged over
    80 mel bands, which a tone's few bands barely raise (a 220 Hz tone never opens it);
    a buzz fills the bands as a voice does.
    """
    t = np.arange(int(BURST_S * RATE)) / RATE
    buzz = np.sum([np.sin(2 * np.pi * 110 * k * t) / k for k in range(1, 70)], axis=0)
    buzz *= 0.15 * np.minimum(1.0, np.minimum(t, BURST_S - t) / 0.005)  # 5 ms ramps
    parts: list[np.ndarray] = []
    for gap in GAPS_S:
        parts += [np.zeros(int(gap * RATE)), buzz]
    pcm = (np.concatenate(parts) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm.tobytes())
    return path


def mouth_box(avatar: Path) -> tuple[int, int, int, int]:
    """``(x, y, w, h)`` in the full frame covering the model's mouth in every avatar frame.

    Each crop rect is resized to ``crop_size`` px whose inner ``input_size`` px (after
    ``crop_border``) the model sees; the demo model opens its mouth at fractions of that.
    """
    adapter = json.loads((avatar / "avatar.json").read_text())["adapter"]
    crop, border, size = adapter["crop_size"], adapter["crop_border"], adapter["input_size"]
    rects = np.asarray(json.loads((avatar / "rects.json").read_text()), dtype=float)
    scale = (rects[:, 2] - rects[:, 0]) / crop  # full-frame px per crop px
    cx = rects[:, 0] + (border + DEFAULT_MOUTH_CENTER[0] * size) * scale
    cy = rects[:, 1] + (border + DEFAULT_MOUTH_CENTER[1] * size) * scale
    half_w = (DEFAULT_MOUTH_HALF_WIDTH * size + 4) * scale  # + the soft edge
    half_h = (DEFAULT_MOUTH_MAX_HALF_HEIGHT * size + 8) * scale  # + the lips around it
    x0, y0 = int(np.min(cx - half_w)), int(np.min(cy - half_h))
    x1, y1 = int(np.ceil(np.max(cx + half_w))), int(np.ceil(np.max(cy + half_h)))
    return x0, y0, x1 - x0, y1 - y0


@dataclass
class CallFigures:
    """One call's bursts and offsets, on its page's ``performance.now()`` clock (s)."""

    configured_ms: float
    bursts: list[Burst]
    sound_s: list[float]
    mouth_s: list[float]
    hog_s: tuple[float, float]
    steady_ms: float = math.nan
    server: dict[str, Any] = field(default_factory=dict)  # GET /sessions/{id} at the end

    def server_note(self) -> str:
        """What the server did to this call: frames inferred of those sent, frames
        dropped, microphone audio skipped; or why the session had already ended."""
        s = self.server
        if "frames_sent" not in s:
            return f"ended early: {s.get('end_reason')}"
        dropped = sum(s.get("frames_dropped", {}).values())
        return (
            f"{s['frames_inferred']}/{s['frames_sent']} inferred, {dropped} dropped, "
            f"{s.get('inbound_skipped_ms', 0):.0f} ms mic skipped"
        )

    def quiet(self) -> list[Burst]:
        return [b for b in self.bursts if b.said_s + self.configured_ms / 1000 < self.hog_s[0]]

    def hogged(self) -> list[Burst]:
        return [b for b in self.bursts if b.said_s + self.configured_ms / 1000 >= self.hog_s[0]]

    def offsets_ms(self, *, hogged: bool | None = None) -> list[float]:
        sounds = [s for s in self.sound_s if hogged is None or (s >= self.hog_s[0]) == hogged]
        return av_offsets_ms(sounds, self.mouth_s)

    def offset_cell(self, *, hogged: bool) -> str:
        magnitudes = [abs(o) for o in self.offsets_ms(hogged=hogged)]
        sounds = sum((s >= self.hog_s[0]) == hogged for s in self.sound_s)
        if not magnitudes:
            return f"- (0 / {sounds})"
        median = statistics.median(magnitudes)
        return f"{median:.0f} / {max(magnitudes):.0f} ({len(magnitudes)} / {sounds})"

    def recovery_s(self) -> float:
        if math.isnan(self.steady_ms):
            return math.inf  # no steady delay before the hog: nothing to come back to
        return recovery_s(self.bursts, self.hog_s[1], self.steady_ms, RECOVERY_TOLERANCE_MS)


def analyse_call(probe: dict[str, Any], hog_epoch: tuple[float, float]) -> CallFigures:
    """Bursts, onsets and offsets of one page's probe (see :data:`PAGE_SCRIPT`)."""
    frames = np.concatenate(
        [c["first"] + np.arange(len(c["mic"])) * BLOCK for c in probe["chunks"]]
    )
    mic = np.concatenate([c["mic"] for c in probe["chunks"]])
    remote = np.concatenate([c["remote"] for c in probe["chunks"]])
    # Delays count samples (both channels share every render quantum); times for the
    # hog and the frames go onto the performance.now() clock.
    ctx_s = (frames / RATE).tolist()
    said = rising_edges(ctx_s, mic.tolist(), 0.1 * float(mic.max()), ONSET_QUIET_S)
    heard = rising_edges(ctx_s, remote.tolist(), 0.1 * float(remote.max()), ONSET_QUIET_S)
    clock = np.asarray(probe["clock"])

    def perf_s(times: list[float]) -> list[float]:
        ctx = np.asarray(times, dtype=float)
        return [float(t) for t in ctx + context_to_perf_s(ctx, clock)]

    configured_ms = float(probe["configured_ms"])
    # Left out: bursts before the call settled, and those whose echo window outlasts
    # the record (they would count as lost).
    warm, last = ctx_s[0] + WARM_UP_S, ctx_s[-1] - configured_ms / 1000 - ECHO_WINDOW_S
    matched = match_bursts(
        [s for s in said if warm <= s <= last], heard, configured_ms / 1000 - 0.02, ECHO_WINDOW_S
    )
    said_perf = perf_s([b.said_s for b in matched])
    bursts = [Burst(t, b.delay_ms) for t, b in zip(said_perf, matched, strict=True)]
    shown = np.asarray(probe["frames"])
    hog = (hog_epoch[0] - probe["epoch_minus_perf_s"], hog_epoch[1] - probe["epoch_minus_perf_s"])
    figures = CallFigures(
        configured_ms,
        bursts,
        perf_s([h for h in heard if h >= warm]),
        mouth_onsets((shown[:, 0] / 1000).tolist(), shown[:, 1].tolist()),
        hog,
        server=probe["state"],
    )
    quiet = [b.delay_ms for b in figures.quiet() if b.delay_ms is not None]
    figures.steady_ms = statistics.median(quiet) if quiet else math.nan
    return figures


async def _epoch_minus_perf_s(page: Any) -> float:
    """``time.time() - performance.now()`` of ``page``, from the quickest of 5 round trips."""
    best = (math.inf, 0.0)
    for _ in range(5):
        t0 = time.time()
        perf_ms = await page.evaluate("() => performance.now()")
        t1 = time.time()
        best = min(best, (t1 - t0, (t0 + t1) / 2 - perf_ms / 1000))
    return best[1]


async def _hog(seconds: float) -> tuple[float, float]:
    """One busy process per core from 0.5 s from now for ``seconds``; returns its span."""
    start = time.time() + 0.5
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOG, str(start), str(start + seconds)
        )
        for _ in range(os.cpu_count() or 1)
    ]
    for proc in procs:
        await proc.wait()
    return start, start + seconds


async def record(
    root: Path,
    calls: int,
    quiet_s: float,
    after_s: float,
    settings: dict[str, object] | None = None,
) -> tuple[list[dict[str, Any]], tuple[float, float]]:
    """Run ``calls`` calls with the hog after ``quiet_s``; each page's probe and the hog's
    span (``time.time()``). ``settings`` override the server's defaults."""
    mic = write_bursts(root / f"bursts_{calls}.wav")
    avatar = ensure_demo_avatar(root / "data")  # where live_server's settings look
    frame_size = json.loads((avatar / "avatar.json").read_text())["frame_size"]
    args = {"avatar": "demo", "box": mouth_box(avatar), "frameSize": frame_size}
    async with live_server(root, settings) as (app, url), caller_pages(mic, calls) as pages:
        for page in pages:
            await page.goto(url + "/")
        sessions = await asyncio.gather(*(page.evaluate(PAGE_SCRIPT, args) for page in pages))
        live = [app[SESSIONS].get(sid) for sid in sessions]  # kept to read end_reason
        await asyncio.sleep(quiet_s)  # a benchmark: the calls play for this long
        links = [await _epoch_minus_perf_s(page) for page in pages]
        hog = await _hog(HOG_S)
        await asyncio.sleep(after_s)
        probes = []
        for page, link, session in zip(pages, links, live, strict=True):
            probe = await page.evaluate(
                "() => { const p = window.__probe;"
                " return {chunks: p.chunks, clock: p.clock, frames: p.frames,"
                " session: p.session}; }"
            )
            probe["state"] = await page.evaluate(
                "async id => (await fetch('/sessions/' + id)).json()", probe["session"]
            )
            probe["state"].setdefault("end_reason", session.end_reason)
            probe["epoch_minus_perf_s"] = link
            probe["configured_ms"] = session.delay_s * 1000
            probes.append(probe)
    return probes, hog


@dataclass(frozen=True)
class Summary:
    """One call count's figures: delays per scenario, offsets, the slowest recovery."""

    calls: int
    configured_ms: float
    quiet: list[Burst]
    hogged: list[Burst]
    offsets_ms: list[float]
    sounds: int  # sound onsets heard: each should have a mouth onset near it
    recovery_s: float

    @staticmethod
    def of(calls: int, figures: Sequence[CallFigures]) -> Summary:
        return Summary(
            calls,
            figures[0].configured_ms,
            [b for f in figures for b in f.quiet()],
            [b for f in figures for b in f.hogged()],
            [o for f in figures for o in f.offsets_ms()],
            sum(len(f.sound_s) for f in figures),
            max(f.recovery_s() for f in figures),
        )

    def delays_ms(self, scenario: str) -> list[float]:
        """Sorted delays, a lost burst as ``inf``: it was not heard within the window, so
        it may not shrink a percentile by being left out."""
        bursts = self.quiet if scenario == "quiet" else self.hogged
        return sorted(math.inf if b.delay_ms is None else b.delay_ms for b in bursts)

    def delay_row(self, scenario: str) -> list[object]:
        delays = self.delays_ms(scenario)
        if not delays:
            return [self.calls, scenario, 0, 0, "-", "-", "-", "-"]
        lost = sum(math.isinf(d) for d in delays)
        high = p95(delays)
        return [
            self.calls, scenario, len(delays), lost, statistics.median(delays), high,
            delays[-1], high - self.configured_ms,
        ]  # fmt: skip

    def quiet_p95_excess_ms(self) -> float:
        delays = self.delays_ms("quiet")
        return p95(delays) - self.configured_ms if delays else math.inf

    def offset_stats_ms(self) -> tuple[float, float]:
        """Median and max of |offset|; ``inf`` when fewer than half the sounds heard had a
        mouth opening near them (the lips did not follow: nothing to judge sync by)."""
        if not self.offsets_ms or len(self.offsets_ms) < self.sounds / 2:
            return math.inf, math.inf
        magnitudes = [abs(o) for o in self.offsets_ms]
        return statistics.median(magnitudes), max(magnitudes)


def _print(summaries: Sequence[Summary], runs: dict[int, list[CallFigures]]) -> list[Target]:
    print_table(
        "Mic → heard in Chromium, demo avatar (ms; lost: no echo within the window)",
        ["calls", "scenario", "bursts", "lost", "p50", "p95", "max", "p95 - configured"],
        [s.delay_row(scenario) for s in summaries for scenario in ("quiet", "hog")],
    )
    rows = []
    for calls, figures in runs.items():
        for index, f in enumerate(figures, 1):
            during = [b.delay_ms for b in f.hogged() if b.delay_ms is not None]
            rows.append([
                calls, index, f.steady_ms, max(during, default=math.nan),
                sum(b.delay_ms is None for b in f.hogged()), f.recovery_s(),
                f.offset_cell(hogged=False), f.offset_cell(hogged=True), f.server_note(),
            ])  # fmt: skip
    print_table(
        f"Per call: before, under and after the {HOG_S:g} s hog; |mouth - sound| (ms)",
        ["calls", "call", "steady", "max from the hog on", "lost", "back after (s)",
         "abs offset p50 / max (with / sounds), quiet", "same, from the hog on",
         "server"],
        rows,
    )  # fmt: skip
    targets = []
    for s in summaries:
        median_offset, max_offset = s.offset_stats_ms()
        n = f"{s.calls} call{'s' if s.calls > 1 else ''}"
        targets += [
            Target(f"p95 mic→heard - configured, quiet, {n}", s.quiet_p95_excess_ms(),
                   BROWSER_BUFFERS_MS, higher_is_better=False, unit=" ms"),
            Target(f"back within {RECOVERY_TOLERANCE_MS:g} ms after the hog, {n}",
                   s.recovery_s, 1.0, higher_is_better=False, unit=" s"),
            Target(f"|mouth - sound| median, {n}", median_offset, 40.0,
                   higher_is_better=False, unit=" ms"),
            Target(f"|mouth - sound| max, {n}", max_offset, 80.0,
                   higher_is_better=False, unit=" ms"),
        ]  # fmt: skip
    print_targets(targets)
    return targets


def run(
    quick: bool = False, *, quiet_s: float | None = None, after_s: float | None = None
) -> Result:
    """1 call, then 3: each quiet for ``quiet_s``, the hog, then ``after_s`` more."""
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    quiet_s = quiet_s or (15.0 if quick else 35.0)
    after_s = after_s or (6.0 if quick else 12.0)
    runs: dict[int, list[CallFigures]] = {}
    for calls in (1, 3):
        with tempfile.TemporaryDirectory() as tmp:
            probes, hog = asyncio.run(record(Path(tmp), calls, quiet_s, after_s))
        runs[calls] = [analyse_call(probe, hog) for probe in probes]
        if not any(f.bursts for f in runs[calls]):
            raise SystemExit("no burst came back: the calls carried no audio")
    summaries = [Summary.of(calls, figures) for calls, figures in runs.items()]
    targets = _print(summaries, runs)
    return {
        "configured_ms": summaries[0].configured_ms,
        "calls": {
            s.calls: {
                "quiet_delays_ms": [b.delay_ms for b in s.quiet],
                "hog_delays_ms": [b.delay_ms for b in s.hogged],
                "offsets_ms": s.offsets_ms,
                "recovery_s": s.recovery_s,
            }
            for s in summaries
        },
        "targets": [t.as_json() for t in targets],
    }


#: ``audio.right_context`` values the lower-delay sweep calls with (7 is the default).
RIGHT_CONTEXTS = (7, 5, 3, 1)


def right_context_sweep(quiet_s: float = 20.0) -> Result:
    """Mic → heard for one quiet call per ``audio.right_context`` in :data:`RIGHT_CONTEXTS`:
    the measured end-to-end figure of each lower-delay setting
    (``docs/performance/live-calls.md``)."""
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    rows: list[list[object]] = []
    results: Result = {}
    for right_context in RIGHT_CONTEXTS:
        settings: dict[str, object] = {"audio": {"right_context": right_context}}
        with tempfile.TemporaryDirectory() as tmp:
            probes, hog = asyncio.run(record(Path(tmp), 1, quiet_s, 1.0, settings))
        summary = Summary.of(1, [analyse_call(probe, hog) for probe in probes])
        delays = [d for d in summary.delays_ms("quiet") if not math.isinf(d)]
        lost = len(summary.quiet) - len(delays)
        p50 = statistics.median(delays) if delays else math.nan
        rows.append(
            [
                right_context,
                summary.configured_ms,
                len(delays),
                lost,
                p50,
                p50 - summary.configured_ms,
            ]
        )
        results[str(right_context)] = {"configured_ms": summary.configured_ms, "p50_ms": p50}
    print_table(
        "Mic → heard by audio.right_context, 1 quiet call in Chromium (ms)",
        ["right_context", "configured", "bursts", "lost", "p50", "p50 - configured"],
        rows,
    )
    return results


if __name__ == "__main__":
    import sys

    if "--right-context" in sys.argv:
        right_context_sweep()
    else:
        run(quick="--quick" in sys.argv)
