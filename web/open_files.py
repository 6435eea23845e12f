"""The process's open-file limit: raised to the hard limit at start-up.

Every WebRTC call holds sockets (its UDP ports, the signalling connection) and every
HTTP client a descriptor; distributions start processes with a soft limit of 1,024,
which a few hundred calls or a burst of slow clients exhaust, while the hard limit
is usually far higher. The server raises the soft limit to the hard one and logs both.
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger(__name__)


def raise_open_file_limit() -> tuple[int, int]:
    """Set the soft ``RLIMIT_NOFILE`` to the hard one; return ``(soft, hard)`` after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # a hard limit the kernel refuses (macOS)
            logger.warning(
                "open-file limit stays at %d: raising it to %d failed: %s", soft, hard, exc
            )
            return soft, hard
    logger.info("open-file limit: %d (was %d)", hard, soft)
    return hard, hard
