"""Importing the avatars people already have: SyncTalk_2D, LiveTalking, Ultralight.

:mod:`.sources` reads another project's folder into an :class:`AvatarSource` (frames,
one crop rect per frame, models, adapter); :mod:`.writer` writes it as a lipstream
package, all or nothing, and validates it. :mod:`.rects` holds the crop rules and
:mod:`.safe_pickle` reads coordinate pickles without running them; :mod:`.clips` reads the
clips (``--clip NAME=START:STOP``) an import names.
"""

from inference_core.importers.clips import ClipOption, clip_ranges, parse_clip
from inference_core.importers.errors import ImportFailedError
from inference_core.importers.rects import fit_rects, read_landmarks, synctalk_rect
from inference_core.importers.safe_pickle import load_numbers
from inference_core.importers.sources import livetalking, synctalk2d, ultralight
from inference_core.importers.writer import AvatarSource, ImportReport, write_package

__all__ = [
    "AvatarSource",
    "ClipOption",
    "ImportFailedError",
    "ImportReport",
    "clip_ranges",
    "fit_rects",
    "livetalking",
    "load_numbers",
    "parse_clip",
    "read_landmarks",
    "synctalk2d",
    "synctalk_rect",
    "ultralight",
    "write_package",
]
