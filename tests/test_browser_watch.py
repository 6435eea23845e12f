"""Watching sessions in a browser: ``createSession``/``watch`` of ``web/static/lipstream.js``,
the viewer page ``web/static/watch.html`` and the demo page's "Watch this session" link.

Headless Debian Chromium (Playwright, as in ``tests/test_browser_client.py``) against the
real application on 127.0.0.1: a session made over HTTP plays in the viewer page, speaks
and is heard there; a call made on the demo page plays in the tab its link opens. Each
step waits on what the page has received, with a generous timeout; nothing is timed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from config.settings import Settings
from tests.browser_page import browser_page
from tests.live_calls import until
from tests.media import require_espeak
from web.app import build_app
from web.app_keys import SESSIONS

if TYPE_CHECKING:
    from playwright.async_api import Page, Request

pytestmark = pytest.mark.slow

# The viewer page's <video>: the frames it has decoded and shown.
VIDEO_FRAMES = "() => document.querySelector('video').getVideoPlaybackQuality().totalVideoFrames"
# lipstream.js in the page, as window.lipstream (the module the viewer page uses).
IMPORT_CLIENT = """async () => {
  window.lipstream = await import("/static/lipstream.js");
  return Object.keys(window.lipstream).sort();
}"""
# What a promise rejects with, as JSON.
REJECTION = """(promise) => promise.then(
  () => null,
  (err) => ({ lipstream: err instanceof window.lipstream.LipstreamError, name: err.name,
              status: err.status ?? null, code: err.code ?? null, message: err.message }))"""
# A viewer from watch(), kept as window.viewer with what it dispatches.
WATCH = """async (options) => {
  const video = document.querySelector("video");
  const viewer = await window.lipstream.watch({ ...options, video });
  window.viewer = viewer;
  window.ended = null;
  viewer.addEventListener("ended", (e) => { window.ended = e.detail.reason; });
  return { location: viewer.location, viewerId: viewer.viewerId, iceServers: viewer.iceServers,
           attached: video.srcObject === viewer.stream, state: viewer.pc.connectionState,
           label: viewer.dataChannel?.label ?? null };
}"""
# The server's answers to WHEP offers, each with a TURN server added as a Link header.
ADD_LINK = """() => {
  const fetched = window.fetch;
  window.fetch = async (url, init) => {
    const response = await fetched(url, init);
    if (!String(url).endsWith("/whep")) return response;
    const headers = new Headers(response.headers);
    headers.append("Link", '<turn:turn.example.net?transport=udp>; rel="ice-server"; ' +
      'username="1700000000:viewer"; credential="a+b/c=="; credential-type="password"');
    return new Response(await response.text(), { status: response.status, headers });
  };
}"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir per module, so the demo avatar is generated once."""
    return tmp_path_factory.mktemp("lipstream_data")


@pytest.fixture
async def server(tmp_path: Path, data_dir: Path, loopback: None) -> AsyncIterator[TestServer]:
    """The real application on 127.0.0.1 serving the demo avatar and the pages."""
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(data_dir)},
            "devices": {"kind": "cpu"},
        }
    )
    test_server = TestServer(build_app(settings), host="127.0.0.1")
    async with test_server:
        yield test_server


@pytest.fixture
async def http(server: TestServer) -> AsyncIterator[ClientSession]:
    """Plain HTTP to the server, as an app's backend would call it."""
    async with ClientSession(_base(server)) as session:
        yield session


def _base(server: TestServer) -> str:
    return str(server.make_url("/")).rstrip("/")


async def _create_session(http: ClientSession) -> str:
    response = await http.post("/sessions", json={"avatar": "demo"})
    assert response.status == 201, await response.text()
    session_id: str = (await response.json())["session_id"]
    return session_id


async def _state(http: ClientSession, session_id: str) -> dict[str, Any]:
    response = await http.get(f"/sessions/{session_id}")
    assert response.status == 200, await response.text()
    state: dict[str, Any] = await response.json()
    return state


def _viewers_are(server: TestServer, session_id: str, count: int) -> Any:
    assert server.app is not None
    return lambda: server.app[SESSIONS].get(session_id).audience.count == count


def _whep_request(request: Request) -> bool:
    return request.method == "POST" and request.url.endswith("/whep")


async def _events(page: Page, kind: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = await page.evaluate("() => window.lipstreamEvents")
    return [e for e in events if e["type"] == kind]


async def test_the_viewer_page_plays_and_hears_a_session_made_over_http(
    server: TestServer, http: ClientSession, tmp_path: Path
) -> None:
    require_espeak()  # the server's text-to-speech engine
    from playwright.async_api import expect

    session_id = await _create_session(http)
    url = f"{_base(server)}/static/watch.html?session={session_id}"
    async with browser_page(tmp_path, url) as page:
        await expect(page.locator("#session-id")).to_have_text(session_id)
        await page.wait_for_function("() => window.lipstreamStats.state === 'connected'")
        await expect(page.get_by_role("status")).to_have_text("Watching.")
        await page.wait_for_function(f"() => ({VIDEO_FRAMES})() >= 25")
        assert await page.evaluate("() => document.querySelector('video').videoWidth") == 1280
        assert (await _state(http, session_id))["viewers"] == 1
        await page.wait_for_function("() => window.lipstreamStats.audioEnergy !== null")
        silent = (await page.evaluate("() => window.lipstreamStats"))["audioEnergy"]
        assert silent < 0.01  # the avatar has said nothing yet

        said = await http.post(f"/sessions/{session_id}/say", json={"text": "Hello, viewer."})
        assert said.status == 202, await said.text()
        utterance = (await said.json())["utterance"]
        await page.wait_for_function(
            "() => window.lipstreamEvents.some("
            f"e => e.type === 'speech_ended' && e.utterance === {utterance})"
        )
        (started,) = await _events(page, "speech_started")
        assert (started["utterance"], started["session_id"]) == (utterance, session_id)
        # The voice is heard: the audio energy the browser measured (0 while the avatar was
        # silent) grew with the sentence.
        await page.wait_for_function(f"() => window.lipstreamStats.audioEnergy > {silent} + 0.01")
        await expect(page.locator("#event-log")).to_contain_text("speech_ended")

        # Leave: the viewer goes, the session stays.
        async with page.expect_response(lambda r: r.request.method == "DELETE") as left:
            await page.get_by_role("button", name="Leave").click()
        assert (await left.value).status == 200
        assert (await left.value).url.startswith(f"{_base(server)}/sessions/{session_id}/whep/")
        await expect(page.get_by_role("status")).to_have_text("Left the session.")
        await expect(page.get_by_role("button", name="Watch", exact=True)).to_be_enabled()
        assert (await _state(http, session_id))["viewers"] == 0
    assert (await http.delete(f"/sessions/{session_id}")).status == 200


async def test_the_demo_pages_link_watches_the_call_in_a_new_tab(
    server: TestServer, http: ClientSession, tmp_path: Path
) -> None:
    from playwright.async_api import expect

    async with browser_page(tmp_path, _base(server) + "/") as page:
        link = page.get_by_role("link", name="Watch this session")
        await expect(link).to_be_hidden()
        await page.get_by_label("Avatar", exact=True).select_option("demo")
        await page.get_by_role("button", name="Start without microphone").click()
        await page.wait_for_function("() => window.lipstreamStats.state === 'connected'")
        await expect(link).to_be_visible()
        assert server.app is not None
        (session,) = server.app[SESSIONS].sessions
        href = f"{_base(server)}/static/watch.html?session={session.session_id}"
        await expect(link).to_have_attribute("href", href)
        await expect(link).to_have_attribute("target", "_blank")

        async with page.context.expect_page() as opened:
            await link.click()
        viewer_page = await opened.value
        assert viewer_page.url == href
        await viewer_page.wait_for_function(f"() => ({VIDEO_FRAMES})() >= 25")
        assert (await _state(http, session.session_id))["viewers"] == 1

        # Hanging up the call ends the session: the viewer page says so.
        await page.get_by_role("button", name="Hang up").click()
        await expect(viewer_page.get_by_role("status")).to_have_text(
            "The session ended: hung up by API."
        )
        await expect(viewer_page.locator("#stat-state")).to_have_text("disconnected")
        await expect(link).to_be_hidden()


async def test_create_session_and_watch_check_their_arguments(
    server: TestServer, http: ClientSession, tmp_path: Path
) -> None:
    from playwright.async_api import expect

    base = _base(server)
    async with browser_page(tmp_path, f"{base}/static/watch.html") as page:
        # Without ?session= the viewer page has nothing to watch, and says so.
        await expect(page.get_by_role("status")).to_have_text(
            "No session to watch: open this page as watch.html?session=<id>."
        )
        await expect(page.get_by_role("button", name="Watch", exact=True)).to_be_disabled()
        exported = await page.evaluate(IMPORT_CLIENT)
        assert {"createSession", "endSession", "watch", "Viewer"} <= set(exported)

        created = await page.evaluate("(base) => window.lipstream.createSession(base)", base)
        session_id = created["session_id"]
        assert (created["avatar"], created["whep"]) == ("demo", f"/sessions/{session_id}/whep")
        assert created["delay"]["server_ms"] > 0
        refusals = {
            "unknown avatar": f"window.lipstream.createSession('{base}', {{avatar: 'nobody'}})",
            "no session": "window.lipstream.watch({})",
            "a session id that is no string": "window.lipstream.watch({sessionId: 7})",
            "no element": "window.lipstream.watch({sessionId: 'x', video: document.body})",
            "unknown session": f"window.lipstream.watch({{baseUrl: '{base}', sessionId: 'no'}})",
            "no session to end": f"window.lipstream.endSession('{base}')",
        }
        errors = {
            what: await page.evaluate(f"() => ({REJECTION})({call})")
            for what, call in refusals.items()
        }
        assert {what: (e["name"], e["status"], e["code"]) for what, e in errors.items()} == {
            "unknown avatar": ("LipstreamError", 404, "model_not_found"),
            "no session": ("TypeError", None, None),
            "a session id that is no string": ("TypeError", None, None),
            "no element": ("TypeError", None, None),
            "unknown session": ("LipstreamError", 404, "session_not_found"),
            "no session to end": ("TypeError", None, None),
        }
        assert "sessionId" in errors["no session"]["message"]
        assert (await _state(http, session_id))["viewers"] == 0  # the refusals left none

        # watch() sends its offer through withOpusDtx, as connect() does, as WHEP: the
        # SDP itself. The video element plays the viewer; Link headers become iceServers.
        await page.evaluate(ADD_LINK)
        async with page.expect_request(_whep_request) as offered:
            watched = await page.evaluate(WATCH, {"baseUrl": base, "sessionId": session_id})
        offer = await offered.value
        assert offer.headers["content-type"] == "application/sdp"
        assert offer.post_data is not None
        assert "usedtx=1" in offer.post_data
        assert offer.post_data.startswith("v=0")
        viewer_id = watched["viewerId"]
        assert watched["location"] == f"/sessions/{session_id}/whep/{viewer_id}"
        assert watched["iceServers"] == [
            {
                "urls": "turn:turn.example.net?transport=udp",
                "username": "1700000000:viewer",
                "credential": "a+b/c==",
            }
        ]
        assert (watched["attached"], watched["state"], watched["label"]) == (
            True,
            "connected",
            "lipstream",
        )
        assert (await _state(http, session_id))["viewers"] == 1

        # hangUp() on a viewer leaves: the session goes on.
        async with page.expect_response(lambda r: r.request.method == "DELETE") as left:
            await page.evaluate("() => window.viewer.hangUp()")
        assert (await left.value).url == f"{base}/sessions/{session_id}/whep/{viewer_id}"
        assert await page.evaluate("() => [window.ended, window.viewer.closed]") == ["left", True]
        await until(_viewers_are(server, session_id, 0), "the viewer to be gone")

        # opusDtx: false sends the browser's own offer; no data channel when not asked for.
        async with page.expect_request(_whep_request) as offered:
            watched = await page.evaluate(
                WATCH,
                {"baseUrl": base, "sessionId": session_id, "opusDtx": False, "dataChannel": False},
            )
        assert "usedtx" not in ((await offered.value).post_data or "")
        assert watched["label"] is None
        await page.evaluate("() => window.viewer.close()")
        await until(_viewers_are(server, session_id, 0), "the viewer to be gone")

        await page.evaluate(
            "([base, id]) => window.lipstream.endSession(base, id)", [base, session_id]
        )
        assert (await http.get(f"/sessions/{session_id}")).status == 404
        gone = await page.evaluate(
            f"() => ({REJECTION})(window.lipstream.endSession('{base}', '{session_id}'))"
        )
        assert (gone["status"], gone["code"]) == (404, "session_not_found")
