"""The frozen configuration every part of the engine reads: `EngineConfig` and its parts, the values
`EngineArgs.create_config` resolved (config/engine_args.py). Values only: nothing here finds a model or checks a
flag."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_jax.config.structured_outputs import StructuredOutputsConfig
from vllm_jax.lora.config import LoRAConfig
from vllm_jax.multimodal.config import MultiModalConfig
from vllm_jax.pooling.config import PoolerConfig
from vllm_jax.spec_decode.config import SpeculativeConfig

if TYPE_CHECKING:
    from vllm_jax.attention import AttentionBackend
    from vllm_jax.model_loader.source import ModelSource


@dataclass(frozen=True)
class ModelConfig:
    """What was resolved about the model: where it lives, its HF config and the dtypes to run it in."""

    model: str  # what the user asked for (path, hub id, or the default model's path)
    source: ModelSource  # where it was found: kind (hf / gguf / orbax) and local path
    hf_config: Any  # transformers.PretrainedConfig
    dtype: str  # resolved: float32 / bfloat16 / float16
    kv_cache_dtype: str  # resolved: a jnp dtype name (float32 / bfloat16 / float16 / float8_e4m3fn)
    max_model_len: int
    served_model_name: str
    tokenizer: str | None
    seed: int
    max_logprobs: int
    # the layers' linear weights' scheme (int8 / fp8), or None: --quantization's (quantized at load) or a
    # pre-quantized checkpoint's (read as stored: model_loader/prequantized.py); gguf: a GGUF's blocks kept
    quantization: str | None = None
    # grouped scales' input rows (a block-fp8 checkpoint's block width: model/quantization.py), or None
    quantization_group_size: int | None = None
    # int8 / fp8 quantized at load from a float checkpoint (not a pre-quantized one's): the embedding and an untied
    # LM head are quantized too (model/quantization.py's OnlineQuantization)
    quantization_online: bool = False


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    enable_prefix_caching: bool
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    num_gpu_blocks_override: int | None


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    policy: str
    min_token_bucket: int
    min_seq_bucket: int
    bucket_growth: int = 2
    # vLLM's --num-scheduler-steps: decode tokens per dispatch when every scheduled request decodes
    # (multi_step/chunk.py; docs/architecture/05-worker.md, "Several decode steps per dispatch"). 1: one per step.
    num_scheduler_steps: int = 1


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int
    data_parallel_size: int
    enable_expert_parallel: bool


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    attention_backend: str
    compilation_cache_dir: str | None  # resolved: the directory in use, or None (no persistent cache)
    platform: str  # what the programs are built for (cpu / gpu / tpu): jax's backend unless create_config was told
    scan_layers: bool
    structured_outputs_config: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    # `--reasoning-parser` (vllm_jax.reasoning): the server splits the reasoning from the answer with it, and a
    # request's structured outputs are meant to start after its end token.
    reasoning_parser: str | None = None
    # Schedule step n + 1 while step n runs on the device (docs/architecture/02-engine.md, "Async scheduling").
    async_scheduling: bool = False
    # vLLM's speculative_config (spec_decode/config.py); None: no speculation.
    speculative_config: SpeculativeConfig | None = None
    # method draft_model: the draft's own resolved config (the target's dtypes and context length).
    draft_model_config: ModelConfig | None = None
    # --enable-lora and its flags (lora/config.py); None: LoRA off, and the programs carry nothing of it.
    lora_config: LoRAConfig | None = None
    # vLLM's --enable-sleep-mode: LLM.sleep / wake_up may move the weights and KV cache off the devices
    # (worker/sleep.py).
    enable_sleep_mode: bool = False
    # The pooling runner's pooler (pooling/config.py); None: the generate runner.
    pooler_config: PoolerConfig | None = None
    # vLLM's multimodal input flags (multimodal/config.py): images per prompt, and where they may come from.
    multimodal_config: MultiModalConfig = field(default_factory=MultiModalConfig)

    @property
    def resolved_attention_backend(self) -> AttentionBackend:
        """`--attention-backend` resolved against `platform`: the xla, pallas_tpu or pallas_gpu backend object
        (what the model runs, and the cache layout and block table it needs; a Pallas backend on a cpu platform
        runs in interpret mode). Objects compare by value, so every read gives the same backend."""
        from vllm_jax.attention import attention_backend_for

        return attention_backend_for(self.attention_backend, self.platform)
