"""Sleep mode: the device step's weights and KV cache off the devices and back, the compiled programs kept.

Sleeping is deleting arrays and waking is re-creating them on the same shardings, so it works on every platform
(vLLM's needs CUDA's virtual-memory allocator). Level 1 copies the weights to host memory first (jax's
`pinned_host` memory kind where the devices have one, numpy otherwise); level 2 drops them (the caller updates
them: worker/weight_update.py works on a sleeping model's placeholders too). The KV cache is dropped at both
levels and comes back zeroed. Arrays an update placed without a copy still belong to the caller too: sleep
drops the engine's reference to them but leaves them alive. While asleep every dropped array's place holds a
ShapeDtypeStruct with its shape, dtype and sharding, which is all waking (or an update) needs
(docs/architecture/05-worker.md, "Sleep and weight updates").

Besides the target's weights and KV cache the engine may hold a speculator (the draft model or the EAGLE-3 head:
`DraftStep` / `EagleStep`) and LoRA slots. The speculator's weights go to host memory at both levels (updates
cannot feed them, so level 2 keeps them too) and come back with the target's; its KV cache is dropped like the
target's. A head reading the target's embedding follows the target's array after waking. The LoRA slots are
dropped at both levels: the adapters written into them are still in host memory (the slots record them), so
waking re-writes each resident adapter into its slot with the compiled write program; the caller reloads nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vllm_jax.worker.device_step import DeviceStep
from vllm_jax.worker.weight_update import param_variables

WEIGHTS, KV_CACHE = "weights", "kv_cache"
TAGS = (WEIGHTS, KV_CACHE)


class DeviceSleep:
    """Puts one DeviceStep's params and KV cache to sleep and wakes them (see the module docstring)."""

    def __init__(self, device: DeviceStep, speculator: Any = None):
        """`speculator`: the draft model's `DraftStep` or the EAGLE-3 head's `EagleStep`, or None."""
        self.device, self.speculator = device, speculator
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
        spec = self.speculator
        embed = getattr(spec, "embed_tokens", None)  # an EAGLE-3 head's: the target's array, or a copy of it
        embed_is_a_copy = embed is not None and embed is not nnx.to_pure_dict(self.device.params)["embed_tokens"]
        for variable in param_variables(self.device.params):
            variable.set_value(jax.tree.map(lambda a: self._drop(a, level == 1, host_kind), variable.get_value()))
        self.device.kv_cache = jax.tree.map(lambda a: self._drop(a, False, None), self.device.kv_cache)
        if self.device.lora is not None:  # re-written from their adapters on waking
            self.device.lora.arrays = jax.tree.map(lambda a: self._drop(a, False, None), self.device.lora.arrays)
        if spec is not None:  # its weights to host memory at either level: updates cannot feed them
            spec_kind = _host_memory_kind(self.device.devices[0])
            for variable in param_variables(spec.params):
                variable.set_value(jax.tree.map(lambda a: self._drop(a, True, spec_kind), variable.get_value()))
            spec.kv_cache = self._drop(spec.kv_cache, False, None)
            if embed is not None:
                spec.embed_tokens = jax.ShapeDtypeStruct(embed.shape, embed.dtype, sharding=embed.sharding)
                if embed_is_a_copy:
                    embed.delete()
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
            self._wake_lora()
            if self.speculator is not None:
                for variable in param_variables(self.speculator.params):
                    variable.set_value(jax.tree.map(self._restore, variable.get_value(),
                                                    is_leaf=lambda a: isinstance(a, jax.ShapeDtypeStruct)))
                self.follow_target_embedding()
            self._host.clear()
        if KV_CACHE in tags and KV_CACHE in self.asleep:
            self.device.kv_cache = jax.tree.map(self._restore, self.device.kv_cache,
                                                is_leaf=lambda a: isinstance(a, jax.ShapeDtypeStruct))
            if self.speculator is not None:
                self.speculator.kv_cache = self._restore(self.speculator.kv_cache)
        self.asleep -= set(tags)
        if not self.asleep:
            self.level = None

    def follow_target_embedding(self) -> None:
        """An EAGLE-3 head without its own embedding reads the target's: point it at the target's array now (after
        waking, or after an update replaced it)."""
        from vllm_jax.spec_decode.device.speculators import target_embedding

        if getattr(self.speculator, "embed_tokens", None) is not None:
            self.speculator.embed_tokens = target_embedding(self.device.params)

    def _wake_lora(self) -> None:
        """Zeroed slots, then each adapter resident before sleeping written back into its slot."""
        lora = self.device.lora
        if lora is None or not isinstance(next(iter(lora.arrays.values()))[0], jax.ShapeDtypeStruct):
            return
        lora.arrays = jax.tree.map(self._restore, lora.arrays, is_leaf=lambda a: isinstance(a, jax.ShapeDtypeStruct))
        for slot, adapter in list(lora.resident.items()):
            lora.write(slot, adapter)

    def device_bytes(self) -> int:
        """What the step's weights and KV cache (and the speculator's, and the LoRA slots) hold in device memory
        now (0 for what is asleep)."""
        spec = self.speculator
        extra = () if spec is None else (spec.params, spec.kv_cache, getattr(spec, "embed_tokens", None))
        lora = () if self.device.lora is None else self.device.lora.arrays
        return device_bytes((self.device.params, self.device.kv_cache, lora, extra))

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
    total, seen = 0, set()
    for array in jax.tree.leaves(jax.live_arrays() if arrays is None else arrays):
        if id(array) in seen:  # an EAGLE-3 head's embedding is the target's array
            continue
        seen.add(id(array))
        if (not isinstance(array, jax.Array) or array.is_deleted()
                or array.sharding.memory_kind in ("pinned_host", "unpinned_host")):
            continue
        total += sum(shard.data.nbytes for shard in array.addressable_shards)
    return total
