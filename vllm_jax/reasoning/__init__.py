"""Reasoning parsers (`--reasoning-parser`): split a thinking model's output into its reasoning and its answer.

Pure Python, so that the config, the engine and the server can all use them. Each parser exposes `start_token`
and `end_token` (the engine starts structured outputs once the end token is out), `split(text)` for a finished
output and `streamer()` for deltas; the two always agree
(docs/architecture/01-overview.md, "Tool calling and reasoning"). """

from __future__ import annotations

from vllm_jax.reasoning.harmony import HarmonyParser
from vllm_jax.reasoning.think_tags import ReasoningStreamer, ThinkTagParser

REASONING_PARSERS: dict[str, ThinkTagParser] = {
    # DeepSeek-R1 and its distills: <think> is optional (the template may open the block in the prompt).
    "deepseek_r1": ThinkTagParser("deepseek_r1"),
    # Qwen3: the same tags; `enable_thinking: false` makes the template close the block in the prompt.
    "qwen3": ThinkTagParser("qwen3", honours_enable_thinking=True),
    # gpt-oss: harmony's analysis channel is the reasoning, its final channel the answer.
    "openai_gptoss": HarmonyParser(),
}


def get_reasoning_parser(name: str) -> ThinkTagParser:
    """The parser registered as `name`; ValueError naming the allowed names otherwise."""
    try:
        return REASONING_PARSERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"reasoning_parser must be one of {', '.join(sorted(REASONING_PARSERS))}; "
                         f"got {name!r}") from None


__all__ = ["REASONING_PARSERS", "ReasoningStreamer", "ThinkTagParser", "get_reasoning_parser"]
