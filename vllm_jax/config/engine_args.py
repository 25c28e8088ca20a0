"""Engine configuration: `EngineArgs` (vLLM's flag names) validated once into a frozen `EngineConfig`.

Every part of the engine reads the frozen config; nothing reads globals or environment variables in the
hot path. `EngineArgs.create_config()` resolves the model (local HF directory, HF hub cache or GGUF file:
config/model_resolution.py), reads its architecture config and checks every value, raising `ValueError` naming the
bad flag. It has no side effects: joining a multi-host run is `initialize_distributed(args)`, which the entry points
call first.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from vllm_jax.cache_root import default_cache_root
from vllm_jax.config.engine_config import CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig
from vllm_jax.config.flag_checks import (
    BLOCK_SIZES,
    DTYPES,
    KV_CACHE_DTYPES,
    NUM_SCHEDULER_STEPS,
    QUANTIZATIONS,
    SCHEDULING_POLICIES,
    check_at_least,
    check_choice,
    check_positive,
    resolve_platform,
)
from vllm_jax.config.hybrid_checks import check_hybrid_features
from vllm_jax.config.model_resolution import ModelFlags, draft_model_config, resolve_model_config
from vllm_jax.config.platform_defaults import (
    ACCEL_BUCKET_GROWTH,
    ACCEL_DEFAULT_MAX_NUM_BATCHED_TOKENS,
    ACCEL_DEFAULT_MAX_NUM_SEQS,
    ACCEL_MIN_SEQ_BUCKET,
    ACCEL_MIN_TOKEN_BUCKET,
    ASYNC_SCHEDULING_DEFAULT,
    CPU_BUCKET_GROWTH,
    CPU_DEFAULT_KV_CACHE_BYTES,
    CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS,
    CPU_DEFAULT_MAX_NUM_SEQS,
    CPU_MIN_BUCKET,
    SCAN_LAYERS_DEFAULT,
    SPEC_DISABLE_BY_BATCH_SIZE_DEFAULT,
)
from vllm_jax.config.structured_outputs import StructuredOutputsConfig
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
    # matmuls, see model/weight_forms/layer_switch.py: LayerSwitch), or unrolled over per-layer arrays (~3-6x
    # the compile time).
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
        platform = resolve_platform(platform)
        self._check_values(platform)
        on_cpu = platform == "cpu"
        model_config = resolve_model_config(self._model_flags(), platform)
        pooler, hf_config = resolve_pooling(self.runner, self.convert, self.pooler_config,
                                            apply_hf_overrides(model_config.hf_config, self.hf_overrides),
                                            model_config.source.path if model_config.source.kind == "hf" else None)
        model_config = dataclasses.replace(model_config, hf_config=hf_config)
        scheduler_config = self._scheduler_config(model_config.max_model_len, on_cpu)
        speculative = self._speculative_config(scheduler_config, platform)
        self._check_multi_step(speculative, pooler, hf_config)
        check_hybrid_features(hf_config, {"speculative_config": speculative is not None,
                                          "enable_lora": self.enable_lora, "a pooling runner": pooler is not None,
                                          "num_scheduler_steps > 1": self.num_scheduler_steps > 1})
        kv_bytes = self.kv_cache_memory_bytes
        if kv_bytes is None and on_cpu:
            kv_bytes = CPU_DEFAULT_KV_CACHE_BYTES
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
            draft_model_config=draft_model_config(speculative, model_config),
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

    def _check_values(self, platform: str) -> None:
        """Every check that needs no model: a ValueError naming the first bad flag."""
        from vllm_jax.attention.selector import BACKENDS, attention_backend_for

        check_choice("dtype", self.dtype, DTYPES)
        if self.quantization is not None:
            check_choice("quantization", self.quantization, QUANTIZATIONS)
        if self.kv_cache_dtype == "fp8_e5m2":
            raise ValueError(f"kv_cache_dtype 'fp8_e5m2' is not supported; kv_cache_dtype must be one of "
                             f"{', '.join(KV_CACHE_DTYPES)} (fp8 and fp8_e4m3 are float8_e4m3fn)")
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        check_choice("attention_backend", self.attention_backend, ("auto", *BACKENDS))
        attention_backend_for(self.attention_backend, platform)  # the other accelerator's kernel is refused here
        check_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))}; got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1]; got {self.gpu_memory_utilization}")
        check_positive({name: getattr(self, name) for name in (
            "kv_cache_memory_bytes", "num_gpu_blocks_override", "max_num_seqs", "max_num_batched_tokens",
            "max_model_len")})
        check_at_least(1, {name: getattr(self, name) for name in (
            "tensor_parallel_size", "data_parallel_size", "min_token_bucket", "min_seq_bucket")})
        check_at_least(2, {"bucket_growth": self.bucket_growth})
        check_at_least(0, {"max_logprobs": self.max_logprobs})
        if self.num_scheduler_steps not in NUM_SCHEDULER_STEPS:
            raise ValueError(f"num_scheduler_steps must be one of {', '.join(map(str, NUM_SCHEDULER_STEPS))}; got "
                             f"{self.num_scheduler_steps!r}")
        if self.reasoning_parser is not None:
            get_reasoning_parser(self.reasoning_parser)

    def _model_flags(self) -> ModelFlags:
        return ModelFlags(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelFlags)})

    def _scheduler_config(self, max_model_len: int, on_cpu: bool) -> SchedulerConfig:
        """Batch limits and buckets, with the platform's defaults (small on CPU: warm-up compiles each bucket)."""
        max_num_seqs = self.max_num_seqs or (CPU_DEFAULT_MAX_NUM_SEQS if on_cpu else ACCEL_DEFAULT_MAX_NUM_SEQS)
        default_tokens = CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS if on_cpu else ACCEL_DEFAULT_MAX_NUM_BATCHED_TOKENS
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
            min_token_bucket=self.min_token_bucket or (CPU_MIN_BUCKET if on_cpu else ACCEL_MIN_TOKEN_BUCKET),
            min_seq_bucket=self.min_seq_bucket or (CPU_MIN_BUCKET if on_cpu else ACCEL_MIN_SEQ_BUCKET),
            bucket_growth=self.bucket_growth or (CPU_BUCKET_GROWTH if on_cpu else ACCEL_BUCKET_GROWTH),
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
