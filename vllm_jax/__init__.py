"""vllm_jax: a JAX/XLA reimplementation of vLLM (continuous batching, paged KV cache, Pallas attention)."""

from vllm_jax.config import EngineArgs
from vllm_jax.outputs import CompletionOutput, Logprob, RequestOutput
from vllm_jax.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.1.0"

__all__ = ["EngineArgs", "SamplingParams", "RequestOutputKind", "RequestOutput", "CompletionOutput", "Logprob",
           "__version__"]
