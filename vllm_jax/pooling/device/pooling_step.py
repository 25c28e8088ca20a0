"""The pooling runner's device side: a forward that returns the normed hidden states, and the pooler program.

`PoolingPrograms`, attached to the engine's DeviceStep, turns its forward into one that ends at the final norm
([T, H], every token, never fetched) and adds the pooler (pooling/device/pooler.py) as its own program per token bucket,
with the classifier's score head (`score.weight`) and the per-slot accumulator of chunked MEAN / CLS pooling.
`PoolingCompilation` is warm-up's plan for it: each token bucket's forward and pooler, and no sampler
(docs/architecture/14-pooling.md, "The pooling program"); compile-check compiles the same plan, as it builds the
engine through the same code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.layers import rms_norm
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.pallas_kernels.precision import model_matmuls
from vllm_jax.pooling.config import PoolerConfig
from vllm_jax.pooling.device.pooler import PoolInputs, pool
from vllm_jax.worker.compilation import CompilationManager
from vllm_jax.worker.device_step import DeviceStep
from vllm_jax.worker.programs import CompiledPrograms, input_signature
from vllm_jax.worker.warmup import WarmupPlan

if TYPE_CHECKING:
    from vllm_jax.config import EngineConfig
    from vllm_jax.model.spec import DecoderSpec

SCORE_HEAD = "score.weight"  # a *ForSequenceClassification checkpoint's head: [num_labels, hidden]


class PoolingPrograms(CompiledPrograms):
    """The pooling programs of a DeviceStep (`step.pooling`): attached to whichever step the engine's factory
    made (the runner's, or compile-check's recording one), so both compile the same programs (through the step's
    load_or_compile). Attaching turns the step's forward into one that ends at the final norm: normed hidden
    states [T, H] for every token, which stay on the device."""

    def __init__(self, step: DeviceStep, pooler: PoolerConfig, head: jax.Array | jax.ShapeDtypeStruct | None,
                 hidden_size: int, num_slots: int):
        super().__init__(step.replicated.mesh, on_trace=step.on_trace, compile_with=step.load_or_compile)
        self.step, self.pooler, self.head = step, pooler, head
        shape = (num_slots + 1, hidden_size)  # one row per input-batch slot, and the padding rows' spare
        replicated = self.replicated
        if isinstance(step.kv_cache, jax.ShapeDtypeStruct):
            self.acc = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=replicated)
        else:
            self.acc = jax.device_put(np.zeros(shape, np.float32), replicated)
        step.use_forward(functools.partial(_hidden_forward, step))
        self._pool = jax.jit(self._pool_impl, donate_argnums=(0,), out_shardings=replicated)

    def _pool_impl(self, acc, hidden, inputs: PoolInputs, head):
        self.on_trace()
        p = self.pooler
        return pool(acc, hidden, inputs, head, pooling_type=p.pooling_type, normalize=p.normalize,
                    activation=p.activation)

    def launch(self, inputs: StepInputs, pool_inputs: PoolInputs) -> jax.Array:
        """Dispatch the forward and the pooler; -> the rows' pooled vectors [S, D] (their copy to the host
        started). Updates the KV cache and the accumulator in place (donated)."""
        step = self.step
        hidden = step.forward(inputs)
        pool_inputs = self.to_device(pool_inputs)
        program = self.program(("pool", input_signature((hidden, pool_inputs))), self._pool)
        self.acc, pooled = program(self.acc, hidden, pool_inputs, self.head)
        if pooled.is_fully_addressable:
            pooled.copy_to_host_async()
        return pooled

    def precompile(self, inputs: StepInputs, num_seqs: int) -> None:
        """Warm-up: the pooler of a token bucket (after its forward, whose hidden states it reads)."""
        hidden = self.step.forward_outputs(inputs)[1]
        pool_inputs = empty_pool_inputs(inputs.input_ids.shape[0], num_seqs)
        args = (self.acc, hidden, self.to_device(pool_inputs), self.head)
        self.make_ready(("pool", input_signature((hidden, pool_inputs))), self._pool, args, args, (0, 0))


def _hidden_forward(step: DeviceStep, params, kv_cache, inputs: StepInputs, lora=None):
    """The pooling forward: (kv_cache, the final-normed hidden states [T, H]); no LM head."""
    step.on_trace()
    model = nnx.merge(step.graphdef, params)
    with model_matmuls(params):  # pallas_kernels/precision.py
        kv_cache, hidden, _ = model.hidden_states(kv_cache, inputs)
        return kv_cache, rms_norm(hidden, model.final_norm[...], model.spec.rms_norm_eps)


class PoolingCompilation(CompilationManager):
    def plan(self, logits_for: dict | None = None) -> WarmupPlan:
        """Per token bucket: its forward (to the normed hidden states), then its pooler. No sampler, so no
        `logits_for`."""
        plan: WarmupPlan = []
        for num_tokens, num_seqs in self.shapes.buckets:
            plan.append((f"forward T={num_tokens} S={num_seqs}",
                         functools.partial(self._forward, num_tokens, num_seqs, {})))
            plan.append((f"pooler T={num_tokens} S={num_seqs}",
                         functools.partial(self._pooler, num_tokens, num_seqs)))
        return plan

    def _pooler(self, num_tokens: int, num_seqs: int) -> None:
        self.device.pooling.precompile(self.empty_inputs(num_tokens, num_seqs), num_seqs)


def empty_pool_inputs(num_tokens: int, num_seqs: int) -> PoolInputs:
    zeros = np.zeros(num_seqs, np.int32)
    return PoolInputs(token_rows=np.full(num_tokens, num_seqs, np.int32), first_index=zeros, last_index=zeros,
                      slots=zeros, starts=np.zeros(num_seqs, np.bool_), num_tokens=np.ones(num_seqs, np.float32),
                      dims=zeros)


def pooling_device_step(config: EngineConfig, spec: DecoderSpec, mesh: Mesh, abstract: bool,
                        base: Callable[..., DeviceStep]) -> Callable[..., DeviceStep]:
    """The DeviceStep factory of a pooling engine: `base`'s step with the pooling programs attached (checks that
    the architecture can pool, loads the head; `abstract`: compile-check's, every array abstract)."""
    entry, _ = resolve_architecture(config.model_config.hf_config)
    if entry.model_class is not DecoderLM:
        raise ValueError(f"runner 'pooling' supports the dense Llama-family decoders (Llama, Mistral, Qwen2, "
                         f"Qwen3); got {spec.architecture}")
    head = load_score_head(config, spec.hidden_size, mesh, abstract)

    def make(*args: Any, **kwargs: Any) -> DeviceStep:
        step = base(*args, **kwargs)
        step.pooling = PoolingPrograms(step, config.pooler_config, head, spec.hidden_size,
                                       kwargs.get("num_slots", 0))
        return step

    return make


def load_score_head(config: EngineConfig, hidden_size: int, mesh: Mesh,
                    abstract: bool) -> jax.Array | jax.ShapeDtypeStruct | None:
    """The classifier's score head [num_labels, hidden] float32, replicated (None without one); abstract in
    compile-check."""
    pooler, mc = config.pooler_config, config.model_config
    if not pooler.num_labels:
        return None
    shape = (pooler.num_labels, hidden_size)
    sharding = NamedSharding(mesh, PartitionSpec())
    if abstract:
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)
    if mc.source.kind != "hf":
        raise ValueError(f"runner 'pooling' reads a classifier's {SCORE_HEAD} from a safetensors checkpoint; "
                         f"{mc.source.path} is a {mc.source.kind} model")
    from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint

    checkpoint = SafetensorsCheckpoint(Path(mc.source.path))
    tokens = getattr(mc.hf_config, "classifier_from_token", None)
    head = _head_from_tokens(checkpoint, mc, tokens) if tokens else _read_score_head(checkpoint, mc)
    if head.shape != shape:
        raise ValueError(f"{mc.source.path}: the score head has shape {head.shape}, the config implies {shape} "
                         "(num_labels, hidden_size)")
    return jax.device_put(head, sharding)


def _read_score_head(checkpoint: Any, mc: Any) -> np.ndarray:
    if SCORE_HEAD not in checkpoint.names():
        raise ValueError(f"{mc.source.path}: a {mc.hf_config.architectures[0].replace('ForCausalLM', '')}"
                         f"ForSequenceClassification checkpoint needs {SCORE_HEAD}; it has none")
    return checkpoint.read(SCORE_HEAD, ()).astype(np.float32)


def _head_from_tokens(checkpoint: Any, mc: Any, tokens: list[str]) -> np.ndarray:
    """vLLM's conversion of a causal LM into a classifier (`hf_overrides` classifier_from_token): the LM head's
    rows of those tokens are the labels; Qwen3-Reranker's (`is_original_qwen3_reranker`, tokens ["no", "yes"])
    is one label, the "yes" row less the "no" row, so its sigmoid is the softmax probability of "yes"."""
    from vllm_jax.model_loader.tokenizer import load_tokenizer

    vocab = load_tokenizer(mc).get_vocab()
    missing = [t for t in tokens if t not in vocab]
    if missing:
        raise ValueError(f"hf_overrides.classifier_from_token: {missing} are not tokens of this tokenizer")
    names = checkpoint.names()
    table = next((n for n in ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight") if n in names),
                 None)
    if table is None:
        raise ValueError(f"{mc.source.path}: classifier_from_token needs the LM head (lm_head.weight) or a tied "
                         "embedding; the checkpoint has neither")
    rows = np.stack([checkpoint.read(table, (slice(vocab[t], vocab[t] + 1),))[0] for t in tokens]).astype(np.float32)
    if getattr(mc.hf_config, "is_original_qwen3_reranker", False):
        if len(tokens) != 2:
            raise ValueError("hf_overrides.is_original_qwen3_reranker needs classifier_from_token [no, yes]")
        return rows[1:] - rows[:1]
    return rows
