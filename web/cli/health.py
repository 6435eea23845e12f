"""``lipstream health``: is the server on this machine answering? For container and
service health checks (the Dockerfile's HEALTHCHECK, docs/operations/deployment.md).

It asks ``GET /health`` of the server the settings describe (``server.host`` and
``server.port``; a wildcard host such as ``0.0.0.0`` is asked on loopback) or of
``--url``, with the standard library only: a health check must not need the event loop
or anything the server itself might be short of.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.request

from config.settings import ServerSettings


def health_url(server: ServerSettings) -> str:
    """The ``/health`` URL of the server ``server`` describes, as seen from this machine."""
    host = server.host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and address.is_unspecified:
        host = "127.0.0.1" if address.version == 4 else "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{server.port}/health"


def check_health(url: str, timeout_s: float) -> tuple[bool, str]:
    """(healthy, what to say): healthy when ``url`` answers 200 within ``timeout_s``."""
    if not url.startswith(("http://", "https://")):
        return False, f"{url!r} is not an http:// or https:// URL"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read(4096).decode("utf-8", "replace")
            status = response.status
    except urllib.error.HTTPError as exc:
        return False, f"{url} answered {exc.code}: {exc.read(300).decode('utf-8', 'replace')}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{url} did not answer: {reason}"
    if status != 200:
        return False, f"{url} answered {status}"
    try:
        summary = json.loads(body).get("status", "ok")
    except (ValueError, AttributeError):
        summary = "ok"
    return True, f"{url}: {summary}"
