"""vllm_jax: a JAX/XLA reimplementation of vLLM (continuous batching, paged KV cache, Pallas attention).

vLLM's own import line works: `from vllm_jax import LLM, SamplingParams`. The names load lazily (module
`__getattr__`), so `import vllm_jax` stays light: jax, flax and transformers load with the first name that needs
them (`LLM`, `AsyncLLM`), not before.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"

# transformers prints "PyTorch was not found ..." at import when torch is absent, which it is for every user:
# only the tests use torch (the reference implementation). An advisory, not a problem; say so by silencing it.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

_LAZY = {
    "LLM": "vllm_jax.llm",
    "AsyncLLM": "vllm_jax.engine.async_llm",
    "LLMEngine": "vllm_jax.engine.llm_engine",
    "EngineArgs": "vllm_jax.config",
    "SamplingParams": "vllm_jax.sampling_params",
    "RequestOutputKind": "vllm_jax.sampling_params",
    "StructuredOutputsParams": "vllm_jax.sampling_params",
    "RequestOutput": "vllm_jax.outputs",
    "CompletionOutput": "vllm_jax.outputs",
    "Logprob": "vllm_jax.outputs",
    "LoRARequest": "vllm_jax.lora.request",
    "PoolingParams": "vllm_jax.pooling_params",
    "PoolingRequestOutput": "vllm_jax.outputs",
}

__all__ = [*_LAZY, "__version__"]

def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vllm_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
