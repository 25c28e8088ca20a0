"""tool_choice against the request's tools (vllm_jax/server/tool_choice.py): vLLM's defaults and refusals, and the
JSON schemas that "required" and a named function make structured outputs enforce."""

from __future__ import annotations

import pytest

from vllm_jax.server.chat_messages import ChatTool
from vllm_jax.server.tool_choice import (
    ToolChoiceError,
    forced_schema,
    forced_structured_outputs,
    resolve_tool_choice,
)


def _tools(*specs: dict) -> list[ChatTool]:
    return [ChatTool.model_validate(spec) for spec in specs]


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"],
    "$defs": {"city": {"type": "string"}}}}}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}


def test_tool_choice_defaults_and_vllms_refusals():
    tools = _tools(WEATHER_TOOL, TIME_TOOL)
    assert resolve_tool_choice(None, None).mode == "none"
    assert resolve_tool_choice(tools, None).mode == "auto"  # tools without tool_choice: "auto", as in OpenAI
    assert resolve_tool_choice(None, "none").mode == "none"
    named = resolve_tool_choice(tools, {"type": "function", "function": {"name": "get_time"}})
    assert (named.mode, named.function) == ("named", "get_time")
    refused = [(tools, "sometimes", "tool_choice", "must be"), (None, "auto", "tool_choice", "needs tools"),
               (None, "required", "tool_choice", "needs tools"), ([], None, "tools", "must not be an empty list"),
               (tools, {"type": "function", "function": {"name": "get_news"}}, "tool_choice", "'get_news'"),
               (tools, {"type": "function"}, "tool_choice", "must name a function"),
               (tools, {"type": "function", "function": {"name": ""}}, "tool_choice", "must name a function")]
    for given_tools, choice, param, words in refused:
        with pytest.raises(ToolChoiceError, match=words) as info:
            resolve_tool_choice(given_tools, choice)
        assert info.value.param == param


def test_a_named_function_forces_its_parameters_and_required_forces_vllms_list_of_calls():
    tools = _tools(WEATHER_TOOL, TIME_TOOL)
    assert forced_schema(resolve_tool_choice(tools, "auto"), tools) is None
    named = forced_schema(resolve_tool_choice(tools, {"type": "function", "function": {"name": "get_weather"}}),
                          tools)
    assert named == WEATHER_TOOL["function"]["parameters"]
    assert forced_schema(resolve_tool_choice(tools, {"type": "function", "function": {"name": "get_time"}}),
                         tools) == {"type": "object", "properties": {}}
    required = forced_schema(resolve_tool_choice(tools, "required"), tools)
    weather_parameters = {k: v for k, v in WEATHER_TOOL["function"]["parameters"].items() if k != "$defs"}
    assert required == {
        "type": "array", "minItems": 1, "$defs": {"city": {"type": "string"}},
        "items": {"type": "object", "anyOf": [
            {"type": "object",
             "properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": weather_parameters},
             "required": ["name", "parameters"], "additionalProperties": False},
            {"type": "object", "properties": {"name": {"type": "string", "enum": ["get_time"]},
                                              "parameters": {"type": "object", "properties": {}}},
             "required": ["name", "parameters"], "additionalProperties": False}]}}
    assert "$defs" in WEATHER_TOOL["function"]["parameters"]  # the request's own schema is left alone
    clash = dict(TIME_TOOL, function={"name": "get_time", "parameters": {"$defs": {"city": {"type": "integer"}}}})
    with pytest.raises(ToolChoiceError, match="\\$defs 'city' twice"):
        forced_schema(resolve_tool_choice(_tools(WEATHER_TOOL, clash), "required"), _tools(WEATHER_TOOL, clash))


REQUIRED_GOOD = [{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}]
REQUIRED_EXTRA_KEYS = [{"name": "get_weather", "parameters": {"city": "Paris"}, "action": "search", "query": {}}]


def required_schema() -> dict:
    tools = _tools(WEATHER_TOOL, TIME_TOOL)
    return forced_schema(resolve_tool_choice(tools, "required"), tools)


def test_required_call_objects_hold_exactly_name_and_parameters():
    """Issue #37: a call object with a key beyond `name` and `parameters` is refused; the user's parameters schema
    keeps what it allows (here: extra arguments). The grammar compiled from it: test_structured_outputs.py."""
    import jsonschema

    schema = required_schema()
    jsonschema.validate(REQUIRED_GOOD, schema)
    with pytest.raises(jsonschema.ValidationError):  # no anyOf branch takes it
        jsonschema.validate(REQUIRED_EXTRA_KEYS, schema)


def test_a_forced_choice_is_compact_json_and_auto_forces_nothing():
    """The call text is the parser's input, never shown: the constraint leaves no free whitespace in it (issue
    #37: on the default model, sampled whitespace and repeated calls ran 9 of 40 replies to max_tokens)."""
    tools = _tools(WEATHER_TOOL, TIME_TOOL)
    assert forced_structured_outputs(resolve_tool_choice(tools, "auto"), tools) is None
    required = forced_structured_outputs(resolve_tool_choice(tools, "required"), tools)
    assert required.json == required_schema() and required.disable_any_whitespace

