"""Structured outputs: constraints compiled by llguidance, a token bitmask per constrained row of each step.

Pure Python (no jax): the engine compiles a request's grammar before it reaches the engine thread, the scheduler
asks each scheduled request's grammar for the bitmask of the token it will sample, and advances it with the
token sampled (docs/architecture/08-sampling.md, "Structured outputs").
"""

from vllm_jax.structured_output.grammar_compiler import GrammarCompiler
from vllm_jax.structured_output.request_grammar import ReasoningTokens, RequestGrammar

__all__ = ["GrammarCompiler", "ReasoningTokens", "RequestGrammar"]
