"""Idle clips: the manifest's ranges, the package accessor, the call's clip plan, and
the shared idle loop of each clip."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from compositor.clips import Clip, ClipNotFoundError, ClipPlan, bounce_index
from compositor.frame_similarity import FrameThumbnails
from compositor.sequencer import FrameSequencer
from config.settings import VideoSettings
from inference_core.avatars.exceptions import AvatarInvalidError
from inference_core.avatars.manifest import AvatarManifest, format_validation_error
from inference_core.avatars.package import AvatarPackage
from streaming.idle_loops.loop import LoopKey, encode_loop, loop_length
from streaming.webrtc.encoder_config import EncoderConfig
from tests.packages import make_package

LOUD, QUIET = -20.0, -70.0
BASE = {"format": "lipstream-avatar", "version": 1, "frame_size": [64, 64]}


def _manifest(count: int, clips: object) -> AvatarManifest:
    return AvatarManifest.model_validate({**BASE, "frames": {"count": count}, "clips": clips})


def _errors(count: int, clips: object) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        _manifest(count, clips)
    return format_validation_error(caught.value)


# --- the manifest ---------------------------------------------------------------------


def test_manifest_reads_clips_as_ranges() -> None:
    manifest = _manifest(200, {"idle": [0, 60], "thinking": [120, 180], "speaking": [0, 100]})
    assert manifest.clips == {"idle": (0, 60), "thinking": (120, 180), "speaking": (0, 100)}
    assert _manifest(200, {}).clips == {}
    assert AvatarManifest.model_validate({**BASE, "frames": {"count": 5}}).clips == {}


@pytest.mark.parametrize(
    ("clips", "expected"),
    [
        ({"thinking": [120, 300]}, "clips.thinking: [120, 300] must be a [start, stop) range"),
        ({"idle": [10, 10]}, "clips.idle: [10, 10] must be a [start, stop) range"),
        ({"idle": [-1, 10]}, "clips.idle: [-1, 10] must be a [start, stop) range"),
        ({"wave": [5, 6]}, "clips.wave: [5, 6] holds 1 frame, a clip needs at least 2"),
        ({"Wave": [0, 6]}, "clips.Wave: the name must be 1-32 characters"),
        ({"_wave": [0, 6]}, "clips._wave: the name must be"),
        ({"w" * 33: [0, 6]}, "the name must be"),
        ({"wave": [0, 6, 9]}, "clips.wave: Tuple should have at most 2 items"),
        ({"wave": "0:6"}, "clips.wave: Input should be a valid tuple"),
    ],
)
def test_bad_clips_are_refused_naming_the_key(clips: object, expected: str) -> None:
    errors = _errors(200, clips)
    assert len(errors) == 1
    assert expected in errors[0]


def test_every_bad_clip_is_listed() -> None:
    errors = _errors(100, {"idle": [0, 60], "a": [90, 120], "b": [3, 4]})
    assert [e.split(":")[0] for e in errors] == ["clips.a", "clips.b"]


def test_a_one_frame_avatar_may_have_a_one_frame_clip() -> None:
    assert _manifest(1, {"idle": [0, 1]}).clips == {"idle": (0, 1)}


def test_package_clips_always_has_idle(tmp_path: Path) -> None:
    plain = AvatarPackage.load(make_package(tmp_path / "plain", count=6))
    assert plain.clips == {"idle": (0, 6)}
    directory = make_package(tmp_path / "clipped", count=6)
    data = json.loads((directory / "avatar.json").read_text())
    data["clips"] = {"thinking": [2, 6], "speaking": [0, 4]}
    (directory / "avatar.json").write_text(json.dumps(data))
    package = AvatarPackage.load(directory)
    assert package.clips == {"idle": (0, 6), "thinking": (2, 6), "speaking": (0, 4)}
    data["clips"] = {"thinking": [2, 9]}
    (directory / "avatar.json").write_text(json.dumps(data))
    with pytest.raises(AvatarInvalidError) as caught:
        AvatarPackage.load(directory)
    assert caught.value.problems == [
        "avatar.json: clips.thinking: [2, 9] must be a [start, stop) range of frames with "
        "0 <= start < stop <= 6 (frames.count)"
    ]


# --- the plan -------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 10, 125])
def test_the_default_plan_is_the_bounce(count: int) -> None:
    plan = ClipPlan(count)
    rng = random.Random(count)
    for n in range(1000):
        assert plan.advance(n, rng.random() < 0.3) == bounce_index(n, count)
        assert plan.at(n) == bounce_index(n, count)
        clip, position = plan.loop_position(n)
        assert (clip.range, position) == ((0, count), n)
    assert len(plan.segments) == 1
    assert plan.at(10**6) == bounce_index(10**6, count)  # the last segment runs on


def test_declared_idle_is_where_a_call_starts_and_stays_while_silent() -> None:
    plan = ClipPlan(100, {"idle": (20, 30)})
    shown = [plan.advance(n, False) for n in range(60)]
    assert shown == [20 + bounce_index(n, 10) for n in range(60)]
    assert plan.current_idle == "idle"


def test_speech_plays_over_every_frame_unless_speaking_is_declared() -> None:
    plan = ClipPlan(100, {"idle": (0, 20)})
    assert plan.speaking.range == (0, 100)
    shown = [plan.advance(n, 10 <= n < 80) for n in range(120)]
    assert max(shown[10:80]) > 20  # speech left the idle clip
    assert all(0 <= f < 20 for f in shown[:10] + shown[80:])
    declared = ClipPlan(100, {"idle": (0, 20), "speaking": (40, 60)})
    shown = [declared.advance(n, 10 <= n < 80) for n in range(120)]
    assert all(40 <= f < 60 for f in shown[10:80])
    assert all(0 <= f < 20 for f in shown[80:])


def test_entering_a_clip_continues_from_the_frame_shown_with_the_same_direction() -> None:
    # Idle [0, 20) rising through 12 at n = 12; speech over [0, 100) holds frame 12, so
    # the first speaking frame is 13: one ordinary step.
    plan = ClipPlan(100, {"idle": (0, 20)})
    shown = [plan.advance(n, n >= 13) for n in range(40)]
    assert shown == list(range(40))
    # Falling: idle at n = 25 shows 13 (19 was the top); speech continues down: 12, 11, ...
    plan = ClipPlan(100, {"idle": (0, 20)})
    shown = [plan.advance(n, n >= 26) for n in range(30)]
    assert shown[24:] == [14, 13, 12, 11, 10, 9]


def test_entering_turns_at_the_clip_end() -> None:
    # Speech rising through 59 into the idle clip [40, 60): enter at 59, the top, turn.
    plan = ClipPlan(100, {"idle": (40, 60), "speaking": (0, 100)})
    plan.advance(0, True)  # the call starts speaking: the speaking range from frame 0
    shown = [plan.at(0)] + [plan.advance(n, n < 60) for n in range(1, 64)]
    assert shown[:60] == list(range(60))
    assert shown[60:] == [58, 57, 56, 55]


def test_without_a_distance_a_clip_is_entered_at_the_same_relative_position() -> None:
    plan = ClipPlan(100, {"idle": (0, 11), "far": (50, 61)})
    for n in range(5):  # 0, 1, 2, 3, 4 rising
        plan.advance(n, False)
    plan.choose("far")
    # 4 of [0, 11) is 40 % of the way: frame 54 of [50, 61) is shown, then on rising.
    assert [plan.advance(n, False) for n in range(5, 9)] == [54, 55, 56, 57]
    assert plan.current_idle == "far"


def test_a_distance_picks_the_nearest_frame_of_the_clip() -> None:
    # Frames 50..59 look like 0..9 in reverse; entered from 3 (rising) the nearest is 56,
    # and what looks like 4 (idle's next) comes after it going down the frame numbers.
    looks = {f: f for f in range(50)} | {50 + k: 9 - k for k in range(10)}
    plan = ClipPlan(60, {"idle": (0, 10), "mirror": (50, 60)})
    plan.distance = lambda a, b: abs(looks[a] - looks[b])
    for n in range(4):
        plan.advance(n, False)  # 0, 1, 2, 3
    plan.choose("mirror")
    shown = [plan.advance(n, False) for n in range(4, 8)]
    assert shown == [56, 55, 54, 53]
    assert [looks[f] for f in shown] == [3, 4, 5, 6]


def test_choose_refuses_an_unknown_clip_listing_the_clips() -> None:
    plan = ClipPlan(100, {"listening": (0, 20), "thinking": (20, 40)})
    with pytest.raises(ClipNotFoundError) as caught:
        plan.choose("waving")
    assert caught.value.clips == ("idle", "listening", "thinking")
    assert str(caught.value) == (
        "the avatar has no clip 'waving'; its clips: idle, listening, thinking"
    )
    assert plan.current_idle == "idle"


def test_choose_takes_effect_at_the_next_silent_frame() -> None:
    plan = ClipPlan(100, {"idle": (0, 20), "thinking": (60, 80), "speaking": (30, 50)})
    shown = [plan.advance(n, 5 <= n < 15) for n in range(10)]
    plan.choose("thinking")
    shown += [plan.advance(n, 5 <= n < 15) for n in range(10, 40)]
    assert all(30 <= f < 50 for f in shown[5:15])
    assert all(60 <= f < 80 for f in shown[15:])
    clip, position = plan.loop_position(30)
    assert clip == Clip("thinking", 60, 80)
    assert clip.frame(position) == plan.at(30)


def test_at_and_loop_position_agree_with_advance_for_past_frames() -> None:
    plan = ClipPlan(
        90, {"idle": (0, 30), "listening": (30, 60), "speaking": (60, 90)}, keep_segments=10_000
    )
    rng = random.Random(7)
    shown = []
    for n in range(2000):
        if rng.random() < 0.02:
            plan.choose(rng.choice(["idle", "listening"]))
        shown.append(plan.advance(n, rng.random() < 0.5 and n % 50 < 20))
    assert [plan.at(n) for n in range(2000)] == shown
    for n in range(0, 2000, 37):
        clip, position = plan.loop_position(n)
        assert position >= 0
        assert clip.frame(position) == shown[n]


def test_forget_before_drops_old_segments_and_refuses_their_frames() -> None:
    plan = ClipPlan(100, {"idle": (0, 20), "speaking": (50, 70)})
    for n in range(100):
        plan.advance(n, n // 10 % 2 == 1)
    assert len(plan.segments) == 10
    kept = plan.at(55)
    plan.forget_before(55)  # only the deciding thread drops them: at its next segment
    assert len(plan.segments) == 10
    plan.advance(100, False)
    assert [s.first for s in plan.segments] == [50, 60, 70, 80, 90, 100]
    assert plan.at(55) == kept
    with pytest.raises(ValueError, match="before the oldest kept segment"):
        plan.at(49)
    plan.forget_before(10**6)
    plan.advance(101, True)
    assert len(plan.segments) == 1


def test_segments_are_bounded_without_forget_before() -> None:
    plan = ClipPlan(100, {"idle": (0, 20), "speaking": (50, 70)}, keep_segments=8)
    for n in range(1000):
        plan.advance(n, n % 2 == 0)
    assert len(plan.segments) == 8


def test_advance_must_go_forward() -> None:
    plan = ClipPlan(10)
    plan.advance(0, False)
    with pytest.raises(ValueError, match="in order"):
        plan.advance(0, False)


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="past the avatar's 10 frames"):
        ClipPlan(10, {"idle": (0, 11)})
    with pytest.raises(ValueError, match="start < stop"):
        ClipPlan(10, {"idle": (5, 5)})


def test_a_one_frame_clip_holds_still() -> None:
    plan = ClipPlan(10, {"idle": (0, 10), "still": (7, 8)})
    plan.advance(0, False)
    plan.choose("still")
    assert [plan.advance(n, False) for n in range(1, 6)] == [7] * 5


# --- the sequencer --------------------------------------------------------------------


def test_the_sequencer_without_a_plan_is_the_bounce() -> None:
    levels = [LOUD if 20 <= n < 60 else QUIET for n in range(200)]
    seq = FrameSequencer(17)
    assert [seq.step(level).avatar_index for level in levels] == [
        bounce_index(n, 17) for n in range(200)
    ]


def test_the_sequencer_plays_inferred_frames_over_speaking_and_raw_over_idle() -> None:
    plan = ClipPlan(100, {"idle": (0, 20), "speaking": (40, 80)})
    seq = FrameSequencer(100, hangover_frames=2, blend_frames=3, plan=plan)
    steps = [seq.step(LOUD if 10 <= n < 30 else QUIET) for n in range(60)]
    assert steps[10].alpha > 0
    for step in steps:
        wanted = (40, 80) if step.alpha > 0 else (0, 20)
        assert wanted[0] <= step.avatar_index < wanted[1], step
        assert plan.at(step.output_index) == step.avatar_index
    seq.reset()  # barge-in: alpha 0 at once, the idle clip next
    assert 0 <= seq.step(QUIET).avatar_index < 20


def test_the_sequencer_refuses_a_plan_of_another_avatar() -> None:
    with pytest.raises(ValueError, match="for 10 frames, the sequencer for 12"):
        FrameSequencer(12, plan=ClipPlan(10))


def test_clip_changes_move_no_more_than_the_avatars_own_motion() -> None:
    # A synthetic avatar whose brightness swings smoothly, each clip holding a whole swing
    # (as clips of one recording hold the same resting face): entering and leaving clips
    # with thumbnails shows no step larger than one of its own frame steps.
    count = 60
    levels = (128 + 100 * np.sin(np.arange(count) * 2 * np.pi / 19)).astype(np.uint8)
    frames = [np.full((48, 32), level, dtype=np.uint8) for level in levels]
    thumbs = FrameThumbnails.build(count, frames.__getitem__)
    plan = ClipPlan(
        count,
        {"idle": (0, 20), "thinking": (30, 50), "speaking": (10, 40)},
        distance=thumbs.distance,
    )
    rng = random.Random(3)
    shown = []
    for n in range(3000):
        if rng.random() < 0.01:
            plan.choose(rng.choice(["idle", "thinking"]))
        shown.append(plan.advance(n, n % 97 < 30))
    worst = max(thumbs.distance(a, b) for a, b in itertools.pairwise(shown))
    assert worst <= thumbs.max_step() + 1e-6
    assert len(plan.segments) > 20


# --- shared idle loops per clip -------------------------------------------------------


def _loop_key(clip_start: int = 0, clip_stop: int | None = None) -> LoopKey:
    config = EncoderConfig.from_settings(VideoSettings(bitrate_kbps=300), 64, 48, 25)
    return LoopKey(
        "alice",
        "v1",
        config,
        config.bitrate,
        12,
        "veryfast",
        30,
        clip_start=clip_start,
        clip_stop=clip_stop,
    )


def test_a_loop_key_names_its_clip_and_all_frames_by_default() -> None:
    whole = _loop_key()
    assert (whole.clip_start, whole.clip_stop, whole.clip_length) == (0, 30, 30)
    assert whole == _loop_key(clip_start=0, clip_stop=30)  # one key, however it is named
    thinking = whole.for_clip(Clip("thinking", 10, 15))
    assert (thinking.clip_start, thinking.clip_stop) == (10, 15)
    assert thinking != whole
    assert thinking.length == loop_length(5, 12) == 16
    assert whole.length == loop_length(30, 12)
    with pytest.raises(ValueError, match="not inside the avatar's 30 frames"):
        _loop_key(clip_start=20, clip_stop=31)


def test_a_clip_loop_encodes_the_clip_bounced() -> None:
    key = _loop_key(clip_start=10, clip_stop=15)
    asked: list[int] = []

    def frame_at(i: int) -> np.ndarray:
        asked.append(i)
        return np.full((72, 64), 16 + 7 * i, dtype=np.uint8)

    loop = encode_loop(key, frame_at)
    assert loop.length == 16
    assert asked == [10 + bounce_index(p, 5) for p in range(16)]
    plan = ClipPlan(30, {"thinking": (10, 15)})
    plan.choose("thinking")
    plan.advance(0, False)
    clip, position = plan.loop_position(0)
    assert key == key.for_clip(clip)
    assert asked[position % loop.length] == plan.at(0)
    packet = loop.packet(40, 25, position=position + 40)  # the call's frame 40, its clip's p
    assert packet.pts == 40 * 3600
    assert packet.opaque == list(loop.payloads[(position + 40) % loop.length])
