"""Text-to-speech for the ``say`` API: one Protocol, three engines, chosen from settings.

* :class:`EspeakEngine` runs the local ``espeak-ng`` (robotic, offline, no model files);
* :class:`HttpTtsEngine` POSTs ``{"text", "voice"}`` to a TTS server of your choice and
  decodes the audio it answers with;
* :class:`NoTtsEngine` refuses with a message that says how to enable TTS.

Every engine returns float32 mono samples at the mixer's 48 kHz in [-1, 1] (decoded as a
push is, so a TTS server's full band reaches the caller) and has ``async close()``.

Errors (:mod:`streaming.audio_in.exceptions`)::

    TtsError                 synthesis failed (engine crashed, timed out, bad audio): 502
    ├── TtsUnavailableError  no engine is configured or installed: 503
    └── TtsInputError        the text or voice of the request is unusable: 400
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import unicodedata
from collections.abc import Callable
from typing import Protocol

import aiohttp
import numpy as np

from config.settings import TtsSettings
from streaming.audio_in.exceptions import (
    AudioInputError,
    TtsError,
    TtsInputError,
    TtsUnavailableError,
)
from streaming.audio_in.push import (
    AudioLimits,
    decode_pushed_audio,
    parse_content_type,
    sniff_audio_type,
)

logger = logging.getLogger(__name__)

ESPEAK_EXECUTABLE = "espeak-ng"
#: espeak-ng speaks 2000 characters in well under a second; this only stops a hung process.
ESPEAK_TIMEOUT_S = 30.0
#: Voice names: letters, digits, ``_ + -``, not starting with ``-`` (it would read as an
#: option), at most 32 characters; e.g. ``en``, ``en-us``, ``en+f3``.
VOICE_PATTERN = r"^[a-zA-Z0-9_+][a-zA-Z0-9_+-]{0,31}$"
_VOICE_RE = re.compile(VOICE_PATTERN)
_ENABLE_HINT = (
    "install espeak-ng (`apt-get install espeak-ng`) and set tts.engine to auto or espeak, "
    "or set tts.engine: http with tts.http_url pointing at a TTS server"
)
# Speech the engines may return in one answer: plenty for max_say_chars of text.
_MAX_AUDIO = AudioLimits(max_bytes=64 * 1024 * 1024, max_seconds=900.0)


class TtsEngine(Protocol):
    """A text-to-speech engine; ``name`` appears in logs and the admin API."""

    name: str

    async def synthesize(self, text: str, *, voice: str | None = None) -> np.ndarray:
        """Speak ``text``; float32 mono at 48 kHz in [-1, 1]. Raises :class:`TtsError`."""
        ...

    async def close(self) -> None:
        """Release what the engine holds (processes, connections)."""
        ...


def check_text(text: str, max_chars: int) -> str:
    """Return ``text`` ready to speak, or raise :class:`TtsInputError`.

    Control characters (newlines, tabs, escapes) and lone surrogates become spaces and the ends are
    stripped; what is left must hold something other than whitespace and be at most
    ``max_chars`` characters (``session.max_say_chars``).
    """
    # Cs: lone surrogates (JSON allows "\ud800") cannot be encoded for the engine.
    cleaned = "".join(" " if unicodedata.category(c) in ("Cc", "Cs") else c for c in text)
    cleaned = cleaned.strip()
    if not cleaned:
        raise TtsInputError("the text to say is empty: send at least one word")
    if len(cleaned) > max_chars:
        raise TtsInputError(
            f"the text to say has {len(cleaned)} characters; at most {max_chars} may be "
            "said at once (session.max_say_chars): split it into shorter requests"
        )
    return cleaned


def check_voice(voice: str) -> str:
    """Return ``voice`` if it matches :data:`VOICE_PATTERN`, else raise :class:`TtsInputError`."""
    if not _VOICE_RE.match(voice):
        raise TtsInputError(
            f"voice name {voice!r} is not valid: use 1-32 letters, digits, '_', '+' or '-' "
            "(not starting with '-'), e.g. en, en-us, en+f3"
        )
    return voice


class EspeakEngine:
    """Speech from the local ``espeak-ng``; the text goes in on stdin, never as arguments.

    At most ``max_concurrent`` processes run at once per engine; each is killed after
    ``timeout_s``.
    """

    name: str = "espeak"

    def __init__(
        self, executable: str, voice: str, timeout_s: float, *, max_concurrent: int = 4
    ) -> None:
        self._executable = executable
        self._voice = check_voice(voice)
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_concurrent)

    async def synthesize(self, text: str, *, voice: str | None = None) -> np.ndarray:
        """Speak ``text`` with ``voice`` (default: the engine's); see :class:`TtsEngine`."""
        chosen = self._voice if voice is None else check_voice(voice)
        async with self._slots:
            wav = await self._run(text, chosen)
        try:
            return await asyncio.to_thread(
                decode_pushed_audio, wav, "audio/wav", {}, limits=_MAX_AUDIO
            )
        except AudioInputError as exc:
            raise TtsError(f"espeak-ng produced audio that cannot be decoded: {exc}") from exc

    async def _run(self, text: str, voice: str) -> bytes:
        # --stdin: text that starts with "-" is spoken, never parsed as an option.
        args = ["-v", voice, "--stdout", "--stdin"]
        try:
            proc = await asyncio.create_subprocess_exec(
                self._executable,
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise TtsUnavailableError(
                f"cannot run {self._executable}: {exc}; {_ENABLE_HINT}"
            ) from exc
        try:
            stdout, stderr = await asyncio.wait_for(
                proc.communicate(text.encode("utf-8", "replace")), self._timeout_s
            )
        except TimeoutError:
            await _kill(proc)
            raise TtsError(
                f"espeak-ng took longer than {self._timeout_s:g} s and was stopped; "
                "try again with shorter text"
            ) from None
        except BaseException:
            await _kill(proc)
            raise
        if proc.returncode != 0:
            first = stderr.decode("utf-8", "replace").strip().splitlines()
            reason = first[0] if first else "no error message"
            if "voice does not exist" in reason:
                # A well-formed name espeak-ng has no voice for: the caller's to fix (400).
                raise TtsInputError(
                    f"espeak-ng has no voice {voice!r} (exit code {proc.returncode}: "
                    f"{reason}); `espeak-ng --voices` lists them, e.g. en, en-us, fr, de"
                )
            raise TtsError(
                f"espeak-ng (voice {voice!r}) failed with exit code {proc.returncode}: {reason}"
            )
        if not stdout:
            raise TtsError("espeak-ng produced no audio for the text")
        return stdout

    async def close(self) -> None:
        """Nothing to release: each call's process is reaped before it returns."""


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill ``proc`` if it still runs and reap it, so no zombie is left behind."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()


class HttpTtsEngine:
    """Speech from an HTTP TTS server.

    Each call POSTs ``{"text": ..., "voice": ...}`` as JSON to ``url`` and decodes the
    answer as audio by its Content-Type (anything :func:`decode_pushed_audio` reads; a
    missing or ``application/octet-stream`` type is recognised from the first bytes).
    The :class:`aiohttp.ClientSession` is made on first use by ``session_factory`` and
    closed by :meth:`close`.
    """

    name: str = "http"

    def __init__(
        self,
        url: str,
        timeout_s: float,
        session_factory: Callable[[], aiohttp.ClientSession] = aiohttp.ClientSession,
        *,
        default_voice: str | None = None,
        max_response_bytes: int = _MAX_AUDIO.max_bytes,
    ) -> None:
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session_factory = session_factory
        self._default_voice = default_voice
        self._max_bytes = max_response_bytes
        self._session: aiohttp.ClientSession | None = None

    async def synthesize(self, text: str, *, voice: str | None = None) -> np.ndarray:
        """Ask the server to speak ``text``; see :class:`TtsEngine`."""
        chosen = self._default_voice if voice is None else check_voice(voice)
        if self._session is None or self._session.closed:
            self._session = self._session_factory()
        try:
            async with self._session.post(
                self._url, json={"text": text, "voice": chosen}, timeout=self._timeout
            ) as resp:
                body = await self._read(resp)
                status, content_type = resp.status, resp.headers.get("Content-Type", "")
        except TimeoutError:
            raise TtsError(
                f"TTS server {self._url} did not answer within {self._timeout.total:g} s "
                "(tts.http_timeout_s)"
            ) from None
        except aiohttp.ClientError as exc:
            raise TtsError(f"cannot reach TTS server {self._url}: {exc}") from exc
        media, params = parse_content_type(content_type)
        if media in ("", "application/octet-stream") and not params:
            # Servers often label WAV or MP3 as a generic binary; raw PCM always needs
            # parameters, so a bare type can only be a file.
            content_type = sniff_audio_type(body) or content_type
        try:
            return await asyncio.to_thread(
                decode_pushed_audio, body, content_type, {}, limits=_MAX_AUDIO
            )
        except AudioInputError as exc:
            raise TtsError(
                f"TTS server {self._url} answered HTTP {status} with audio that cannot be "
                f"decoded (Content-Type {content_type or 'missing'!r}): {exc}"
            ) from exc

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        if not 200 <= resp.status < 300:
            # The start of the body is usually the server's reason; a page of HTML is not.
            detail = (await resp.content.read(300)).decode("utf-8", "replace").strip()
            message = f"TTS server {self._url} answered HTTP {resp.status} {resp.reason or ''}"
            raise TtsError(f"{message.rstrip()}: {detail}" if detail else message.rstrip())
        if resp.content_length is not None and resp.content_length > self._max_bytes:
            raise TtsError(self._too_large(resp.content_length))
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(256 * 1024):
            size += len(chunk)
            if size > self._max_bytes:
                raise TtsError(self._too_large(None))
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, size: int | None) -> str:
        got = f"{size} bytes" if size is not None else "more"
        return (
            f"TTS server {self._url} answered {got}; at most {self._max_bytes} bytes "
            "of audio are accepted"
        )

    async def close(self) -> None:
        """Close the HTTP client session, if one was opened."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class NoTtsEngine:
    """The engine when TTS is off or nothing is installed: every call says how to fix it."""

    name: str = "none"

    def __init__(self, reason: str = "text-to-speech is not enabled") -> None:
        self._reason = reason

    async def synthesize(self, text: str, *, voice: str | None = None) -> np.ndarray:
        """Always raise :class:`TtsUnavailableError`."""
        raise TtsUnavailableError(f"{self._reason}: {_ENABLE_HINT}")

    async def close(self) -> None:
        """Nothing to release."""


def build_tts_engine(
    settings: TtsSettings, *, which: Callable[[str], str | None] = shutil.which
) -> TtsEngine:
    """The engine ``settings.engine`` asks for, checked at start-up.

    ``auto`` picks espeak-ng when ``which`` finds it, else :class:`NoTtsEngine`;
    ``espeak`` raises :class:`TtsUnavailableError` when espeak-ng is not installed;
    an invalid ``tts.voice`` raises :class:`TtsInputError`.
    """
    if settings.engine in ("auto", "espeak"):
        executable = which(ESPEAK_EXECUTABLE)
        if executable is not None:
            engine = EspeakEngine(executable, settings.voice, ESPEAK_TIMEOUT_S)
            logger.info("text-to-speech: espeak-ng at %s, voice %s", executable, settings.voice)
            return engine
        if settings.engine == "espeak":
            raise TtsUnavailableError(
                f"tts.engine is espeak but {ESPEAK_EXECUTABLE} is not on PATH: "
                "install it (`apt-get install espeak-ng`) or set tts.engine to auto, http "
                "or none"
            )
        logger.info("text-to-speech: off (%s not found; %s)", ESPEAK_EXECUTABLE, _ENABLE_HINT)
        return NoTtsEngine(f"{ESPEAK_EXECUTABLE} is not installed")
    if settings.engine == "http":
        if settings.http_url is None:  # settings validation already requires it
            raise TtsUnavailableError('tts.engine is "http" but tts.http_url is not set')
        logger.info("text-to-speech: HTTP server %s", settings.http_url)
        return HttpTtsEngine(
            settings.http_url, settings.http_timeout_s, default_voice=settings.voice
        )
    logger.info("text-to-speech: off (tts.engine is none)")
    return NoTtsEngine("text-to-speech is off (tts.engine is none)")
