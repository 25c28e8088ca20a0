"""Responses input items as chat messages (vllm_jax/server/protocol_responses.py) and the bounded store
(responses_store.py): pure functions, no engine."""

from __future__ import annotations

import pytest

from vllm_jax.server.protocol_responses import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesInputError,
    ResponsesRequest,
    items_to_messages,
    output_as_input,
)
from vllm_jax.server.responses_store import ResponsesStore, StoredResponse


def test_a_message_its_reasoning_and_its_calls_are_one_assistant_turn():
    items = [{"role": "user", "content": "Hi"},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\": 1}"},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": ""},
             {"type": "function_call_output", "call_id": "c1", "output": "1"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]}]
    assert items_to_messages(items) == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Let me see.", "reasoning": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"}]


def test_output_items_become_the_next_turns_input_items():
    output = [ReasoningItem(id="rs", content=[ReasoningText(text="t")]),
              OutputMessage(id="m", content=[OutputText(text="a")]),
              FunctionCallItem(id="fc", call_id="c", name="f", arguments="{}")]
    assert items_to_messages(output_as_input(output)) == [
        {"role": "assistant", "content": "a", "reasoning": "t",
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]


@pytest.mark.parametrize(("items", "words"), [
    ([{"role": "tool", "content": "x"}], "input[0].role"),
    ([{"type": "function_call", "name": "f"}], "input[0].call_id"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input_file"),
    ([{"role": "user", "content": 5}], "content must be a string"),
])
def test_bad_items_name_where_they_are(items: list, words: str):
    with pytest.raises(ResponsesInputError, match=words.replace("[", r"\[").replace("]", r"\]")):
        items_to_messages(items)


def test_the_chat_request_gets_instructions_first_and_the_flat_tools_in_chats_shape():
    request = ResponsesRequest.model_validate({
        "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 5, "tool_choice": {"type": "function",
                                                                                             "name": "f"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "low"}})
    chat = request.to_chat_request([])
    assert [(m.role, m.content) for m in chat.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert chat.tools[0].function.name == "f" and chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert (chat.max_completion_tokens, chat.response_format.type) == (5, "json_object")
    assert chat.chat_template_kwargs == {"reasoning_effort": "low"}


def test_the_store_evicts_the_least_recently_used():
    store = ResponsesStore(2)
    for name in ("a", "b"):
        store.put(StoredResponse(ResponseObject(id=name, model="m")))
    assert store.get("a") is not None  # "a" is now the most recent
    store.put(StoredResponse(ResponseObject(id="c", model="m")))
    assert (store.get("b"), len(store)) == (None, 2)
    assert store.delete("a") and not store.delete("a")
    with pytest.raises(ValueError, match=">= 1"):
        ResponsesStore(0)


def test_a_tool_the_chat_request_refuses_is_named_as_tools():
    request = ResponsesRequest.model_validate({"input": "Hi", "tools": [{"type": "function", "description": "x"}]})
    with pytest.raises(ResponsesInputError, match="tools is not valid") as info:
        request.to_chat_request([])
    assert info.value.param == "tools"
