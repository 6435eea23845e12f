"""libopus's decoder, called directly: a caller's lost packet rebuilt from the next one.

A caller on a lossy uplink loses some of its 20 ms voice packets. Opus can carry a
coarse copy of each frame inside the next packet (in-band FEC, RFC 6716 §2.1.7), and the
answer asks callers to send it (``useinbandfec=1``, ``webrtc/answer_sdp.py``);
FFmpeg's Opus decoders cannot read it. So the receive path decodes with libopus itself, through
``ctypes`` (``docs/design/link.md`` §19): when a packet arrives after a gap, the frame
just before it is decoded from its FEC (``decode_fec``), any earlier missing frames are
concealed by libopus (packet loss concealment), then the packet itself is decoded, all
on the one decoder, as libopus requires.

The library is the copy PyAV's wheel carries (``av.libs`` / ``av/.dylibs``: the same
libopus the outgoing voice is encoded with), else the system's. Without either,
:func:`load_libopus` raises :class:`OpusUnavailableError` and the receive path decodes
with PyAV, without FEC.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path

import numpy as np

RATE = 48_000
#: The longest an Opus packet lasts (120 ms at 48 kHz): the decode buffer's size.
MAX_SAMPLES = 5760
_S16_SCALE = np.float32(1 / 32768)


class OpusUnavailableError(RuntimeError):
    """No libopus could be loaded (neither the system's nor PyAV's)."""


def _candidates() -> list[str]:
    import av

    package = Path(av.__file__).resolve().parent
    paths = []
    for folder in (package.parent / "av.libs", package / ".dylibs"):
        paths += [str(p) for p in sorted(folder.glob("libopus*"))] if folder.is_dir() else []
    found = ctypes.util.find_library("opus")
    return [*paths, found] if found else paths


@functools.cache
def load_libopus() -> ctypes.CDLL:
    """libopus, its decoder functions typed; :class:`OpusUnavailableError` if none loads."""
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
            continue
        lib.opus_decoder_create.restype = ctypes.c_void_p
        lib.opus_decoder_create.argtypes = [
            ctypes.c_int32,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int),
        ]
        lib.opus_decode.restype = ctypes.c_int
        lib.opus_decode.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
            ctypes.POINTER(ctypes.c_int16), ctypes.c_int, ctypes.c_int,
        ]  # fmt: skip
        lib.opus_decoder_destroy.restype = None
        lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
        lib.opus_packet_get_nb_samples.restype = ctypes.c_int
        lib.opus_packet_get_nb_samples.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32]
        if hasattr(lib, "opus_packet_has_lbrr"):  # libopus 1.5 and later
            lib.opus_packet_has_lbrr.restype = ctypes.c_int
            lib.opus_packet_has_lbrr.argtypes = [ctypes.c_char_p, ctypes.c_int32]
        return lib
    raise OpusUnavailableError(
        "libopus could not be loaded (" + ("; ".join(errors) or "none found") + "): "
        "install it (apt-get install libopus0) for in-band FEC on the caller's audio"
    )


class OpusDecoder:
    """One stream's libopus decoder: 48 kHz mono, 16-bit samples as float32 (module doc)."""

    def __init__(self) -> None:
        self._lib = load_libopus()
        error = ctypes.c_int(0)
        state = self._lib.opus_decoder_create(RATE, 1, ctypes.byref(error))
        if not state or error.value != 0:
            raise OpusUnavailableError(f"opus_decoder_create failed ({error.value})")
        self._state: int | None = state
        # 16-bit, as FFmpeg's libopus decoder gave it: libopus's float output of a
        # silence is not exact zeros, and the receive path tells silence by zeros.
        self._out = np.empty(MAX_SAMPLES, dtype=np.int16)
        self._pointer = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_int16))

    def samples_in(self, data: bytes) -> int:
        """How many samples ``data`` decodes to (libopus reads its TOC); < 0 if invalid."""
        return int(self._lib.opus_packet_get_nb_samples(data, len(data), RATE))

    def has_fec(self, data: bytes) -> bool | None:
        """Whether ``data`` carries FEC for the frame before it (None: this libopus
        cannot tell)."""
        if not hasattr(self._lib, "opus_packet_has_lbrr"):
            return None
        return bool(self._lib.opus_packet_has_lbrr(data, len(data)) > 0)

    def decode(self, data: bytes | None, *, fec: bool = False, samples: int = 960) -> np.ndarray:
        """The samples of ``data``; with ``fec``, those of the frame *before* it, from its
        FEC (``samples`` long: the lost frame's length); ``data`` None conceals a lost
        frame of ``samples``. Raises ``ValueError`` for a packet libopus refuses."""
        if self._state is None:
            raise ValueError("the decoder is closed")
        size = MAX_SAMPLES if data is not None and not fec else min(samples, MAX_SAMPLES)
        count = self._lib.opus_decode(
            self._state, data, 0 if data is None else len(data), self._pointer, size, int(fec)
        )
        if count < 0:
            raise ValueError(f"libopus could not decode the packet (error {count})")
        return self._out[:count].astype(np.float32) * _S16_SCALE

    def close(self) -> None:
        if self._state is not None:
            self._lib.opus_decoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()
