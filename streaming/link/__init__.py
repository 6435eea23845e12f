"""The call's link to its caller: how much it may send, how, and at what quality.

Real networks are slow, lossy and change under a call (``docs/design/link.md`` §19).
This package turns what a caller reports back (transport-cc feedback, REMB, receiver
reports, NACKs) into one bandwidth estimate per call and acts on it: the pacer spreads
the video's packets, the quality ladder picks the frame size and rate the budget buys,
NACKed packets are resent from a history kept by time, and probes find the room a
freed link has again. It works on packets as bytes and on clocks passed in; it imports
neither aiortc nor anything else of lipstream's (``streaming/webrtc`` hooks it into a
peer connection, ``streaming/live`` reports it).

Modules: ``controller`` (one call's link, the owner of the rest), ``bandwidth`` (the
estimate), ``estimate`` (its rate controllers), ``delay_based`` (the queue detector),
``feedback`` (sent packets against transport-cc feedback), ``probes``, ``pacer``,
``sender`` (every packet out), ``history`` (for retransmission), ``ladder``,
``rtp_bytes`` and ``rtcp_bytes`` (the wire formats).
"""

from streaming.link.bandwidth import BandwidthEstimator, Mode
from streaming.link.controller import AUDIO_BPS, LinkController, LinkSnapshot
from streaming.link.ladder import Ladder, Step, steps_for
from streaming.link.pacer import Pacer
from streaming.link.sender import MediaSender, Streams

__all__ = [
    "AUDIO_BPS",
    "BandwidthEstimator",
    "Ladder",
    "LinkController",
    "LinkSnapshot",
    "MediaSender",
    "Mode",
    "Pacer",
    "Step",
    "Streams",
    "steps_for",
]
