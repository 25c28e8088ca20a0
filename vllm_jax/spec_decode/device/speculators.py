"""The model a `draft_model` or `eagle3` speculative_config adds to the runner: loaded and checked against the
target, its KV cache's layout (sharing the target's block ids), and the device holder of its programs
(docs/architecture/08-sampling.md, "Speculative decoding")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from vllm_jax.attention import AttentionBackend
from vllm_jax.config import EngineConfig
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model_loader.source import ModelSource
from vllm_jax.sharding import check_tensor_parallel_layout, eagle3_param_partition_spec
from vllm_jax.spec_decode.device.draft_step import DraftStep, draft_cache_layout
from vllm_jax.spec_decode.device.eagle3_loader import load_eagle3_head, read_eagle3_spec
from vllm_jax.spec_decode.device.eagle3_spec import Eagle3Spec
from vllm_jax.spec_decode.device.eagle_step import EagleStep, eagle_cache_layout
from vllm_jax.spec_decode.device.speculator_step import DraftCacheLayout
from vllm_jax.worker.programs import LoadOrCompile

# (registry entry, spec, source or None for random weights) -> (graphdef, sharded params): the runner's loader
LoadModel = Callable[[object, DecoderSpec, ModelSource | None], tuple[nnx.GraphDef, nnx.State]]


@dataclass
class SpeculatorModel:
    graphdef: nnx.GraphDef
    params: nnx.State
    spec: DecoderSpec | Eagle3Spec  # Eagle3Spec: an EAGLE-3 head; DecoderSpec: a draft model
    own_embedding: bool = True  # an EAGLE-3 head without one reads the target's

    def cache_layout(self, config: EngineConfig, mesh: Mesh) -> DraftCacheLayout:
        if isinstance(self.spec, Eagle3Spec):
            return eagle_cache_layout(config, self.spec, mesh)
        return draft_cache_layout(config, self.spec, mesh)

    def programs(self, config: EngineConfig, kv_cache: jax.Array | jax.ShapeDtypeStruct, target_params: nnx.State,
                 load_or_compile: LoadOrCompile, on_trace: Callable[[], None]) -> DraftStep | EagleStep:
        """The holder of its programs over `kv_cache` (abstract for an ahead-of-time compile)."""
        k = config.speculative_config.num_speculative_tokens
        if isinstance(self.spec, Eagle3Spec):
            embed = None if self.own_embedding else target_embedding(target_params)
            return EagleStep(self.graphdef, self.params, kv_cache, k, embed, load_or_compile, on_trace=on_trace)
        return DraftStep(self.graphdef, self.params, kv_cache, k, load_or_compile, on_trace=on_trace)


def target_embedding(target_params: nnx.State) -> jax.Array | jax.ShapeDtypeStruct:
    """The target's [V, H] embedding for an EAGLE-3 head without its own, in the target's dtype. Online int8 / fp8
    quantizes it per row (`embed_tokens_scale` [V, 1]): the head gets its dequantized copy (a float table only in
    this case; the head gathers from a plain array). Abstract params (ahead-of-time compiles) give the abstract
    copy."""
    state = nnx.to_pure_dict(target_params)
    embed, scale = state["embed_tokens"], state.get("embed_tokens_scale")
    if scale is None:
        return embed
    if scale.shape != (embed.shape[0], 1):
        raise ValueError("an EAGLE-3 head without its own embedding needs the target's float or row-quantized "
                         f"embedding; the target keeps it in blocks (scales {tuple(scale.shape)})")
    dtype = state["final_norm"].dtype
    if isinstance(embed, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(embed.shape, dtype, sharding=embed.sharding)
    return (embed.astype(jnp.float32) * scale).astype(dtype)


def load_draft_model(config: EngineConfig, attention_backend: AttentionBackend, load_model: LoadModel,
                     random_weights: bool) -> SpeculatorModel:
    """method draft_model: the draft, sharded like the target (its vocabulary was checked with the config)."""
    dc = config.draft_model_config
    try:
        entry, spec = resolve_architecture(dc.hf_config, config.model_config.max_model_len)
    except ValueError as exc:
        raise ValueError(f"speculative_config.model {dc.model!r}: {exc}") from None
    check_tensor_parallel_layout(spec, config.parallel_config.tensor_parallel_size, attention_backend)
    graphdef, params = load_model(entry, spec, None if random_weights else dc.source)
    return SpeculatorModel(graphdef, params, spec)


def load_eagle3(config: EngineConfig, target: DecoderSpec, mesh: Mesh, attention_backend: AttentionBackend, *,
                abstract: bool = False) -> SpeculatorModel:
    """method eagle3: the head on the target's mesh, split like the target's layers (`eagle3_param_partition_spec`),
    its vocabulary and input width checked against the target's (`abstract`: the same checks, its params
    ShapeDtypeStructs)."""
    sc, tp = config.speculative_config, config.parallel_config.tensor_parallel_size
    try:
        layer = read_eagle3_spec(sc.model).layer
        check_tensor_parallel_layout(layer, tp, attention_backend)
        head = load_eagle3_head(sc.model, config.model_config.dtype, attention_backend=attention_backend.name,
                                platform=config.platform, mesh=mesh if tp > 1 else None,
                                sharding_for=lambda path, shape: NamedSharding(
                                    mesh, eagle3_param_partition_spec(path, shape, layer, tp)),
                                abstract=abstract)
    except ValueError as exc:
        raise ValueError(f"speculative_config.model {sc.model!r}: {exc}") from None
    for what, got, want in (("vocab_size", head.spec.vocab_size, target.vocab_size),
                            ("target_hidden_size", head.spec.target_hidden_size, target.hidden_size)):
        if got != want:
            raise ValueError(f"speculative_config.model {sc.model!r} is an EAGLE-3 head for another model: its "
                             f"{what} is {got}, the target's is {want}")
    own_embedding = hasattr(head, "embed_tokens")
    graphdef, params = nnx.split(head)
    return SpeculatorModel(graphdef, params, head.spec, own_embedding)
