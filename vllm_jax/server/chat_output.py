"""What a chat choice says: the model's text split into reasoning, content and tool calls, whole or streamed.

The pipeline is the same both ways: --reasoning-parser takes the reasoning off the front, then the tool choice
reads the rest: "auto" with --tool-call-parser, "required" as a JSON list of calls, a named function as its
arguments, "none" not at all. A stream's deltas add up to the whole answer (docs/architecture/01-overview.md, "Tool
calling and reasoning"). The finish reason becomes "tool_calls" when calls were made under "auto" or "required" and
the model stopped by itself, as vLLM does for "required" (vLLM's "auto" says "tool_calls" even when max_tokens
cut the output; here "length" stays, which tells the client the output is incomplete); a named function keeps
"stop", as in OpenAI's API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm_jax.reasoning import ThinkTagParser
from vllm_jax.server.protocol import ChatCompletionRequest
from vllm_jax.server.responses import (
    AssistantMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from vllm_jax.server.tool_choice import ToolChoice
from vllm_jax.server.tool_parsers import (
    ParsedToolCall,
    RequiredToolParser,
    ToolCallStreamer,
    ToolParser,
    random_call_id,
)


@dataclass(frozen=True)
class ChatOutputRules:
    """How one request's choices are read; built once per request by `for_request`."""

    choice: ToolChoice
    tool_parser: ToolParser | None  # what reads calls out of the content ("auto", "required")
    new_call_id: Callable[[], str]  # the server's parser's ids: its model's templates may check their form
    reasoning: ThinkTagParser | None
    thinking: bool
    constrained: bool
    include_reasoning: bool
    parallel_tool_calls: bool

    @classmethod
    def for_request(cls, body: ChatCompletionRequest, auto_parser: ToolParser | None,
                    reasoning: ThinkTagParser | None, constrained: bool) -> ChatOutputRules:
        """`constrained`: the request has structured outputs, so without an end tag its output is all answer
        (vllm_jax/reasoning/think_tags.py)."""
        choice = body.resolved_tool_choice()
        parser = {"auto": auto_parser, "required": RequiredToolParser()}.get(choice.mode)
        new_call_id = auto_parser.new_call_id if auto_parser is not None else random_call_id
        thinking = reasoning is not None and reasoning.thinking(body.chat_template_kwargs)
        return cls(choice, parser, new_call_id, reasoning, thinking, constrained, body.include_reasoning,
                   body.parallel_tool_calls)

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the detokenizer must keep special tokens (the parser's markers are special in some models)."""
        if self.reasoning is not None and self.reasoning.keeps_special_tokens:
            return True
        return self.choice.mode == "auto" and self.tool_parser is not None and self.tool_parser.keeps_special_tokens

    def message(self, text: str, finish_reason: str | None) -> tuple[AssistantMessage, str | None]:
        """The message of a finished choice and its finish reason."""
        reasoning, content = (self.reasoning.split(text, self.thinking, self.constrained) if self.reasoning
                              else (None, text))
        parsed: list[ParsedToolCall] = []
        if self.choice.mode == "named":
            parsed, content = [ParsedToolCall(self.choice.function or "", content or "")], None
        elif self.tool_parser is not None:
            extracted = self.tool_parser.extract(content or "")
            if extracted.calls:
                parsed, content = extracted.calls, extracted.content
        if not self.parallel_tool_calls:
            parsed = parsed[:1]
        calls = [ToolCall(id=self.new_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
                 for c in parsed]
        message = AssistantMessage(content=content, tool_calls=calls,
                                   reasoning=reasoning if self.include_reasoning else None)
        return message, self.finish_reason(bool(calls), finish_reason)

    def finish_reason(self, called: bool, finish_reason: str | None) -> str | None:
        forced = self.choice.mode in ("auto", "required")
        return "tool_calls" if called and forced and finish_reason == "stop" else finish_reason

    def streamer(self) -> ChoiceStreamer:
        return ChoiceStreamer(self)


class ChoiceStreamer:
    """One streamed choice: text deltas in, the DeltaMessage fields they settle out."""

    def __init__(self, rules: ChatOutputRules):
        self.rules = rules
        self._reasoning = rules.reasoning.streamer(rules.thinking, rules.constrained) if rules.reasoning else None
        self._tools = ToolCallStreamer(rules.tool_parser) if rules.tool_parser else None
        self.calls_sent = 0

    def push(self, delta: str, finished: bool) -> DeltaMessage:
        """The delta for `delta` (the last one when `finished`); its fields are None where nothing changed."""
        reasoning, content = self._reasoning.push(delta) if self._reasoning else ("", delta)
        if finished and self._reasoning:
            more = self._reasoning.finish()
            reasoning, content = reasoning + more[0], content + more[1]
        pieces: list[DeltaToolCall] = []
        if self.rules.choice.mode == "named":
            if content or (finished and not self.calls_sent):
                pieces.append(self._named_piece(content))
            content = ""
        elif self._tools is not None:
            content, calls = self._tools.push(content)
            if finished:
                more_content, more_calls = self._tools.finish()
                content, calls = content + more_content, calls + more_calls
            pieces = [self._call_piece(call) for call in calls]
        pieces = [p for p in pieces if self.rules.parallel_tool_calls or p.index == 0]
        return DeltaMessage(content=content or None, tool_calls=pieces or None,
                            reasoning=(reasoning or None) if self.rules.include_reasoning else None)

    def _named_piece(self, arguments: str) -> DeltaToolCall:
        if self.calls_sent:
            return DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=arguments))
        self.calls_sent = 1
        return DeltaToolCall(index=0, id=self.rules.new_call_id(), type="function",
                             function=DeltaFunctionCall(name=self.rules.choice.function, arguments=arguments))

    def _call_piece(self, call: ParsedToolCall) -> DeltaToolCall:
        index, self.calls_sent = self.calls_sent, self.calls_sent + 1
        return DeltaToolCall(index=index, id=self.rules.new_call_id(), type="function",
                             function=DeltaFunctionCall(name=call.name, arguments=call.arguments))
