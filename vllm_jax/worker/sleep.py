"""Sleep mode: the device step's weights and KV cache off the devices and back, the compiled programs kept.

Sleeping is deleting arrays and waking is re-creating them on the same shardings, so it works on every platform
(vLLM's needs CUDA's virtual-memory allocator). Level 1 copies the weights to host memory first (jax's
`pinned_host` memory kind where the devices have one, numpy otherwise); level 2 drops them (the caller updates
them: worker/weight_update.py works on a sleeping model's placeholders too). The KV cache is dropped at both
levels and comes back zeroed. Arrays an update placed without a copy still belong to the caller too: sleep
drops the engine's reference to them but leaves them alive. While asleep every dropped array's place holds a
ShapeDtypeStruct with its shape, dtype and sharding, which is all waking (or an update) needs
(docs/architecture/05-worker.md, "Sleep and weight updates").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.worker.device_step import DeviceStep
from vllm_jax.worker.weight_update import param_variables

WEIGHTS, KV_CACHE = "weights", "kv_cache"
TAGS = (WEIGHTS, KV_CACHE)


class DeviceSleep:
    """Puts one DeviceStep's params and KV cache to sleep and wakes them (see the module docstring)."""

    def __init__(self, device: DeviceStep):
        self.device = device
        self.level: int | None = None
        self.asleep: set[str] = set()  # the tags still asleep
        self._host: dict[int, Any] = {}  # id(placeholder) -> the level-1 host copy of the array it stands for
        # ids of arrays an update placed without a copy (worker/weight_update.py): their owner still holds them,
        # so sleep drops its reference but does not delete them
        self.borrowed: set[int] = set()

    def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 (weights to host memory) or 2 (weights dropped); got {level!r}")
        if self.asleep:
            raise RuntimeError("the engine is already asleep; wake_up() first")
        host_kind = _host_memory_kind(self.device.devices[0]) if level == 1 else None
        for variable in param_variables(self.device.params):
            variable.set_value(jax.tree.map(lambda a: self._drop(a, level == 1, host_kind), variable.get_value()))
        self.device.kv_cache = self._drop(self.device.kv_cache, False, None)
        self.level, self.asleep = level, set(TAGS)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Re-create the tagged arrays (all by default) on their shardings: the weights from their host copies
        (level 1) or zeroed (level 2: an update has replaced what it fed), the KV cache zeroed."""
        tags = list(TAGS if tags is None else tags)
        bad = [t for t in tags if t not in TAGS]
        if bad:
            raise ValueError(f"wake_up tags must be among {list(TAGS)}; got {bad}")
        if WEIGHTS in tags and WEIGHTS in self.asleep:
            for variable in param_variables(self.device.params):
                variable.set_value(jax.tree.map(self._restore, variable.get_value(),
                                                is_leaf=lambda a: isinstance(a, jax.ShapeDtypeStruct)))
            self._host.clear()
        if KV_CACHE in tags and KV_CACHE in self.asleep:
            self.device.kv_cache = self._restore(self.device.kv_cache)
        self.asleep -= set(tags)
        if not self.asleep:
            self.level = None

    def device_bytes(self) -> int:
        """What the step's weights and KV cache hold in device memory now (0 for what is asleep)."""
        return device_bytes((self.device.params, self.device.kv_cache))

    def _drop(self, array: jax.Array, keep: bool, host_kind: str | None) -> jax.ShapeDtypeStruct:
        placeholder = jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=array.sharding)
        if keep:
            self._host[id(placeholder)] = (jax.device_put(array, array.sharding.with_memory_kind(host_kind))
                                           if host_kind else np.asarray(array))
            jax.block_until_ready(self._host[id(placeholder)])
        if id(array) not in self.borrowed:
            array.delete()
        return placeholder

    def _restore(self, value: Any) -> jax.Array:
        if not isinstance(value, jax.ShapeDtypeStruct):  # an update while asleep placed it already
            return value
        host = self._host.get(id(value))
        if host is None:
            return jnp.zeros(value.shape, value.dtype, device=value.sharding)
        return jax.device_put(host, value.sharding)


def _host_memory_kind(device: jax.Device) -> str | None:
    kinds = {memory.kind for memory in device.addressable_memories()}
    return "pinned_host" if "pinned_host" in kinds else None


def device_bytes(arrays: Any = None) -> int:
    """The device-memory bytes (host memory kinds left out) of the jax arrays in the pytree `arrays`, over all
    devices; None: of every live array (jax.live_arrays)."""
    total = 0
    for array in jax.tree.leaves(jax.live_arrays() if arrays is None else arrays):
        if (not isinstance(array, jax.Array) or array.is_deleted()
                or array.sharding.memory_kind in ("pinned_host", "unpinned_host")):
            continue
        total += sum(shard.data.nbytes for shard in array.addressable_shards)
    return total
