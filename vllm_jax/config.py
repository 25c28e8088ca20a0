"""Engine configuration: `EngineArgs` (vLLM's flag names) validated once into a frozen `EngineConfig`.

Every part of the engine reads the frozen config; nothing reads globals or environment variables in the
hot path. `EngineArgs.create_config()` resolves the model (local HF directory, HF hub cache or GGUF file),
reads its architecture config and checks every value, raising `ValueError` naming the bad flag. It has no side
effects: joining a multi-host run is `initialize_distributed(args)`, which the entry points call first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_jax.lora.config import LoRAConfig
from vllm_jax.multimodal.config import MultiModalConfig
from vllm_jax.pooling.config import (
    PoolerConfig,
    apply_hf_overrides,
    check_pooling_runner,
    prefix_caching_allowed,
    resolve_pooling,
)
from vllm_jax.reasoning import get_reasoning_parser
from vllm_jax.spec_decode.config import SpeculativeConfig
from vllm_jax.utils import json_object_flag

if TYPE_CHECKING:
    from vllm_jax.attention import AttentionBackend
    from vllm_jax.model_loader.source import ModelSource

DTYPES = ("auto", "float32", "bfloat16", "float16")
# --kv-cache-dtype: the model dtypes, or vLLM's fp8 names for a float8_e4m3fn cache with per-tensor scales
# (pallas_kernels/kv_quant.py). fp8_e5m2 is refused: nothing here is tested with it.
KV_CACHE_DTYPES = (*DTYPES, "fp8", "fp8_e4m3")
_KV_CACHE_DTYPE_NAMES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn"}
# KV cache dtypes whose every-step write XLA:CPU widens to float32 over the whole cache (docs/quantization.md,
# "fp8 KV cache"): warned about on CPU, where float16 halves the cache without that cost.
_SLOW_CPU_KV_DTYPES = ("bfloat16", "float8_e4m3fn")
logger = logging.getLogger(__name__)
# int8 / fp8: online weight quantization at load (model/quantization.py), or a pre-quantized checkpoint's scheme;
# compressed-tensors: a pre-quantized checkpoint's own (model_loader/prequantized.py; so is fp8's block format);
# gguf: a GGUF's Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K blocks kept as they are (model/grouped_quant.py)
QUANTIZATIONS = ("int8", "fp8", "compressed-tensors", "gguf")
SCHEDULING_POLICIES = ("fcfs", "priority")
PLATFORMS = ("cpu", "tpu", "gpu")
_PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu"}  # lowering names of the gpu platform

# CPU is for development and CI: small defaults keep warm-up (one compile per bucket pair) short.
_CPU_DEFAULT_MAX_NUM_SEQS = 32
_CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
_ACCEL_DEFAULT_MAX_NUM_SEQS = 256
_ACCEL_DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
_CPU_MIN_BUCKET = 2
_CPU_BUCKET_GROWTH = 4
_ACCEL_MIN_TOKEN_BUCKET, _ACCEL_MIN_SEQ_BUCKET = 16, 8
# Async scheduling per platform when --async-scheduling is not given (docs/performance.md, "Host overhead per step").
ASYNC_SCHEDULING_DEFAULT = {"cpu": True, "tpu": True, "gpu": True}
# The layer loop per platform when --scan-layers / --no-scan-layers is not given. On GPU, XLA copies each layer's
# weights out of the stacked params before its dots (a dot cannot read a dynamic slice in place; measured on an H200:
# 8 of a Llama-3-8B batch-1 step's 18 ms were those copies), so the GPU runs the unrolled loop over per-layer arrays
# (7.5 ms) at ~3x the compile time per program (docs/decisions.md, "Departures from the first design"). CPU: the
# switched scan over per-layer arrays (model/layers.py: LayerSwitch); TPU: the scan (compiled once whatever the depth).
SCAN_LAYERS_DEFAULT = {"cpu": True, "tpu": True, "gpu": False}
# Speculative decoding's disable_by_batch_size when not given: on CPU verifying k more tokens per request costs
# compute it does not have spare beyond a few requests (docs/speculative-decoding.md, "Measurements"); TPU/GPU: vLLM's
# (none).
SPEC_DISABLE_BY_BATCH_SIZE_DEFAULT = {"cpu": 4, "tpu": None, "gpu": None}
_CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30  # 1 GiB: never a silent huge allocation on a laptop


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


NUM_SCHEDULER_STEPS = (1, 2, 4, 8, 16, 32)  # the values --num-scheduler-steps takes (one program per bucket each)


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int
    data_parallel_size: int
    enable_expert_parallel: bool


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """vLLM's `--structured-outputs-config`: server-wide defaults for every constrained request (a request's own
    options can only add to them). llguidance compiles every grammar; `backend` picks how a JSON schema is read:
    "auto" (vLLM's default) as vLLM's default backend, xgrammar, reads it (an object listing its properties gets no
    others), "guidance" as vLLM's guidance backend does (other properties allowed unless
    disable_additional_properties) (docs/architecture/08-sampling.md, "Structured outputs")."""

    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    @property
    def closes_objects(self) -> bool:
        """Whether object schemas that list properties allow no others."""
        return self.disable_additional_properties or self.backend == "auto"

    @classmethod
    def parse(cls, value: str | dict | None) -> StructuredOutputsConfig:
        """From the flag's JSON text or a dict; a ValueError naming the flag and the bad key."""
        if value is None:
            return cls()
        value = json_object_flag("structured_outputs_config", value, {f.name for f in dataclasses.fields(cls)})
        backend = value.get("backend", "auto")
        if backend not in ("auto", "guidance"):
            raise ValueError(f"structured_outputs_config.backend {backend!r} is not available: this engine compiles "
                             "grammars with llguidance ('auto' reads JSON schemas as vLLM's default backend does, "
                             "'guidance' as its guidance backend does)")
        for key in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(value.get(key, False), bool):
                raise ValueError(f"structured_outputs_config.{key} must be true or false; got {value[key]!r}")
        return cls(backend=backend, disable_any_whitespace=value.get("disable_any_whitespace", False),
                   disable_additional_properties=value.get("disable_additional_properties", False))


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


@dataclass
class EngineArgs:
    """vLLM's engine flags, with underscores. `LLM(model, **kwargs)` and the CLI take the same names."""

    model: str | None = None
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    # vLLM's --quantization: int8 or fp8, quantizing a float checkpoint's linear weights as they load (per output
    # channel; model/quantization.py). None: the weights stay in `dtype`.
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    max_logprobs: int = 20
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    attention_backend: str = "auto"
    # Compiled programs persist in a per-user directory by default (worker/compilation_cache.py), so a restart
    # loads them instead of compiling again; `compilation_cache_dir` moves it, `compilation_cache=False` turns it
    # off (resolve_cache_dir).
    compilation_cache_dir: str | None = None
    compilation_cache: bool = True
    distributed_coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    # Layers as one scan (compile time independent of depth; on CPU over per-layer arrays through switched
    # matmuls, see model/layers.py: LayerSwitch), or unrolled over per-layer arrays (~3-6x the compile time).
    # None: the platform's default (SCAN_LAYERS_DEFAULT: unrolled on GPU).
    scan_layers: bool | None = None
    # Smallest buckets (default: 2 on CPU, where every padding row costs time, 16 / 8 on accelerators). One-token
    # buckets are avoided: XLA:CPU turns a one-row KV write into a dynamic-update-slice and copies the cache.
    min_token_bucket: int | None = None
    min_seq_bucket: int | None = None
    # Ratio between consecutive buckets (default: 4 on CPU, where each compiled program costs ~1 s of warm-up,
    # 2 on accelerators).
    bucket_growth: int | None = None
    # JSON text (the CLI) or a dict: StructuredOutputsConfig's keys.
    structured_outputs_config: str | dict | None = None
    # Thinking models: deepseek_r1, qwen3 or openai_gptoss (vllm_jax.reasoning); None leaves the output as it is.
    reasoning_parser: str | None = None
    # vLLM's --async-scheduling: the host schedules and prepares step n + 1 while the device runs step n. None:
    # the platform's default (ASYNC_SCHEDULING_DEFAULT).
    async_scheduling: bool | None = None
    # JSON text (the CLI) or a dict: vLLM's speculative_config keys (spec_decode/config.py).
    speculative_config: str | dict | None = None
    # vLLM's multi-LoRA flags (docs/architecture/11-lora.md, "LoRA adapters"): adapters resident on the device at once,
    # the slots' rank, adapters kept loaded in host memory (default: max_loras), adapters known by name at start.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    lora_modules: str | list | None = None
    # vLLM's sleep mode (docs/architecture/05-worker.md, "Sleep and weight updates"): allows LLM.sleep / wake_up.
    enable_sleep_mode: bool = False
    # vLLM's pooling flags (pooling/config.py): the runner, the conversion, and the pooler's JSON keys.
    runner: str = "auto"
    convert: str = "auto"
    pooler_config: str | dict | None = None
    # vLLM's --hf-overrides: JSON text or a dict of config.json keys replaced before anything reads the config
    hf_overrides: str | dict | None = None
    # vLLM's multimodal input flags (docs/serving.md, "Images"): JSON text or a dict of items per prompt per
    # modality ('{"image": 4}'; default 999), the directory file:// URLs may read, the hosts http(s) URLs may name.
    limit_mm_per_prompt: str | dict | None = None
    allowed_local_media_path: str = ""
    allowed_media_domains: list[str] | None = None
    encoder_cache_size: int = 0  # image tokens the encoder cache keeps (0: max(max_num_batched_tokens, one image))
    # vLLM's --num-scheduler-steps: K decode tokens per dispatch when every scheduled request decodes and nothing on
    # the host decides between tokens (docs/architecture/05-worker.md, "Several decode steps per dispatch").
    num_scheduler_steps: int = 1

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    def create_config(self, platform: str | None = None) -> EngineConfig:
        """Validate every value and resolve the model; no side effects (a multi-host run calls
        `initialize_distributed` first).

        `platform`: what the programs are built for: None is jax's backend; "tpu" / "gpu" ("cuda") let this host
        (a CPU one, say) build the config of a TPU / GPU target for an ahead-of-time compile, with that target's
        defaults (dtype, batch limits, buckets, KV budget) and attention backend."""
        platform = _resolve_platform(platform)
        self._check_values(platform)
        on_cpu = platform == "cpu"
        model_config = self._model_config(platform)
        pooler, hf_config = resolve_pooling(self.runner, self.convert, self.pooler_config,
                                            apply_hf_overrides(model_config.hf_config, self.hf_overrides),
                                            model_config.source.path if model_config.source.kind == "hf" else None)
        model_config = dataclasses.replace(model_config, hf_config=hf_config)
        scheduler_config = self._scheduler_config(model_config.max_model_len, on_cpu)
        speculative = self._speculative_config(scheduler_config, platform)
        self._check_multi_step(speculative, pooler, hf_config)
        kv_bytes = self.kv_cache_memory_bytes
        if kv_bytes is None and on_cpu:
            kv_bytes = _CPU_DEFAULT_KV_CACHE_BYTES
        return EngineConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=self.block_size,
                enable_prefix_caching=self.enable_prefix_caching and prefix_caching_allowed(pooler),
                gpu_memory_utilization=self.gpu_memory_utilization, kv_cache_memory_bytes=kv_bytes,
                num_gpu_blocks_override=self.num_gpu_blocks_override),
            scheduler_config=scheduler_config,
            parallel_config=ParallelConfig(
                tensor_parallel_size=self.tensor_parallel_size, data_parallel_size=self.data_parallel_size,
                enable_expert_parallel=self.enable_expert_parallel),
            attention_backend=self.attention_backend,
            compilation_cache_dir=resolve_cache_dir(self.compilation_cache_dir, self.compilation_cache),
            platform=platform,
            scan_layers=SCAN_LAYERS_DEFAULT[platform] if self.scan_layers is None else self.scan_layers,
            structured_outputs_config=StructuredOutputsConfig.parse(self.structured_outputs_config),
            reasoning_parser=self.reasoning_parser,
            async_scheduling=(ASYNC_SCHEDULING_DEFAULT[platform] and speculative is None and pooler is None
                              if self.async_scheduling is None else self.async_scheduling),
            speculative_config=speculative,
            draft_model_config=self._draft_model_config(speculative, model_config),
            lora_config=self._lora_config(),
            enable_sleep_mode=self.enable_sleep_mode,
            pooler_config=check_pooling_runner(pooler, self, speculative),
            multimodal_config=MultiModalConfig.create(self.limit_mm_per_prompt, self.allowed_local_media_path,
                                                      self.allowed_media_domains, self.encoder_cache_size),
        )

    def _check_multi_step(self, speculative: SpeculativeConfig | None, pooler: PoolerConfig | None,
                          hf_config: Any) -> None:
        """--num-scheduler-steps > 1 runs plain decoding only: speculative decoding, LoRA, pooling and
        vision-language models (their steps carry M-RoPE positions the decode loop does not advance) are refused
        (docs/architecture/05-worker.md, "Several decode steps per dispatch")."""
        if self.num_scheduler_steps == 1:
            return
        from vllm_jax.multimodal.capabilities import supports_images

        for name, on in (("speculative_config", speculative is not None), ("enable_lora", self.enable_lora),
                         ("a pooling runner", pooler is not None),
                         ("a vision-language model", supports_images(hf_config))):
            if on:
                raise ValueError(f"num_scheduler_steps {self.num_scheduler_steps} cannot be combined with {name} "
                                 "yet (use num_scheduler_steps 1)")

    def _lora_config(self) -> LoRAConfig | None:
        """LoRA with speculative decoding: the target's verification pass runs each request's adapter; n-gram
        proposals need nothing, a draft model or EAGLE-3 head proposes without adapters (as vLLM's)."""
        if not self.enable_lora:
            if self.lora_modules:
                raise ValueError("lora_modules needs enable_lora")
            return None
        return LoRAConfig.create(self.max_loras, self.max_lora_rank, self.max_cpu_loras, self.lora_modules)

    def _speculative_config(self, sched: SchedulerConfig, platform: str) -> SpeculativeConfig | None:
        """speculative_config, checked against the batch limits, with the platform's disable_by_batch_size unless
        given. Proposals need the host to know every accepted token, so async scheduling is off with speculation
        (vLLM refuses n-gram with async scheduling too)."""
        speculative = SpeculativeConfig.parse(self.speculative_config)
        if speculative is None:
            return None
        if speculative.disable_by_batch_size is None:
            speculative = dataclasses.replace(
                speculative, disable_by_batch_size=SPEC_DISABLE_BY_BATCH_SIZE_DEFAULT[platform])
        speculative.check_fits(sched.max_num_batched_tokens, sched.max_model_len)
        if self.async_scheduling:
            raise ValueError("async_scheduling cannot be combined with speculative_config: proposals are made "
                             "from the tokens the previous step accepted (leave async_scheduling unset)")
        return speculative

    @staticmethod
    def _draft_model_config(speculative: SpeculativeConfig | None, target: ModelConfig) -> ModelConfig | None:
        """The draft model's config for method draft_model. Its proposals are token ids the target verifies, so
        its vocabulary must be the target's; it runs at the target's dtypes over the same context."""
        if speculative is None or speculative.method != "draft_model":
            return None
        from vllm_jax.model_loader.source import load_hf_config, resolve_model_source

        source = resolve_model_source(speculative.model)
        hf_config = load_hf_config(source)
        vocab, target_vocab = getattr(hf_config, "vocab_size", None), getattr(target.hf_config, "vocab_size", None)
        if vocab != target_vocab:
            raise ValueError(f"speculative_config.model {speculative.model!r} has another vocabulary than the "
                             f"target (vocab_size {vocab} vs {target_vocab}): a draft model must share the "
                             "target's tokenizer")
        max_pos = getattr(hf_config, "max_position_embeddings", None) or target.max_model_len
        if max_pos < target.max_model_len:
            raise ValueError(f"speculative_config.model {speculative.model!r} covers {max_pos} positions "
                             f"(max_position_embeddings), fewer than max_model_len ({target.max_model_len})")
        return dataclasses.replace(target, model=speculative.model, source=source, hf_config=hf_config,
                                   served_model_name=source.default_name, tokenizer=None,
                                   quantization=None, quantization_group_size=None,
                                   quantization_online=False)  # the draft stays float

    def _check_values(self, platform: str) -> None:
        """Every check that needs no model: a ValueError naming the first bad flag."""
        from vllm_jax.attention.selector import BACKENDS, attention_backend_for

        _check_choice("dtype", self.dtype, DTYPES)
        if self.quantization is not None:
            _check_choice("quantization", self.quantization, QUANTIZATIONS)
        if self.kv_cache_dtype == "fp8_e5m2":
            raise ValueError(f"kv_cache_dtype 'fp8_e5m2' is not supported; kv_cache_dtype must be one of "
                             f"{', '.join(KV_CACHE_DTYPES)} (fp8 and fp8_e4m3 are float8_e4m3fn)")
        _check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _check_choice("attention_backend", self.attention_backend, ("auto", *BACKENDS))
        attention_backend_for(self.attention_backend, platform)  # the other accelerator's kernel is refused here
        _check_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128; got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1]; got {self.gpu_memory_utilization}")
        for name in ("kv_cache_memory_bytes", "num_gpu_blocks_override", "max_num_seqs",
                     "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        for name in ("tensor_parallel_size", "data_parallel_size", "min_token_bucket", "min_seq_bucket"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.bucket_growth is not None and self.bucket_growth < 2:
            raise ValueError(f"bucket_growth must be >= 2; got {self.bucket_growth}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0; got {self.max_logprobs}")
        if self.num_scheduler_steps not in NUM_SCHEDULER_STEPS:
            raise ValueError(f"num_scheduler_steps must be one of {', '.join(map(str, NUM_SCHEDULER_STEPS))}; got "
                             f"{self.num_scheduler_steps!r}")
        if self.reasoning_parser is not None:
            get_reasoning_parser(self.reasoning_parser)

    def _model_config(self, platform: str) -> ModelConfig:
        """Find the model, read its HF config, resolve the dtypes and the context length."""
        from vllm_jax.model_loader.source import load_hf_config, resolve_model_source

        source = resolve_model_source(self.model)
        hf_config = load_hf_config(source)
        dtype = self.dtype if self.dtype != "auto" else ("float32" if platform == "cpu" else "bfloat16")
        max_pos = getattr(hf_config, "max_position_embeddings", None) or 2048
        max_model_len = self.max_model_len or max_pos
        if max_model_len > max_pos:
            raise ValueError(
                f"max_model_len ({max_model_len}) is larger than the model's max_position_embeddings ({max_pos})")
        if self.quantization == "gguf" and source.kind != "gguf":
            raise ValueError(f"quantization 'gguf' keeps a GGUF file's quantized blocks; {source.path} is not a GGUF "
                             "file (for a float checkpoint use --quantization int8 or fp8)")
        if self.quantization is not None and source.kind == "orbax":
            raise ValueError(f"quantization {self.quantization!r} quantizes a float checkpoint as it loads; "
                             f"{source.path} is a `vllm-jax convert` directory, which it does not read yet: pass "
                             "the original safetensors or GGUF model")
        quantization, group_size, prequantized = self.quantization, None, None
        if source.kind == "hf":  # a pre-quantized checkpoint's scheme comes from its config.json, as in vLLM
            from vllm_jax.model_loader.prequantized import read_prequantized_config, resolve_quantization

            prequantized = read_prequantized_config(source.path)
            quantization = resolve_quantization(self.quantization, prequantized, source.path)
            group_size = prequantized.group_size if prequantized is not None else None
        elif self.quantization == "compressed-tensors":
            raise ValueError(f"quantization 'compressed-tensors' reads a pre-quantized HF checkpoint; {source.path} "
                             f"is a {source.kind} model")
        kv_cache_dtype = (dtype if self.kv_cache_dtype == "auto"
                          else _KV_CACHE_DTYPE_NAMES.get(self.kv_cache_dtype, self.kv_cache_dtype))
        if platform == "cpu" and kv_cache_dtype in _SLOW_CPU_KV_DTYPES:
            logger.warning("a %s KV cache on CPU: XLA:CPU converts the whole cache to float32 and back to write "
                           "each step's keys (a 32-sequence decode step measured ~11x slower than with a float32 "
                           "cache); --kv-cache-dtype float16 halves the cache without that cost", kv_cache_dtype)
        return ModelConfig(
            model=self.model or source.path, source=source, hf_config=hf_config, dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            max_model_len=max_model_len,
            served_model_name=self.served_model_name or (self.model or source.default_name),
            tokenizer=self.tokenizer, seed=self.seed, max_logprobs=self.max_logprobs, quantization=quantization,
            quantization_group_size=group_size,
            quantization_online=quantization in ("int8", "fp8") and prequantized is None)

    def _scheduler_config(self, max_model_len: int, on_cpu: bool) -> SchedulerConfig:
        """Batch limits and buckets, with the platform's defaults (small on CPU: warm-up compiles each bucket)."""
        max_num_seqs = self.max_num_seqs or (_CPU_DEFAULT_MAX_NUM_SEQS if on_cpu else _ACCEL_DEFAULT_MAX_NUM_SEQS)
        default_tokens = _CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS if on_cpu else _ACCEL_DEFAULT_MAX_NUM_BATCHED_TOKENS
        max_num_batched_tokens = self.max_num_batched_tokens or default_tokens
        if not self.enable_chunked_prefill:
            # Without chunking a whole prompt must fit in one step.
            max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({max_num_seqs}) so that every running request can decode in one step")
        return SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill, policy=self.scheduling_policy,
            min_token_bucket=self.min_token_bucket or (_CPU_MIN_BUCKET if on_cpu else _ACCEL_MIN_TOKEN_BUCKET),
            min_seq_bucket=self.min_seq_bucket or (_CPU_MIN_BUCKET if on_cpu else _ACCEL_MIN_SEQ_BUCKET),
            bucket_growth=self.bucket_growth or (_CPU_BUCKET_GROWTH if on_cpu else 2),
            num_scheduler_steps=self.num_scheduler_steps)


def initialize_distributed(args: EngineArgs) -> None:
    """Join the multi-host process group when `args` ask for one (a coordinator, or several processes); a no-op
    otherwise or once joined. Entry points call it before `create_config`, which must not start jax's backend
    first (docs/architecture/09-sharding.md, "Sharding")."""
    if not (args.distributed_coordinator or (args.num_processes or 1) > 1):
        return
    import jax

    from vllm_jax.sharding.multihost import initialize_distributed as join_process_group

    if not jax.distributed.is_initialized():
        join_process_group(args.distributed_coordinator, args.num_processes, args.process_id)


_TRUE = ("1", "true", "yes", "on")


def default_cache_root() -> str:
    """vllm_jax's per-user cache root (compiled programs live in its `compile` folder)."""
    root = os.environ.get("VLLM_JAX_CACHE_ROOT")
    if root:
        return os.path.expanduser(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vllm_jax")


def resolve_cache_dir(requested: str | None, enabled: bool) -> str | None:
    """The directory an engine uses (None: no persistent cache): the flag's, else the per-user default."""
    if not enabled or os.environ.get("VLLM_DISABLE_COMPILE_CACHE", "").lower() in _TRUE:
        return None
    if requested:
        return os.path.abspath(os.path.expanduser(requested))
    return os.path.join(default_cache_root(), "compile")


def engine_args_from_kwargs(model: str | None, kwargs: dict) -> EngineArgs:
    """Build EngineArgs from `LLM(model, **kwargs)`, naming any unknown keyword."""
    unknown = sorted(set(kwargs) - EngineArgs.field_names())
    if unknown:
        raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
    return EngineArgs(model=model, **kwargs)


def _resolve_platform(platform: str | None) -> str:
    """The platform the programs are built for: the one asked for (its lowering alias allowed), else jax's."""
    if platform is None:
        import jax

        return jax.default_backend()
    platform = _PLATFORM_ALIASES.get(platform, platform)
    _check_choice("platform", platform, PLATFORMS)
    return platform


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
