"""A GStreamer ``webrtcbin`` caller, for ``tests/test_gstreamer_interop.py``.

Runs under Debian's ``/usr/bin/python3`` (its python3-gi and GStreamer 1.22), never in
the venv, and uses only the standard library and ``gi``. It sends the speech of a WAV
file as Opus (played once, in real time), receives the server's video and decodes it
with ``avdec_h264``, and calls the server the way a webrtcbin application does: its own
offer, unmodified, sent to ``POST /offer`` once ICE gathering is complete (no trickle).

Once ``--frames`` video frames are decoded it prints one JSON line (frames decoded, the
decoded caps, the RTP encodings, the connection states reached, the ``a=setup`` of the
offer and of the answer, the session id), or on a failure first (the connection failed,
an error from the pipeline, no frames within ``--timeout-s``) that line with an
``error``. Either way it stays in the call until its standard input closes; then it
exits 1 after a failure, else hangs up (``DELETE /sessions/{id}``) and exits 0.
``--check`` prints what is missing to run at all (exit 3 if anything is).

``--offer-setup`` rewrites the ``a=setup`` of the offer sent and ``--answer-setup`` that
of the answer applied (webrtcbin keeps its own offer): the tests make DTLS fail with them.

``--whip`` publishes instead, as a WHIP client does (RFC 9725): the speech only, no
video asked for, the offer posted as ``application/sdp`` to ``/whip/{avatar}``, the
answer read from the body and the session from ``Location``; its line is printed once
the connection is up, and the end ``DELETE``s the ``Location``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

try:
    import gi  # type: ignore[import-not-found]

    gi.require_version("Gst", "1.0")
    gi.require_version("GstSdp", "1.0")
    gi.require_version("GstWebRTC", "1.0")
    from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # type: ignore[import-not-found]
except (ImportError, ValueError) as exc:  # ValueError: gi is there, a typelib is not
    GI_MISSING: str | None = f"{type(exc).__name__}: {exc}"
else:
    GI_MISSING = None

#: Every element the pipeline needs, and the Debian package that has it.
ELEMENTS = {
    "webrtcbin": "gstreamer1.0-plugins-bad",
    "dtlssrtpenc": "gstreamer1.0-plugins-bad",
    "srtpenc": "gstreamer1.0-plugins-bad",
    "h264parse": "gstreamer1.0-plugins-bad",
    "nicesrc": "gstreamer1.0-nice",
    "rtpbin": "gstreamer1.0-plugins-good",
    "rtpopuspay": "gstreamer1.0-plugins-good",
    "rtph264depay": "gstreamer1.0-plugins-good",
    "wavparse": "gstreamer1.0-plugins-good",
    "opusenc": "gstreamer1.0-plugins-base",
    "audioconvert": "gstreamer1.0-plugins-base",
    "audioresample": "gstreamer1.0-plugins-base",
    "avdec_h264": "gstreamer1.0-libav",
    "clocksync": "libgstreamer1.0-0",
}
VIDEO_CAPS = (
    "application/x-rtp,media=video,encoding-name=H264,payload=102,clock-rate=90000,"
    "packetization-mode=(string)1,profile-level-id=(string)42e01f,"
    "level-asymmetry-allowed=(string)1"
)
AUDIO_BRANCH = (
    "filesrc location={wav} ! wavparse ! clocksync ! audioconvert ! audioresample "
    "! opusenc ! rtpopuspay pt=111 "
    "! application/x-rtp,media=audio,encoding-name=OPUS,payload=111 ! webrtc."
)
SETUP = re.compile(r"^a=setup:(\w+)", re.M)


def missing() -> list[str]:
    """What this interpreter lacks to run a call, each with the package that has it."""
    if GI_MISSING is not None:
        return [
            f"python3-gi with the GStreamer typelibs (python3-gi, gir1.2-gst-plugins-base-1.0, "
            f"gir1.2-gst-plugins-bad-1.0): {GI_MISSING}"
        ]
    Gst.init(None)
    return [
        f"the GStreamer element {name} ({package})"
        for name, package in ELEMENTS.items()
        if Gst.ElementFactory.find(name) is None
    ]


def http_json(url: str, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """``method url`` with a JSON body; the JSON answer (an error names the status)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{method} {url} answered {exc.code}: {exc.read()[:500]!r}") from None


class Caller:
    """One call: the pipeline, the offer/answer exchange, and what was seen.

    GStreamer calls the ``on_*`` methods on its own threads; they hand what changes
    state to the main loop (``GLib.idle_add``), except the frame count (``lock``).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loop = GLib.MainLoop()
        self.lock = threading.Lock()
        self.frames = 0
        self.offer_made = False
        self.reported = False
        self.failed = False
        self.result: dict[str, Any] = {
            "frames_decoded": 0,
            "video_caps": None,
            "rtp_encoding": {},
            "connection_state": "new",
            "connection_states": [],
            "ice_connection_state": "new",
            "offer_setup": None,
            "answer_setup": None,
            "session_id": None,
        }
        self.pipeline = Gst.parse_launch(
            "webrtcbin name=webrtc bundle-policy=max-bundle " + AUDIO_BRANCH.format(wav=args.wav)
        )
        self.webrtc = self.pipeline.get_by_name("webrtc")
        self.location: str | None = None
        if not args.whip:
            self.webrtc.emit(
                "add-transceiver",
                GstWebRTC.WebRTCRTPTransceiverDirection.RECVONLY,
                Gst.Caps.from_string(VIDEO_CAPS),
            )
        self.webrtc.connect("on-negotiation-needed", self.on_negotiation_needed)
        self.webrtc.connect("pad-added", self.on_pad_added)
        self.webrtc.connect("notify::ice-gathering-state", self.on_gathering_state)
        self.webrtc.connect("notify::connection-state", self.on_connection_state)
        self.webrtc.connect("notify::ice-connection-state", self.on_ice_connection_state)
        bus = self.pipeline.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self.on_error)

    # -- outcome ------------------------------------------------------------------

    def report(self, error: str | None = None) -> bool:
        """Print the one JSON line (main loop only). The call goes on, even after an
        error, until standard input closes: the server gets every last packet (a DTLS
        alert) and the test reads the server's side while it lasts."""
        if not self.reported:
            self.reported = True
            with self.lock:
                self.result["frames_decoded"] = self.frames
            if error is not None:
                self.result["error"] = error
                self.failed = True
            print(json.dumps(self.result), flush=True)
        return False

    def on_stdin(self, fd: int, _condition: int) -> bool:
        if os.read(fd, 4096):
            return True
        self.report("standard input closed before the call had decoded its frames")
        self.loop.quit()  # the test is done with the call
        return False

    def on_timeout(self) -> bool:
        with self.lock:
            frames = self.frames
        return self.report(
            f"timed out after {self.args.timeout_s:g} s: {frames} of {self.args.frames} "
            f"frames decoded, connection {self.result['connection_state']}"
        )

    def on_error(self, _bus: Gst.Bus, message: Gst.Message) -> None:
        error, debug = message.parse_error()
        source = message.src.get_name() if message.src else "?"
        self.report(f"pipeline error from {source}: {error.message} ({debug})")

    # -- signalling ---------------------------------------------------------------

    def on_negotiation_needed(self, _webrtc: Gst.Element) -> None:
        promise = Gst.Promise.new_with_change_func(self.on_offer_created, None)
        self.webrtc.emit("create-offer", None, promise)

    def on_offer_created(self, promise: Gst.Promise, _data: object) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None else None
        # webrtcbin 1.22 asks for negotiation once before its audio pad has caps and
        # answers that first offer with none; it asks again once it can make one.
        if offer is None or self.offer_made:
            return
        self.offer_made = True
        self.webrtc.emit("set-local-description", offer, Gst.Promise.new())

    def on_gathering_state(self, _webrtc: Gst.Element, _spec: object) -> None:
        state = self.webrtc.get_property("ice-gathering-state")
        if state == GstWebRTC.WebRTCICEGatheringState.COMPLETE:
            sdp = self.webrtc.get_property("local-description").sdp.as_text()
            GLib.idle_add(self.send_offer, sdp)

    def send_offer(self, sdp: str) -> bool:
        if self.result["offer_setup"] is not None:
            return False  # sent already
        if self.args.offer_setup:
            sdp = SETUP.sub(f"a=setup:{self.args.offer_setup}", sdp)
        self.result["offer_setup"] = sorted(set(SETUP.findall(sdp)))
        if self.args.whip:
            threading.Thread(target=self.post_whip, args=(sdp,), daemon=True).start()
            return False
        body = {"sdp": sdp, "type": "offer", "avatar": self.args.avatar}
        threading.Thread(target=self.post_offer, args=(body,), daemon=True).start()
        return False

    def post_whip(self, sdp: str) -> None:
        url = f"{self.args.url}/whip/{self.args.avatar}"
        request = urllib.request.Request(
            url, data=sdp.encode(), method="POST", headers={"Content-Type": "application/sdp"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                location = response.headers["Location"]
                answer = response.read().decode()
        except urllib.error.HTTPError as exc:
            message = f"POST {url} answered {exc.code}: {exc.read()[:500]!r}"
            GLib.idle_add(self.report, f"the offer was not answered: {message}")
            return
        except OSError as exc:
            GLib.idle_add(self.report, f"the offer was not answered: {exc}")
            return
        self.location = location
        session_id = location.rsplit("/", 1)[-1]
        GLib.idle_add(self.apply_answer, {"session_id": session_id, "sdp": answer})

    def post_offer(self, body: dict[str, Any]) -> None:
        try:
            answer = http_json(self.args.url + "/offer", "POST", body)
        except (RuntimeError, OSError) as exc:
            GLib.idle_add(self.report, f"the offer was not answered: {exc}")
            return
        GLib.idle_add(self.apply_answer, answer)

    def apply_answer(self, answer: dict[str, Any]) -> bool:
        self.result["session_id"] = answer["session_id"]
        sdp = answer["sdp"]
        self.result["answer_setup"] = sorted(set(SETUP.findall(sdp)))
        if self.args.answer_setup:
            sdp = SETUP.sub(f"a=setup:{self.args.answer_setup}", sdp)
        result, message = GstSdp.SDPMessage.new_from_text(sdp)
        if result != GstSdp.SDPResult.OK:
            return self.report(f"GStreamer cannot parse the answer ({result.value_nick})")
        description = GstWebRTC.WebRTCSessionDescription.new(
            GstWebRTC.WebRTCSDPType.ANSWER, message
        )
        self.webrtc.emit("set-remote-description", description, Gst.Promise.new())
        return False

    def on_connection_state(self, _webrtc: Gst.Element, _spec: object) -> None:
        state = self.webrtc.get_property("connection-state").value_nick
        GLib.idle_add(self.connection_state_changed, state)

    def connection_state_changed(self, state: str) -> bool:
        self.result["connection_state"] = state
        self.result["connection_states"].append(state)
        if state == "failed":
            self.report("the connection failed")
        elif state == "connected" and self.args.whip:
            self.report()  # a publisher decodes nothing: connected is its success
        return False

    def on_ice_connection_state(self, _webrtc: Gst.Element, _spec: object) -> None:
        state = self.webrtc.get_property("ice-connection-state").value_nick
        GLib.idle_add(self.result.__setitem__, "ice_connection_state", state)

    # -- media --------------------------------------------------------------------

    def on_pad_added(self, _webrtc: Gst.Element, pad: Gst.Pad) -> None:
        if pad.get_direction() != Gst.PadDirection.SRC:
            return
        structure = (pad.get_current_caps() or pad.query_caps(None)).get_structure(0)
        media, encoding = structure.get_string("media"), structure.get_string("encoding-name")
        GLib.idle_add(self.result["rtp_encoding"].__setitem__, media, encoding)
        decode = media == "video" and encoding == "H264"
        chain = "rtph264depay ! h264parse ! avdec_h264 name=decoder ! " if decode else ""
        branch = Gst.parse_bin_from_description(f"queue ! {chain}fakesink async=false", True)
        self.pipeline.add(branch)
        branch.sync_state_with_parent()
        pad.link(branch.get_static_pad("sink"))
        if decode:
            decoded = branch.get_by_name("decoder").get_static_pad("src")
            decoded.add_probe(Gst.PadProbeType.BUFFER, self.on_frame)

    def on_frame(self, pad: Gst.Pad, _info: Gst.PadProbeInfo) -> Gst.PadProbeReturn:
        with self.lock:
            self.frames += 1
            done = self.frames == self.args.frames
        if done:
            caps = pad.get_current_caps()
            GLib.idle_add(self.frames_decoded, caps.to_string() if caps else None)
        return Gst.PadProbeReturn.OK

    def frames_decoded(self, caps: str | None) -> bool:
        self.result["video_caps"] = caps
        return self.report()

    # -- run ----------------------------------------------------------------------

    def run(self) -> int:
        GLib.timeout_add(round(self.args.timeout_s * 1000), self.on_timeout)
        GLib.io_add_watch(sys.stdin.fileno(), GLib.IO_IN | GLib.IO_HUP, self.on_stdin)
        self.pipeline.set_state(Gst.State.PLAYING)
        try:
            self.loop.run()
        finally:
            self.pipeline.set_state(Gst.State.NULL)
        session_id = self.result["session_id"]
        if session_id and not self.failed:
            where = self.location or f"/sessions/{session_id}"
            http_json(f"{self.args.url}{where}", "DELETE")
        return 1 if self.failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("wav", nargs="?", help="speech to send (played once, in real time)")
    parser.add_argument("--avatar", default="demo")
    parser.add_argument("--frames", type=int, default=50, help="decoded frames to wait for")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--offer-setup", choices=("actpass", "active", "passive"))
    parser.add_argument("--answer-setup", choices=("active", "passive"))
    parser.add_argument("--whip", action="store_true", help="publish the speech over WHIP")
    parser.add_argument("--check", action="store_true", help="list what is missing; exit 3 if any")
    args = parser.parse_args()
    lacking = missing()
    if args.check or lacking:
        print(json.dumps({"missing": lacking}), flush=True)
        return 3 if lacking else 0
    if not args.url or not args.wav:
        parser.error("the server's URL and a WAV file are required")
    return Caller(args).run()


if __name__ == "__main__":
    sys.exit(main())
