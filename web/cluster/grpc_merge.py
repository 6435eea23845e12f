"""The workers' answers to the gRPC calls that cover a whole cluster, merged into one.

The front's gRPC proxy (``web/cluster/grpc_front.py``) asks every answering worker and
merges what came back with the generated messages, the same rules as the front's REST
side (``web/cluster/inference_protocol.py``, ``web/cluster/aggregate.py``):

- ``ModelStatistics``: per model, every count and duration summed (a model loaded on
  two workers ran on both), the latest ``last_inference``; sorted by name.
- ``RepositoryIndex``: each model once, in its best state anywhere (``READY`` wins over
  ``LOADING`` over ``UNAVAILABLE``); sorted by name.
- The seed's ``ListModels`` and ``GetModelStats``: each model once, in the order the
  workers list them: a loaded entry when there is one, its device named
  ``<worker>/<device>`` (as ``/admin/stats`` names devices), its figures summed.
- The seed's ``Health``: every worker's devices, named ``<worker>/<device>``, the totals
  and live sessions summed.

Totals: ``models_registered`` is the most any worker has (the workers share one avatar
root, so a sum would count each model once per worker); the others are summed, so
``models_loaded`` counts a model once per worker holding it, as ``/admin/stats`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from google.protobuf.message import Message

from web.inference.protos import grpc_service_pb2 as oip
from web.inference.protos import inference_service_pb2 as seed

_M = TypeVar("_M", bound=Message)
_RANK = {"READY": 0, "LOADING": 1, "UNAVAILABLE": 2}
_DURATIONS = tuple(f.name for f in oip.InferStatistics.DESCRIPTOR.fields)
_BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")
_MODEL_STATS_SUMMED = (
    "frames",
    "batches",
    "failed_frames",
    "inference_ms",
    "in_use",
    "requests",
    "failed_requests",
)
_TOTALS_SUMMED = (
    "models_loaded",
    "requests",
    "failed_requests",
    "frames",
    "batches",
    "model_memory_bytes",
)


def statistics(answers: Iterable[oip.ModelStatisticsResponse]) -> oip.ModelStatisticsResponse:
    """Per model, the workers' statistics summed (module doc)."""
    merged: dict[str, oip.ModelStatistics] = {}
    for answer in answers:
        for stats in answer.model_stats:
            seen = merged.get(stats.name)
            if seen is None:
                merged[stats.name] = _copy(stats)
            else:
                _add_statistics(seen, stats)
    return oip.ModelStatisticsResponse(model_stats=[merged[name] for name in sorted(merged)])


def _add_statistics(into: oip.ModelStatistics, more: oip.ModelStatistics) -> None:
    into.last_inference = max(into.last_inference, more.last_inference)
    into.inference_count += more.inference_count
    into.execution_count += more.execution_count
    for name in _DURATIONS:
        _add_duration(getattr(into.inference_stats, name), getattr(more.inference_stats, name))
    by_size = {b.batch_size: b for b in into.batch_stats}
    for batch in more.batch_stats:
        held = by_size.get(batch.batch_size)
        if held is None:
            into.batch_stats.append(batch)
            continue
        for name in _BATCH_DURATIONS:
            _add_duration(getattr(held, name), getattr(batch, name))
    into.memory_usage.extend(more.memory_usage)  # each device's own: nothing to add up


def _add_duration(into: oip.StatisticDuration, more: oip.StatisticDuration) -> None:
    into.count += more.count
    into.ns += more.ns


def repository_index(
    answers: Iterable[oip.RepositoryIndexResponse], *, ready: bool
) -> oip.RepositoryIndexResponse:
    """Each model once, in its best state on any worker; only the ready ones if ``ready``."""
    best: dict[str, oip.RepositoryIndexResponse.ModelIndex] = {}
    for answer in answers:
        for model in answer.models:
            seen = best.get(model.name)
            if seen is None or _RANK.get(model.state, 3) < _RANK.get(seen.state, 3):
                best[model.name] = model
    listed = [best[n] for n in sorted(best) if not ready or best[n].state == "READY"]
    return oip.RepositoryIndexResponse(models=listed)


def list_models(answers: Mapping[str, seed.ListModelsResponse]) -> seed.ListModelsResponse:
    """Each model once over the workers (module doc)."""
    entries: dict[str, list[tuple[str, seed.ModelInfo]]] = {}
    for worker, answer in answers.items():
        for model in answer.models:
            entries.setdefault(model.model_id, []).append((worker, model))
    return seed.ListModelsResponse(models=[_one_model(found) for found in entries.values()])


def _one_model(found: list[tuple[str, seed.ModelInfo]]) -> seed.ModelInfo:
    """One model's entries as one: a loaded entry when there is one, its device named by
    its worker, the memory and the figures summed."""
    worker, shown = next(((w, m) for w, m in found if m.loaded), found[0])
    model = _copy(shown)
    if model.device:
        model.device = f"{worker}/{model.device}"
    model.memory_bytes = sum(m.memory_bytes for _, m in found)
    model.stats.CopyFrom(_summed_stats([m.stats for _, m in found]))
    return model


def model_stats(answers: Mapping[str, seed.GetModelStatsResponse]) -> seed.GetModelStatsResponse:
    """Each model's figures summed over the workers; the totals over them (module doc)."""
    entries: dict[str, list[seed.ModelStats]] = {}
    for answer in answers.values():
        for stats in answer.models:
            entries.setdefault(stats.model_id, []).append(stats)
    return seed.GetModelStatsResponse(
        models=[_summed_stats(found) for found in entries.values()],
        totals=totals(a.totals for a in answers.values()),
    )


def _summed_stats(found: list[seed.ModelStats]) -> seed.ModelStats:
    stats = _copy(found[0])
    for more in found[1:]:
        for name in _MODEL_STATS_SUMMED:
            setattr(stats, name, getattr(stats, name) + getattr(more, name))
        stats.last_inference_ms = max(stats.last_inference_ms, more.last_inference_ms)
    stats.mean_ms_per_frame = stats.inference_ms / stats.frames if stats.frames else 0.0
    return stats


def totals(found: Iterable[seed.Totals]) -> seed.Totals:
    """The workers' totals as the cluster's (module doc)."""
    merged = seed.Totals()
    for more in found:
        merged.models_registered = max(merged.models_registered, more.models_registered)
        for name in _TOTALS_SUMMED:
            setattr(merged, name, getattr(merged, name) + getattr(more, name))
    return merged


def health(
    answers: Mapping[str, seed.HealthResponse], *, healthy: bool, status: str, version: str
) -> seed.HealthResponse:
    """The workers' devices and figures under the front's own verdict and version."""
    devices = []
    for worker, answer in answers.items():
        for device in answer.devices:
            named = _copy(device)
            named.name = f"{worker}/{device.name}"
            devices.append(named)
    return seed.HealthResponse(
        healthy=healthy,
        status=status,
        version=version,
        devices=devices,
        totals=totals(a.totals for a in answers.values()),
        live_sessions=sum(a.live_sessions for a in answers.values()),
    )


def _copy(message: _M) -> _M:
    copied = type(message)()
    copied.CopyFrom(message)
    return copied
