"""`tools` and `tool_choice` on chat, checked as vLLM checks them, and the JSON schema a forced choice needs.

- no `tool_choice`: "auto" when tools are given, else "none" (OpenAI's default);
- "none": the template still sees the tools, nothing is parsed;
- "auto": the server's --tool-call-parser finds calls in the text (a 400 without --enable-auto-tool-choice);
- "required" / a named function: structured outputs force the calls, so they always parse (the schemas below).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from vllm_jax.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from vllm_jax.server.chat_messages import ChatTool

# vLLM's words, so that clients and docs written against it read the same error.
AUTO_NEEDS_FLAGS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
_NAMED_FORM = '{"type": "function", "function": {"name": "my_function"}}'
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class ToolChoiceError(ValueError):
    """Bad tools / tool_choice input, with the field to report as OpenAI's `param`."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "named"]
    function: str | None = None  # the named function


def resolve_tool_choice(tools: list[ChatTool] | None, tool_choice: str | dict[str, Any] | None) -> ToolChoice:
    """The request's tool choice; ToolChoiceError for a choice that cannot be honored."""
    if tools is not None and not tools:
        raise ToolChoiceError("tools must not be an empty list; omit it to offer no tools.", "tools")
    if tool_choice is None:
        return ToolChoice("auto" if tools else "none")
    if tool_choice == "none":
        return ToolChoice("none")
    if not tools:
        raise ToolChoiceError("tool_choice needs tools: give the functions the model may call in `tools`.",
                              "tool_choice")
    if tool_choice in ("auto", "required"):
        return ToolChoice(tool_choice)  # type: ignore[arg-type]
    if isinstance(tool_choice, str):
        raise ToolChoiceError(f'tool_choice must be "none", "auto", "required" or a named function '
                              f"({_NAMED_FORM}); got {tool_choice!r}.", "tool_choice")
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice.get("type", "function") != "function" or not isinstance(name, str) or not name:
        raise ToolChoiceError(f"tool_choice must name a function as {_NAMED_FORM}.", "tool_choice")
    known = [tool.function.name for tool in tools]
    if name not in known:
        raise ToolChoiceError(f"tool_choice names the function {name!r}, which is not one of the tools "
                              f"({', '.join(map(repr, known))}).", "tool_choice")
    return ToolChoice("named", name)


def forced_structured_outputs(choice: ToolChoice, tools: list[ChatTool] | None) -> StructuredOutputsParams | None:
    """The constraint a forced tool choice puts on the output (None when nothing is forced): `forced_schema`, in
    compact JSON. The call text is read by the tool parser, never shown, so free whitespace there only spends
    tokens, and a small model's sampled whitespace runs replies to max_tokens (docs/decisions.md, issue #37)."""
    schema = forced_schema(choice, tools)
    return None if schema is None else StructuredOutputsParams(json=schema, disable_any_whitespace=True)


def forced_schema(choice: ToolChoice, tools: list[ChatTool] | None) -> dict[str, Any] | None:
    """The JSON schema structured outputs must enforce for `choice`, or None when nothing is forced.

    A named function: its `parameters` as the user wrote them (the output is the arguments). "required": vLLM's
    list of at least one `{"name": <a tool's name>, "parameters": <its parameters>}`, with every tool's `$defs`
    lifted to the top of the schema so that their `$ref`s still resolve. Each call object holds exactly those two
    keys (vLLM's allows any more; the tool parser reads only these, and a sampled extra key could run the reply to
    max_tokens with no call: issue #37, docs/decisions.md)."""
    if choice.mode == "named":
        tool = next(t for t in tools or [] if t.function.name == choice.function)
        return copy.deepcopy(tool.function.parameters) if tool.function.parameters else dict(_EMPTY_PARAMETERS)
    if choice.mode != "required":
        return None
    entries, defs = [], {}
    for tool in tools or []:
        parameters = copy.deepcopy(tool.function.parameters) if tool.function.parameters else dict(_EMPTY_PARAMETERS)
        tool_defs = parameters.pop("$defs", None) or {}
        if not isinstance(tool_defs, dict):
            raise ToolChoiceError(f"tools: the $defs of {tool.function.name!r} must be an object.", "tools")
        for name, schema in tool_defs.items():
            if defs.setdefault(name, schema) != schema:
                raise ToolChoiceError(f"tools define $defs {name!r} twice, differently; tool_choice \"required\" "
                                      "needs every tool's $defs to agree.", "tools")
        entries.append({"type": "object",
                        "properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                       "parameters": parameters},
                        "required": ["name", "parameters"], "additionalProperties": False})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": entries}}
    if defs:
        schema["$defs"] = defs
    return schema
