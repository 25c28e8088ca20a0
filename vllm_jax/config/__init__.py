"""Engine configuration: `EngineArgs` (vLLM's flag names, engine_args.py) validated once into a frozen
`EngineConfig` (engine_config.py). The other modules each hold one part: the values a flag may take
(flag_checks.py), what an unset flag becomes per platform (platform_defaults.py), finding the model
(model_resolution.py, the only one that asks the loader), `--structured-outputs-config` (structured_outputs.py)
and the engine flags every command shares (cli_flags.py).

The rest of the package imports the names below from `vllm_jax.config`; config's own modules import each other
by their full names."""

from vllm_jax.config.cli_flags import (
    MODEL_HELP,
    HelpFormatter,
    add_engine_args,
    engine_args_from_namespace,
    human_readable_int,
)
from vllm_jax.config.engine_args import EngineArgs, engine_args_from_kwargs, initialize_distributed, resolve_cache_dir
from vllm_jax.config.engine_config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from vllm_jax.config.structured_outputs import StructuredOutputsConfig

__all__ = ["MODEL_HELP", "CacheConfig", "EngineArgs", "EngineConfig", "HelpFormatter", "ModelConfig", "ParallelConfig",
           "SchedulerConfig", "StructuredOutputsConfig", "add_engine_args", "engine_args_from_kwargs",
           "engine_args_from_namespace", "human_readable_int", "initialize_distributed", "resolve_cache_dir"]
