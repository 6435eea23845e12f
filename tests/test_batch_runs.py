"""How a loaded model runs batches: buckets, padding, chunking, reused bound buffers.

The IOBinding path runs here on CPU exactly as on CUDA (inputs bound from the worker
thread's preallocated buffers, faces written into one array per batch); only the page
locking of those buffers and the copies to the device need a GPU (tests/test_gpu.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.onnx_io import open_session
from inference_core.adapter.serving_graph import ServingGraph
from inference_core.avatars.locator import AvatarLocator
from inference_core.avatars.package import AvatarPackage
from inference_core.serving.batch_buffers import (
    SLABS,
    ThreadBuffers,
    bucket_for,
    bucket_sizes,
    page_lock,
    thread_buffers,
)
from inference_core.serving.devices import Device
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.loaded_model import LoadedModel
from tests.onnx_builders import tiny_lipsync
from tests.packages import make_package


class CountingSession:
    """A real session that records the faces shape and the duration of every bound run."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self._session = session
        self.runs: list[int] = []
        self.run_ns: list[int] = []

    def run_with_iobinding(self, io: Any) -> None:
        started = time.perf_counter_ns()
        self._session.run_with_iobinding(io)
        self.run_ns.append(time.perf_counter_ns() - started)
        self.runs.append(io.get_outputs()[0].shape()[0])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def _factory(sessions: list[CountingSession]) -> Callable[[ServingGraph, Device], Any]:
    def factory(graph: ServingGraph, device: Device) -> Any:
        session = CountingSession(open_session(graph.serialized()))
        sessions.append(session)
        return session

    return factory


@pytest.fixture
def package(tmp_path: Path) -> AvatarPackage:
    make_package(tmp_path / "avatars" / "m")
    return AvatarLocator(tmp_path / "avatars").load("m")


def _requests(
    loop: asyncio.AbstractEventLoop, n: int, *, raw: bool = False, seed: int = 0
) -> list[FrameRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        visual = (
            rng.random((6, 320, 320), dtype=np.float32)
            if raw
            else rng.integers(0, 256, (328, 328, 3), dtype=np.uint8)[4:324, 4:324]  # a view
        )
        audio = rng.normal(0, 1, (32, 16, 16)).astype(np.float32)
        out.append(FrameRequest("m", visual, audio, 0.0, loop.create_future(), loop, raw=raw))
    return out


def _open(package: AvatarPackage, sessions: list[CountingSession], **kwargs: Any) -> LoadedModel:
    kwargs.setdefault("max_batch_size", 8)
    return LoadedModel.open(package, Device(0), _factory(sessions), **kwargs)


def test_buckets() -> None:
    assert bucket_sizes(8) == (1, 2, 4, 8)
    assert bucket_sizes(6) == (1, 2, 4, 6)
    assert bucket_sizes(32) == (1, 2, 4, 8, 16, 32)
    assert bucket_sizes(1) == (1,)
    assert [bucket_for(n, (1, 2, 4, 6)) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    with pytest.raises(ValueError, match="do not fit"):
        bucket_for(7, (1, 2, 4, 6))


def test_every_bucket_is_warmed_at_load(package: AvatarPackage) -> None:
    sessions: list[CountingSession] = []
    model = _open(package, sessions, pad_batches=True)
    assert model.buckets == (1, 2, 4, 8)
    assert sessions[0].runs == [1, 2, 4, 8, 1]  # every bucket, then one raw frame


def test_padding_never_leaks_into_results(package: AvatarPackage) -> None:
    loop = asyncio.new_event_loop()
    try:
        sessions: list[CountingSession] = []
        model = _open(package, sessions, pad_batches=True)
        exact = _open(package, [], pad_batches=False)
        sessions[0].runs.clear()
        model.run_batch(_requests(loop, 4, seed=1))  # leaves frames in the padding rows
        three = _requests(loop, 3, seed=2)
        padded = model.run_batch(three)
        assert sessions[0].runs == [4, 4]  # 3 frames ran as bucket 4
        assert len(padded) == 3
        for got, want in zip(padded, exact.run_batch(three), strict=True):
            np.testing.assert_array_equal(got, want)
        # Faces and raw frames in one padded run: 2 + 1 → bucket 4, the pad between them.
        mixed = _requests(loop, 2, seed=3) + _requests(loop, 1, raw=True, seed=4)
        outputs = model.run_batch(mixed)
        assert sessions[0].runs[-1] == 4
        assert [o.dtype for o in outputs] == [np.uint8, np.uint8, np.float32]
        for got, want in zip(outputs, exact.run_batch(mixed), strict=True):
            np.testing.assert_array_equal(got, want)
    finally:
        loop.close()


def test_results_follow_request_order_whatever_the_kinds(package: AvatarPackage) -> None:
    loop = asyncio.new_event_loop()
    try:
        model = _open(package, [])
        faces = _requests(loop, 3, seed=5)
        raws = _requests(loop, 2, raw=True, seed=6)
        mixed = model.run_batch([raws[0], faces[0], faces[1], raws[1], faces[2]])
        adapter = model.adapter
        assert adapter is not None
        want_faces = adapter.run(
            np.stack([r.visual for r in faces]), np.stack([r.audio for r in faces])
        )
        want_raw = adapter.run_raw(
            np.stack([r.visual for r in raws]), np.stack([r.audio for r in raws])
        )
        for got, want in zip([mixed[1], mixed[2], mixed[4]], want_faces, strict=True):
            np.testing.assert_array_equal(got, want)
        for got, want in zip([mixed[0], mixed[3]], want_raw, strict=True):
            np.testing.assert_array_equal(got, want)
    finally:
        loop.close()


def test_a_batch_larger_than_the_model_takes_is_chunked(tmp_path: Path) -> None:
    make_package(tmp_path / "avatars" / "s")
    tiny_lipsync(tmp_path / "avatars" / "s" / "lipsync.onnx", batch=1)  # a static export
    package = AvatarLocator(tmp_path / "avatars").load("s")
    loop = asyncio.new_event_loop()
    try:
        sessions: list[CountingSession] = []
        model = _open(package, sessions, pad_batches=True)  # configured 8, the model takes 1
        assert (model.max_batch_size, model.buckets) == (1, (1,))
        sessions[0].runs.clear()
        requests = _requests(loop, 3, seed=7) + _requests(loop, 1, raw=True, seed=8)
        outputs = model.run_batch(requests)
        assert sessions[0].runs == [1, 1, 1, 1]
        reference = LipSyncAdapter.from_path(package.lipsync_path, package.manifest.adapter)
        want = reference.run(
            np.stack([r.visual for r in requests[:3]]), np.stack([r.audio for r in requests[:3]])
        )
        for got, expected in zip(outputs[:3], want, strict=True):
            np.testing.assert_array_equal(got, expected)
        assert model.stats().frames == 4
    finally:
        loop.close()


def test_each_run_times_its_parts_once_for_every_frame_it_carried(
    package: AvatarPackage,
) -> None:
    """Triton's ``compute_input``/``compute_infer``/``compute_output``: a run's parts, each
    counted once per frame of the run. The model run's share holds the session's own runs
    (times their frames) and the three lie inside the ``run_batch`` calls (times theirs)."""
    loop = asyncio.new_event_loop()
    try:
        sessions: list[CountingSession] = []
        model = _open(package, sessions, max_batch_size=4, pad_batches=False)
        warm = model.stats()  # the warm-up's runs are not the model's use
        assert (warm.frames, warm.input_ns, warm.infer_ns, warm.output_ns) == (0, 0, 0, 0)
        session = sessions[0]
        inside = outside = 0
        # A live batch (one run), a mixed one (one run) and one chunked into runs of 4 and 2.
        for requests in (
            _requests(loop, 4, seed=1),
            _requests(loop, 2, seed=2) + _requests(loop, 1, raw=True, seed=3),
            _requests(loop, 6, seed=4),
        ):
            runs = len(session.runs)
            started = time.perf_counter_ns()
            model.run_batch(requests)
            outside += (time.perf_counter_ns() - started) * len(requests)
            inside += sum(
                ns * rows
                for ns, rows in zip(session.run_ns[runs:], session.runs[runs:], strict=True)
            )
        assert session.runs[-4:] == [4, 3, 4, 2]
        stats = model.stats()
        assert stats.frames == 13
        assert stats.input_ns > 0
        assert stats.output_ns > 0
        assert inside <= stats.infer_ns
        assert stats.input_ns + stats.infer_ns + stats.output_ns <= outside
    finally:
        loop.close()


def test_buffers_and_bindings_are_reused_not_reallocated(package: AvatarPackage) -> None:
    loop = asyncio.new_event_loop()
    try:
        model = _open(package, [], pad_batches=True)
        buffers = thread_buffers().get(320, (32, 16, 16), 8, pinned=False)
        for n in (1, 2, 3, 5, 8, 7, 4, 6, 1, 8):
            model.run_batch(_requests(loop, n, seed=n))
        assert thread_buffers().get(320, (32, 16, 16), 8, pinned=False) is buffers
        # One binding per (buffer set, bucket) of this thread, whatever the batch sizes: no
        # face was kept, so every run wrote into the same output slab.
        keys = model.runs.binding_keys()
        assert {rows for serial, rows, _ in keys if serial == buffers.serial} == {1, 2, 4, 8}
        assert len({slab for serial, _, slab in keys if serial == buffers.serial}) == 1

        # Another thread has its own buffers (and bindings), so workers never share.
        def elsewhere() -> None:
            model.run_batch(_requests(loop, 2, seed=11))

        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
        assert len({serial for serial, _, _ in model.runs.binding_keys()}) == 2
    finally:
        loop.close()


def test_buffers_grow_for_a_larger_model_and_page_lock_only_with_cuda() -> None:
    buffers = ThreadBuffers()
    small = buffers.get(96, (1, 80, 16), 4, pinned=True)
    assert small.crops.shape == (4, 96, 96, 3)
    assert small.audio.shape == (4, 1, 80, 16)
    assert buffers.get(96, (1, 80, 16), 2, pinned=True) is small
    larger = buffers.get(96, (1, 80, 16), 16, pinned=True)
    assert larger.capacity == 16
    assert larger.serial != small.serial
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert not larger.pinned  # no CUDA runtime: pageable memory, no error
        assert page_lock(np.empty(16, np.uint8)) is False


def test_faces_still_held_are_never_overwritten_by_later_batches(package: AvatarPackage) -> None:
    """Faces are views of a reused output slab: a slab is written again only once no
    face of it is held, so a session pasting a face never sees another batch's."""
    loop = asyncio.new_event_loop()
    try:
        model = _open(package, [], pad_batches=False)
        held = model.run_batch(_requests(loop, 3, seed=1))
        copies = [face.copy() for face in held]
        later = [model.run_batch(_requests(loop, 3, seed=seed)) for seed in range(2, 2 + SLABS)]
        for face, copy in zip(held, copies, strict=True):
            np.testing.assert_array_equal(face, copy)
        assert len({face.base is not None and id(face.base) for face in held}) == 1
        slabs = {id(batch[0].base) for batch in later} | {id(held[0].base)}
        assert len(slabs) == 1 + SLABS  # each held batch kept its own slab
        # The one-off slab (every kept one was held) left no binding behind.
        assert len({slab for _, _, slab in model.runs.binding_keys()}) == SLABS
        del held, later, face, copies
        again = model.run_batch(_requests(loop, 3, seed=9))  # slabs are free again: reused
        pool = thread_buffers()._slabs[(320, model.buckets[-1], False)]
        assert len(pool) == SLABS
        assert any(again[0].base is slab.faces for slab in pool)
    finally:
        loop.close()
