"""Where a model goes and which models make room for it: pure functions, no I/O.

The registry describes devices as :class:`DeviceLoad` and evictable models as
:class:`VictimInfo`; these functions decide, so the policies are tested without loading
a single model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from inference_core.exceptions import CapacityError

Strategy = Literal["round-robin", "least-loaded"]
EvictionPolicy = Literal["lru", "lfu"]


@dataclass(frozen=True)
class DeviceLoad:
    """How busy a device is: models on it (loaded or loading), their memory, its queue."""

    index: int
    models: int
    used_bytes: int
    max_bytes: int | None
    max_models: int
    queue_depth: int = 0

    @property
    def full(self) -> bool:
        """A new model would need an eviction here."""
        return self.models >= self.max_models or (
            self.max_bytes is not None and self.used_bytes >= self.max_bytes
        )

    @property
    def free_bytes(self) -> int:
        # Without a byte limit, less used memory is the best available notion of "more free".
        return (self.max_bytes if self.max_bytes is not None else 0) - self.used_bytes


@dataclass(frozen=True)
class VictimInfo:
    """A loaded model as eviction sees it; ``last_used`` is on the monotonic clock."""

    model_id: str
    last_used: float
    usage_count: int
    memory_bytes: int
    refcount: int = 0


def choose_device(
    strategy: Strategy,
    devices_state: Sequence[DeviceLoad],
    *,
    preferred: int | None,
    rr_counter: int,
) -> int:
    """Return the index of the device a model should be loaded on.

    ``preferred`` wins when such a device exists. Round-robin takes device
    ``rr_counter % N``. Least-loaded prefers devices with room, then most free memory,
    then the shortest queue, then the fewest models (then the lowest index).
    """
    if not devices_state:
        raise ValueError("no devices to place a model on")
    if preferred is not None and any(d.index == preferred for d in devices_state):
        return preferred
    if strategy == "round-robin":
        return devices_state[rr_counter % len(devices_state)].index
    return least_loaded_order(devices_state)[0]


def least_loaded_order(devices_state: Sequence[DeviceLoad]) -> list[int]:
    """Device indexes, least loaded first (the order least-loaded placement uses)."""
    ranked = sorted(
        devices_state,
        key=lambda d: (d.full, -d.free_bytes, d.queue_depth, d.models, d.index),
    )
    return [d.index for d in ranked]


def choose_victims(
    policy: EvictionPolicy,
    candidates: Sequence[VictimInfo],
    need_models: int,
    need_bytes: int,
    *,
    device_name: str = "the device",
) -> list[str]:
    """Ids to evict, in order, until ``need_models`` models and ``need_bytes`` bytes are freed.

    Models with ``refcount > 0`` are in use and never chosen. LRU evicts the least
    recently used first; LFU the least used (fewest acquisitions), then the least recently
    used. Raises :class:`CapacityError` when evicting every idle model is not enough.
    """
    if need_models <= 0 and need_bytes <= 0:
        return []
    idle = [c for c in candidates if c.refcount == 0]
    if policy == "lru":
        idle.sort(key=lambda c: (c.last_used, c.model_id))
    else:
        idle.sort(key=lambda c: (c.usage_count, c.last_used, c.model_id))
    chosen: list[str] = []
    freed_models = freed_bytes = 0
    for candidate in idle:
        if freed_models >= need_models and freed_bytes >= need_bytes:
            break
        chosen.append(candidate.model_id)
        freed_models += 1
        freed_bytes += candidate.memory_bytes
    if freed_models >= need_models and freed_bytes >= need_bytes:
        return chosen
    in_use = len(candidates) - len(idle)
    short = []
    if freed_models < need_models:
        short.append(f"{need_models} model slot(s)")
    if freed_bytes < need_bytes:
        short.append(f"{need_bytes} bytes")
    raise CapacityError(
        f"no room on {device_name}: need to free {' and '.join(short)} but {in_use} model(s) "
        f"there are in use and the {len(idle)} idle one(s) are not enough; end sessions, "
        "raise devices.max_models_per_device or devices.max_memory_per_device, "
        "or add devices"
    )
