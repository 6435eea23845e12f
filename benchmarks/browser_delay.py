"""Mic → heard: how long a caller's sound takes to come back, measured in a real browser.

Headless Debian Chromium (driven by Playwright, as in ``tests/test_demo_page.py``) calls
the server with a fake microphone that plays tone bursts at irregular intervals. In the
page, the microphone and the call's returned audio go into one Web Audio script node
through a channel merger, so both are sampled on the same clock, sample-aligned; the
delay of a burst is the distance between its onset at the microphone and its onset in
the returned audio. That covers the browser's capture and send path, the network
(loopback), the server and the browser's receive path (its WebRTC jitter buffer and
decoder), not the sound card's output buffer.

The server sends the caller's audio back with the avatar, ``session.delay_s`` (the
configured figure) after it is on the session timeline; the excess over it is the
receive path into the server, the send path out and the browser's own buffers.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import wave
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.chromium import CHROMIUM, caller_page
from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.live_server import live_server

RATE = 48_000
BURST_S = 0.3
# Irregular gaps, so no burst can be matched with the wrong one by a periodic delay.
GAPS_S = (1.3, 1.9, 1.1, 2.3, 1.6, 1.2, 2.0, 1.45)
BLOCK = 128  # samples per energy value in the page
BROWSER_BUFFERS_MS = 80.0  # what the target allows the browser's own buffers (issue 12)


# Runs in the page (the server's origin): call, then record both channels' energy.
PAGE_SCRIPT = """
async ({avatar, block}) => {
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
    body: JSON.stringify({sdp: pc.localDescription.sdp, type: 'offer', avatar})});
  const answer = await response.json();
  await pc.setRemoteDescription({type: answer.type, sdp: answer.sdp});
  await gotAudio;
  // Chrome only pulls a remote WebRTC stream's audio while a media element plays it.
  const video = document.createElement('video');
  video.srcObject = remote; video.muted = true; document.body.appendChild(video);
  await video.play();
  const merger = ctx.createChannelMerger(2);
  ctx.createMediaStreamSource(mic).connect(merger, 0, 0);
  ctx.createMediaStreamSource(remote).connect(merger, 0, 1);
  const node = ctx.createScriptProcessor(1024, 2, 1);
  const energy = {mic: [], remote: [], rate: ctx.sampleRate, block};
  node.onaudioprocess = e => {
    for (const [ch, out] of [[0, energy.mic], [1, energy.remote]]) {
      const x = e.inputBuffer.getChannelData(ch);
      for (let i = 0; i < x.length; i += block) {
        let s = 0;
        for (let j = i; j < i + block; j++) s += x[j] * x[j];
        out.push(Math.sqrt(s / block));
      }
    }
  };
  merger.connect(node); node.connect(ctx.destination);
  window.__energy = energy;
  window.__session = answer.session_id;
  return answer.session_id;
}
"""


def write_bursts(path: Path) -> Path:
    """Tone bursts (220 Hz with harmonics, 300 ms) after the gaps of :data:`GAPS_S`."""
    t = np.arange(int(BURST_S * RATE)) / RATE
    tone = sum(np.sin(2 * np.pi * 220 * k * t) / k for k in (1, 2, 3))
    tone *= 0.3 * np.minimum(1.0, np.minimum(t, BURST_S - t) / 0.01)  # 10 ms ramps
    parts = []
    for gap in GAPS_S:
        parts += [np.zeros(int(gap * RATE)), tone]
    pcm = (np.concatenate(parts) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm.tobytes())
    return path


def onsets(energy: list[float], seconds_per_value: float) -> list[float]:
    """Times where the energy rises over a tenth of its peak after 0.5 s below it."""
    values = np.asarray(energy)
    if not len(values) or values.max() <= 0:
        return []
    loud = values > 0.1 * values.max()
    quiet_needed = int(0.5 / seconds_per_value)
    found, quiet = [], quiet_needed
    for i, is_loud in enumerate(loud):
        if is_loud and quiet >= quiet_needed:
            found.append(i * seconds_per_value)
        quiet = 0 if is_loud else quiet + 1
    return found


def burst_delays_ms(energy: dict[str, Any], configured_ms: float) -> list[float]:
    """Each microphone burst's delay to its first onset in the returned audio.

    Nothing comes back sooner than the configured delay: an onset before it (the call's
    first sound, the fake microphone's file starting over) belongs to another burst.
    """
    step = energy["block"] / energy["rate"]
    heard = onsets(energy["remote"], step)
    earliest = configured_ms / 1000 - 0.02
    delays = []
    for said in onsets(energy["mic"], step):
        later = [h - said for h in heard if earliest < h - said < earliest + 1.0]
        if later:
            delays.append(1000 * later[0])
    return delays


async def _measure(root: Path, seconds: float) -> dict[str, Any]:
    mic = write_bursts(root / "bursts.wav")
    async with live_server(root) as (_app, url), caller_page(root / "profile", mic) as page:
        await page.goto(url + "/")
        session_id = await page.evaluate(PAGE_SCRIPT, {"avatar": "demo", "block": BLOCK})
        await asyncio.sleep(seconds)  # a benchmark: the call plays for this long
        energy = await page.evaluate("() => window.__energy")
        state = await page.evaluate(
            "async id => (await fetch('/sessions/' + id)).json()", session_id
        )
    configured_ms = float(state["delay_ms"])
    return {"delays_ms": burst_delays_ms(energy, configured_ms), "configured_ms": configured_ms}


def run(quick: bool = False, *, seconds: float | None = None) -> Result:
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    seconds = seconds or (15.0 if quick else 30.0)
    with tempfile.TemporaryDirectory() as tmp:
        measured = asyncio.run(_measure(Path(tmp), seconds))
    delays = sorted(measured["delays_ms"])
    configured = float(measured["configured_ms"])
    if not delays:
        raise SystemExit("no burst came back: the call carried no audio")
    p50 = statistics.median(delays)
    p95 = delays[min(len(delays) - 1, round(0.95 * (len(delays) - 1)))]
    print_table(
        "Mic → heard in Chromium, 1 call, demo avatar (ms)",
        ["bursts", "configured", "p50", "p95", "min", "max", "p50 - configured"],
        [[len(delays), configured, p50, p95, delays[0], delays[-1], p50 - configured]],
    )
    targets = [
        Target(
            "p95 mic→heard - configured delay, 1 call",
            p95 - configured,
            BROWSER_BUFFERS_MS,
            higher_is_better=False,
            unit=" ms",
        )
    ]
    print_targets(targets)
    return {
        "delays_ms": delays,
        "configured_ms": configured,
        "targets": [t.as_json() for t in targets],
    }
