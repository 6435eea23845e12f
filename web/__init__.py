"""The outside of lipstream: the ``lipstream`` command line (later the HTTP/WebRTC server)."""

from web.cli import main

__all__ = ["main"]
