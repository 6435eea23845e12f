"""The avatar a call shows, as one value the call can swap (``docs/design/switching.md`` §18).

Everything of a call that depends on its avatar is here: the held model, the background
frames, the crop/paste steps, the shared idle loop, the audio encoder and the clip plan
(which avatar frame each output frame shows, ``compositor/clips.py``). A call starts
with one; a switch (:meth:`~streaming.live.pipeline.LivePipeline.switch_avatar`) hands
the render path a second from a frame on, and the first is released once the dissolve
is over. Two avatars can follow each other in one call only where the call's timeline
stays valid: the same fps (the session clock and every frame's slot) and the same
audio features (the feature stream, the model's audio window and the call's delay).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from compositor.background_cache import AvatarFrames
from compositor.clips import SPEAKING, ClipPlan
from compositor.frame_similarity import FrameThumbnails
from config.settings import Settings
from inference_core.avatars.package import AvatarPackage
from inference_core.features.encoder import AudioEncoder
from inference_core.serving.handle import ModelHandle
from streaming.frame_pipeline import FramePipeline
from streaming.idle_loops import IdleLoopCache, LoopKey
from streaming.live.idle_sharing import IdleSharing, rung_keys
from streaming.live.workers import Offload
from streaming.webrtc.video_encoder import EncoderFactory


@dataclass(frozen=True)
class CallAvatar:
    """One avatar as a call uses it (module doc)."""

    model: ModelHandle
    frames: AvatarFrames
    pipeline: FramePipeline
    audio_encoder: AudioEncoder | None
    sharing: IdleSharing | None
    plan: ClipPlan

    @property
    def package(self) -> AvatarPackage:
        return self.pipeline.package

    @property
    def avatar_id(self) -> str:
        return self.pipeline.package.avatar_id

    @property
    def frame_size(self) -> tuple[int, int]:
        return self.pipeline.package.manifest.frame_size


@dataclass(frozen=True)
class AvatarSwitched:
    """A switch scheduled: the avatars, and the first frame (and its media time) of the
    new one."""

    previous: str
    avatar: str
    frame: int
    media_ms: float


async def release_after(outgoing: CallAvatar, waiting: list[asyncio.Task[None]]) -> None:
    """Let the outgoing avatar's model go once its last frames in flight ended."""
    try:
        await asyncio.gather(*waiting, return_exceptions=True)
    finally:
        outgoing.model.close()


def call_avatar(
    model: ModelHandle,
    frames: AvatarFrames,
    audio_encoder: AudioEncoder | None,
    *,
    settings: Settings,
    encoders: EncoderFactory,
    idle_loops: IdleLoopCache | None,
) -> CallAvatar:
    """``model``'s avatar ready for a call: its crop/paste steps and, when the server
    shares idle loops (``video.shared_idle``), its choice of shared loop (§16)."""
    package = model.package
    plan = ClipPlan(package.frame_count, package.clips)
    return CallAvatar(
        model,
        frames,
        FramePipeline(package, frames),
        audio_encoder,
        _idle_sharing(settings, encoders, idle_loops, package, frames, plan),
        plan,
    )


def incompatibility(current: AvatarPackage, new: AvatarPackage) -> str | None:
    """Why a call showing ``current`` cannot switch to ``new``, or None when it can."""
    was, will = current.manifest, new.manifest
    if was.fps != will.fps:
        return (
            f"avatar {new.avatar_id!r} runs at {will.fps} fps and this call at {was.fps} fps; "
            "a call keeps its frame rate: start a new call for it"
        )
    if was.adapter.audio_feature != will.adapter.audio_feature:
        return (
            f"avatar {new.avatar_id!r} takes {will.adapter.audio_feature!r} audio features and "
            f"this call's avatar {was.adapter.audio_feature!r}; a call keeps its audio "
            "features and delay: start a new call for it"
        )
    if was.adapter.audio_shape != will.adapter.audio_shape:
        return (
            f"avatar {new.avatar_id!r} takes an audio window of shape "
            f"{list(will.adapter.audio_shape)} and this call's avatar "
            f"{list(was.adapter.audio_shape)}; start a new call for it"
        )
    return None


def _idle_sharing(
    settings: Settings,
    encoders: EncoderFactory,
    idle_loops: IdleLoopCache | None,
    package: AvatarPackage,
    frames: AvatarFrames,
    plan: ClipPlan,
) -> IdleSharing | None:
    video = settings.video
    if not video.shared_idle or idle_loops is None or idle_loops.max_bytes == 0:
        return None
    fps = package.manifest.fps
    width, height = package.manifest.frame_size
    config = encoders.config(width, height, fps)
    base = LoopKey(
        avatar_id=package.avatar_id,
        source=frames.source,
        config=config,
        bitrate=config.bitrate,
        keyframe_every=max(1, round(video.idle_keyframe_interval_s * fps)),
        preset=video.idle_preset,
        frame_count=package.frame_count,
        constant_quality=video.idle_constant_quality,
    )
    keys = rung_keys(base, video.idle_bitrate_rungs)
    steady = round(video.idle_steady_keyframe_interval_s * fps)
    return IdleSharing(idle_loops, keys, frames.get, fps, plan.loop_position, steady)


async def preload(avatar: CallAvatar, executor: Offload) -> None:
    """Decode the avatar's background frames into the cache while ICE connects, then
    its thumbnails: the clip plan enters a clip at the frame nearest the one shown."""
    frames = avatar.frames
    for index in range(len(frames)):
        await executor.run(frames.get, index)
    if len(avatar.plan.clips) > 1 or SPEAKING in avatar.plan.clips:
        thumbs = await executor.run(FrameThumbnails.build, len(frames), frames.get)
        avatar.plan.distance = thumbs.distance
