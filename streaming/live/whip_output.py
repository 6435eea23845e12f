"""A session published to a media server over WHIP (RFC 9725; ``docs/design/broadcast.md`` §21).

Janus, LiveKit ingress, MediaMTX, SRS, a cloud WHIP ingest, or another lipstream's
``/whip/{avatar}``: the output makes a send-only offer
(:class:`~streaming.webrtc.publisher.Publisher`: the session's own H.264 payloads and
Opus packets, as a viewer is sent them), posts it as ``application/sdp`` with the
endpoint's bearer token, applies the ``201``'s answer and keeps the ``Location`` to
``DELETE`` when it stops. A publication that is refused, never connects within
``outputs.connect_timeout_s`` or drops is ended (its ``Location`` deleted) and made
again after 1 s, 2, 4… up to ``outputs.retry_max_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urljoin

import aiohttp

from config.settings import Settings
from streaming.broadcast.rtmp import OutputStatus
from streaming.exceptions import OfferError
from streaming.live.tasks import StageTasks
from streaming.webrtc.ice import ice_configuration
from streaming.webrtc.peer import PeerMedia
from streaming.webrtc.publisher import Publisher
from streaming.webrtc.video_encoder import EncoderFactory

logger = logging.getLogger(__name__)


class PublishRefusedError(Exception):
    """The WHIP endpoint did not take the offer."""


class WhipOutput:
    """The session published to ``url`` (module doc); :meth:`run` is its task."""

    def __init__(
        self,
        status: OutputStatus,
        url: str,
        token: str | None,
        media: PeerMedia,
        encoders: EncoderFactory,
        settings: Settings,
    ) -> None:
        self.status = status
        self._url = url
        self._token = token
        self._media = media
        self._encoders = encoders
        self._settings = settings
        self._frames_before = 0
        self._publisher: Publisher | None = None

    async def finish(self) -> None:
        """After its task was cancelled: nothing left (the task closed its publication)."""

    def refresh(self) -> None:
        """Bring the status's frame count up to date."""
        publisher = self._publisher
        if publisher is not None:
            self.status.frames_sent = self._frames_before + publisher.frames_sent

    async def run(self) -> None:
        """Publish until cancelled, publishing again after each failure (module doc)."""
        outputs = self._settings.outputs
        wait_s = 1.0
        timeout = aiohttp.ClientTimeout(total=outputs.connect_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                connects = self.status.connects
                reason = await self._publish_once(http)
                if self.status.connects > connects:
                    wait_s = 1.0  # it was live: the waits start again
                self.status.state = "retrying"
                self.status.retries += 1
                self.status.last_error = reason[:300]
                logger.warning(
                    "output %s to %s ended (%s); publishing again in %.0f s",
                    self.status.output_id,
                    self.status.target,
                    reason,
                    wait_s,
                )
                await asyncio.sleep(wait_s)
                wait_s = min(2 * wait_s, outputs.retry_max_s)

    async def _publish_once(self, http: aiohttp.ClientSession) -> str:
        """One publication, until it fails: why it ended."""
        status = self.status
        status.state = "connecting"
        tasks = StageTasks(f"whip-{status.output_id}")
        publisher = Publisher(self._media, self._encoders, tasks, ice_configuration(self._settings))
        self._publisher = publisher
        location: str | None = None
        try:
            offer = await publisher.offer()
            answer, location = await self._post(http, offer)
            await publisher.accept(answer)
            connected = asyncio.create_task(publisher.connected.wait())
            ended = asyncio.create_task(tasks.ended())
            try:
                await asyncio.wait(
                    {connected, ended},
                    timeout=self._settings.outputs.connect_timeout_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not connected.done():
                    return ended.result() if ended.done() else "not connected in time"
                status.state = "live"
                status.connects += 1
                logger.info("output %s is live: %s", status.output_id, status.target)
                return await ended
            finally:
                connected.cancel()
                ended.cancel()
        except (PublishRefusedError, OfferError, aiohttp.ClientError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            self.refresh()
            self._frames_before = status.frames_sent
            self._publisher = None
            end = asyncio.ensure_future(self._end(http, publisher, tasks, location))
            try:
                await asyncio.shield(end)
            except asyncio.CancelledError:  # stopped: finish closing (bounded), then stop
                await end
                raise

    async def _post(self, http: aiohttp.ClientSession, offer: str) -> tuple[str, str | None]:
        headers = {"Content-Type": "application/sdp"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        async with http.post(self._url, data=offer.encode(), headers=headers) as response:
            body = await response.text()
            if response.status not in (200, 201):
                raise PublishRefusedError(f"{response.status}: {body[:200]}")
            location = response.headers.get("Location")
        return body, urljoin(self._url, location) if location else None

    async def _end(
        self,
        http: aiohttp.ClientSession,
        publisher: Publisher,
        tasks: StageTasks,
        location: str | None,
    ) -> None:
        """Close one publication: its resource deleted first (best effort; RFC 9725's
        way to end it), then its connection closed and its tasks stopped."""
        if location is not None and not http.closed:
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.delete(location, headers=headers):
                    pass
        tasks.end("output stopped")
        await tasks.stop()
        await publisher.close()
