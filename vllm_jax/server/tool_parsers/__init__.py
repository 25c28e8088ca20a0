"""Tool-call parsers (`--tool-call-parser`) for the model families served: pure Python, one module per format.

`get_tool_parser(name)` gives the parser; `ToolCallStreamer` runs any parser over stream deltas. The format
each one reads, and where it departs from vLLM's parser of the same name, is in its module.
"""

from __future__ import annotations

from vllm_jax.server.tool_parsers.base import (
    ExtractedToolCalls,
    ParsedToolCall,
    ToolParser,
    random_call_id,
)
from vllm_jax.server.tool_parsers.hermes import HermesToolParser
from vllm_jax.server.tool_parsers.llama3_json import Llama3JsonToolParser
from vllm_jax.server.tool_parsers.mistral import MistralToolParser
from vllm_jax.server.tool_parsers.openai import OpenAIToolParser
from vllm_jax.server.tool_parsers.required import RequiredToolParser
from vllm_jax.server.tool_parsers.streaming import ToolCallStreamer

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    cls.name: cls for cls in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, OpenAIToolParser)}


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered as `name`; ValueError naming the flag and the allowed names otherwise."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"--tool-call-parser must be one of {', '.join(sorted(TOOL_PARSERS))}; got {name!r}")
    return TOOL_PARSERS[name]()


def auto_tool_parser(enable_auto_tool_choice: bool, tool_call_parser: str | None) -> ToolParser | None:
    """The parser tool_choice "auto" uses (vLLM's pair of flags); ValueError naming the flag for a bad name, or
    for --enable-auto-tool-choice without a parser."""
    if tool_call_parser is None:
        if enable_auto_tool_choice:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser (one of "
                             f"{', '.join(sorted(TOOL_PARSERS))})")
        return None
    parser = get_tool_parser(tool_call_parser)  # a bad name is refused even without the other flag
    return parser if enable_auto_tool_choice else None


__all__ = [
    "TOOL_PARSERS",
    "ExtractedToolCalls",
    "ParsedToolCall",
    "RequiredToolParser",
    "ToolCallStreamer",
    "ToolParser",
    "auto_tool_parser",
    "get_tool_parser",
    "random_call_id",
]
