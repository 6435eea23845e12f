"""What lipstream adds to aiortc's SDP answer, and reads from the caller's offer.

aiortc answers with the codecs, feedback and header extensions it knows itself; two
things a real network needs are not among them (``docs/design/link.md`` §19):

- **transport-cc**: when the offer has the transport-wide sequence number extension and
  ``transport-cc`` feedback, the answer names both, for audio and video. The call's link
  then writes that number on every packet it sends (``streaming/link/sender.py``) and the
  caller reports when each arrived: the send-side estimate's input. (A caller that did
  not offer it keeps sending REMB.)
- **Opus in-band FEC**: ``useinbandfec=1`` on the Opus format asks the caller to carry a
  copy of each voice frame in the next packet when it sees loss, which the receive path
  decodes (``webrtc/opus_decoder.py``).
- **Opus DTX** (``audio.dtx``): ``usedtx=1`` asks the caller to send no audio packets
  while it is silent, but a 1-byte one and a comfort-noise update every 400 ms
  (``webrtc/dtx.py``).

The SDP is edited as text, line by line within each media section, so nothing aiortc
wrote is re-serialised.
"""

from __future__ import annotations

import re

from streaming.link.rtp_bytes import ABS_SEND_TIME_URI, TRANSPORT_CC_URI

_EXTMAP = re.compile(r"^a=extmap:(\d+)(?:/\w+)?\s+(\S+)")
_RTPMAP = re.compile(r"^a=rtpmap:(\d+)\s+([^/\s]+)/")
_FMTP = re.compile(r"^a=fmtp:(\d+)\s*(.*)$")
_NOT_MEDIA = {"rtx", "red", "ulpfec", "flexfec-03"}


def _sections(sdp: str) -> list[list[str]]:
    """The session part, then each media section, as lists of lines (no line ends)."""
    sections: list[list[str]] = [[]]
    for line in sdp.splitlines():
        if line.startswith("m="):
            sections.append([])
        sections[-1].append(line)
    return sections


def _join(sections: list[list[str]]) -> str:
    return "\r\n".join(line for section in sections for line in section) + "\r\n"


def _kind(section: list[str]) -> str:
    return section[0][2:].split(" ", 1)[0] if section and section[0].startswith("m=") else ""


def extension_id(sdp: str, uri: str, kind: str = "video") -> int | None:
    """The id ``sdp``'s first ``kind`` section gives header extension ``uri``, if any."""
    for section in _sections(sdp)[1:]:
        if _kind(section) != kind:
            continue
        for line in section:
            match = _EXTMAP.match(line)
            if match and match.group(2) == uri:
                return int(match.group(1))
        return None
    return None


def offers_transport_cc(offer: str) -> int | None:
    """The offer's transport-wide sequence number extension id when its video section
    also offers ``transport-cc`` feedback; else None."""
    ident = extension_id(offer, TRANSPORT_CC_URI)
    if ident is None:
        return None
    for section in _sections(offer)[1:]:
        if _kind(section) == "video":
            return ident if any(line.endswith(" transport-cc") for line in section) else None
    return None


def abs_send_time_id(answer: str) -> int | None:
    """The abs-send-time extension id the answer's video section uses (aiortc's)."""
    return extension_id(answer, ABS_SEND_TIME_URI)


def with_transport_cc(answer: str, ident: int) -> str:
    """``answer`` with transport-cc on every audio and video section: the extension at
    ``ident`` and ``transport-cc`` feedback for each media format."""
    sections = _sections(answer)
    for section in sections[1:]:
        if _kind(section) not in ("audio", "video"):
            continue
        formats = [
            match.group(1)
            for line in section
            if (match := _RTPMAP.match(line)) and match.group(2).lower() not in _NOT_MEDIA
        ]
        extra = [f"a=extmap:{ident} {TRANSPORT_CC_URI}"]
        extra += [f"a=rtcp-fb:{pt} transport-cc" for pt in formats]
        extra = [line for line in extra if line not in section]
        at = _last_index(section, ("a=extmap:", "a=rtcp-fb:", "a=rtpmap:", "a=fmtp:"))
        section[at + 1 : at + 1] = extra
    return _join(sections)


def with_opus_params(answer: str, *, dtx: bool) -> str:
    """``answer`` asking for Opus in-band FEC (``useinbandfec=1``) on each Opus format,
    and with ``dtx`` for DTX too (``usedtx=1``); parameters already there are kept."""
    wanted = {"useinbandfec": "1", **({"usedtx": "1"} if dtx else {})}
    sections = _sections(answer)
    for section in sections[1:]:
        if _kind(section) != "audio":
            continue
        opus = [m.group(1) for line in section
                if (m := _RTPMAP.match(line)) and m.group(2).lower() == "opus"]  # fmt: skip
        for pt in opus:
            for index, line in enumerate(section):
                match = _FMTP.match(line)
                if match and match.group(1) == pt:
                    params = match.group(2).strip()
                    named = {p.split("=", 1)[0].strip().lower() for p in params.split(";")}
                    extra = [f"{k}={v}" for k, v in wanted.items() if k not in named]
                    section[index] = f"a=fmtp:{pt} " + ";".join(
                        ([params] if params else []) + extra
                    )
                    break
            else:
                at = max(i for i, line in enumerate(section) if line.startswith(f"a=rtpmap:{pt} "))
                fmtp = ";".join(f"{k}={v}" for k, v in wanted.items())
                section.insert(at + 1, f"a=fmtp:{pt} {fmtp}")
    return _join(sections)


def _last_index(section: list[str], prefixes: tuple[str, ...]) -> int:
    """The index of the last line of ``section`` starting with one of ``prefixes`` (the
    media line if none does)."""
    found = [i for i, line in enumerate(section) if line.startswith(prefixes)]
    return found[-1] if found else 0
