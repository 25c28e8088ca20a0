"""OpenAI's request shapes (completions, chat completions, tokenize), as pydantic models; the responses are in
responses.py.

Requests accept OpenAI's fields plus vLLM's sampling extras (top_k, min_p, repetition_penalty, ...), ignore
fields they do not know (clients send extras), and reject what they cannot honor with a 400 rather than
silently doing something else (suffix, best_of != n). Structured outputs come from vLLM's `structured_outputs`
field or OpenAI's `response_format` (json_object, json_schema), on completions and chat alike, as vLLM serves
them; chat's tool_choice "required" or a named function makes its own (tool_choice.py). Types are strict,
as OpenAI's are: `"max_tokens": "10"`, `"stream": "yes"` or `"n": true` is a 400, not a silent conversion (a JSON
integer is still a valid float). Coarse ranges and the per-request limits below are checked here;
`to_sampling_params` builds the engine's `SamplingParams`, whose own validation names the field, and checks the
prompt + max_tokens against the context length with vLLM's message.

Limits that bound what one request can cost (each a 400 naming the field): `n` <= MAX_N, a prompt list of at most
MAX_PROMPTS prompts, at most MAX_STOP_STRINGS stop strings of at most MAX_STOP_CHARS characters each, at most
MAX_BAD_WORDS bad words of at most MAX_STOP_CHARS characters each.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import Field, StrictInt

from vllm_jax.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from vllm_jax.scheduler.request import check_context_length
from vllm_jax.server.chat_messages import ChatMessage, ChatTool
from vllm_jax.server.openai_base import OpenAIRequestModel, is_valid_unicode
from vllm_jax.server.response_format import ResponseFormat, StructuredOutputsRequest
from vllm_jax.server.tool_choice import (
    ToolChoice,
    ToolChoiceError,
    forced_structured_outputs,
    resolve_tool_choice,
)

MAX_N = 128  # completions per request: bounds the fan-out a single request can ask for
MAX_PROMPTS = 1024  # prompts in one completions request (each is one engine request)
MAX_STOP_STRINGS = 64  # OpenAI allows 4; every stop string is searched for after every step
MAX_STOP_CHARS = 1024  # per stop string and per bad word
MAX_BAD_WORDS = 1024
_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

TokenIds = list[StrictInt]


def _check_texts(name: str, values: list[str], *, max_count: int, max_chars: int) -> None:
    """At most `max_count` non-huge strings, each valid Unicode (JSON's \\ud800 escapes are not)."""
    if len(values) > max_count:
        raise ValueError(f"{name} has {len(values)} entries; at most {max_count} are allowed.")
    for value in values:
        if len(value) > max_chars:
            raise ValueError(f"{name} entries may have at most {max_chars} characters; got one of {len(value)}.")
        if not is_valid_unicode(value):
            raise ValueError(f"{name} is not valid Unicode text (it contains unpaired surrogates).")


# ---- requests ----------------------------------------------------------------------------------------------

class StreamOptions(OpenAIRequestModel):
    include_usage: bool = False


class _SamplingRequest(OpenAIRequestModel):
    """Fields shared by completions and chat: OpenAI's sampling options, then vLLM's extras."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=_INT64_MIN, le=_INT64_MAX)
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    best_of: int | None = None
    # vLLM extras
    top_k: int | None = Field(None, ge=-1, le=_INT32_MAX)
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = Field(0, ge=0, le=_INT32_MAX)
    ignore_eos: bool = False
    stop_token_ids: TokenIds | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    bad_words: list[str] | None = None
    allowed_token_ids: TokenIds | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=_INT32_MAX)
    priority: int = Field(0, ge=_INT64_MIN, le=_INT64_MAX)
    cache_salt: str | None = Field(None, min_length=1)
    structured_outputs: StructuredOutputsRequest | None = None
    response_format: ResponseFormat | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _requested_max_tokens(self) -> int | None:
        raise NotImplementedError

    def _default_max_tokens(self, max_model_len: int, prompt_len: int) -> int:
        raise NotImplementedError

    def _logprobs(self) -> int | None:
        raise NotImplementedError

    def check_unsupported(self) -> None:
        """Reject options this server cannot honor (ValueError, answered with 400)."""
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (only best_of == n); use n instead.")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true.")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs is only supported without stream.")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        _check_texts("stop", stops, max_count=MAX_STOP_STRINGS, max_chars=MAX_STOP_CHARS)
        _check_texts("bad_words", list(self.bad_words or []), max_count=MAX_BAD_WORDS, max_chars=MAX_STOP_CHARS)

    def logprob_requests(self) -> dict[str, int]:
        """The logprob counts asked for, by the field that asked (checked against --max-logprobs)."""
        counts = {"prompt_logprobs": self.prompt_logprobs, **self._logprob_fields()}
        return {name: value for name, value in counts.items() if value is not None}

    def _logprob_fields(self) -> dict[str, int | None]:
        raise NotImplementedError

    @property
    def structured_outputs_param(self) -> str:
        """The field a constraint came from, for error messages."""
        return "structured_outputs" if self.structured_outputs is not None else "response_format"

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The request's constraint, from `structured_outputs` or `response_format` (not both, as in vLLM)."""
        from_format = self.response_format.to_params() if self.response_format is not None else None
        if self.structured_outputs is None:
            return from_format
        if from_format is not None:
            raise ValueError("structured_outputs and a response_format of type json_object / json_schema cannot "
                             "both be given; use one.")
        return self.structured_outputs.to_params()

    def to_sampling_params(self, max_model_len: int, prompt_len: int) -> SamplingParams:
        """The engine's SamplingParams for this request; ValueError (a 400) on a bad value or length."""
        self.check_unsupported()
        max_tokens = self._requested_max_tokens()
        # max_tokens < 1 is left to SamplingParams, whose message names the field
        check_context_length(prompt_len, max_tokens if max_tokens is not None and max_tokens >= 1 else None,
                             max_model_len)
        if max_tokens is None:
            max_tokens = self._default_max_tokens(max_model_len, prompt_len)
        return SamplingParams(
            n=self.n, presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
            min_p=self.min_p or 0.0, seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, max_tokens=max_tokens, min_tokens=self.min_tokens,
            logprobs=self._logprobs(), prompt_logprobs=self.prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, logit_bias=self.logit_bias,
            allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
            structured_outputs=self.structured_outputs_params())


class CompletionRequest(_SamplingRequest):
    """`echo` prepends the prompt; with `logprobs` it scores the prompt too (vLLM's rule: `prompt_logprobs`
    defaults to `logprobs`, so each prompt token after the first gets its logprob and top alternatives).
    `max_tokens: 0` is allowed only with `echo` and returns the prompt alone: as in vLLM, the engine generates one
    token (the prompt's scores need a step) and the response drops it."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(None, le=_INT32_MAX)
    logprobs: int | None = Field(None, ge=0, le=_INT32_MAX)
    echo: bool = False
    suffix: str | None = None

    @property
    def echo_without_generation(self) -> bool:
        return self.echo and self.max_tokens == 0

    def _requested_max_tokens(self) -> int | None:
        return 1 if self.echo_without_generation else self.max_tokens

    def _default_max_tokens(self, max_model_len: int, prompt_len: int) -> int:
        return min(16, max_model_len - prompt_len)  # OpenAI's default of 16, within the context

    def _logprobs(self) -> int | None:
        return self.logprobs

    def _logprob_fields(self) -> dict[str, int | None]:
        return {"logprobs": self.logprobs}

    def check_unsupported(self) -> None:
        super().check_unsupported()
        if self.suffix:
            raise ValueError("suffix is not supported.")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens must be >= 1, got 0 (0 is allowed only with echo=true, which returns the "
                             "prompt, scored with logprobs).")

    def to_sampling_params(self, max_model_len: int, prompt_len: int) -> SamplingParams:
        params = super().to_sampling_params(max_model_len, prompt_len)
        if self.echo and params.prompt_logprobs is None:
            params.prompt_logprobs = params.logprobs  # already validated as a logprob count
        return params

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt field as a non-empty list of prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty.")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        if len(p) > MAX_PROMPTS:
            raise ValueError(f"prompt is a list of {len(p)} prompts; at most {MAX_PROMPTS} are allowed in one "
                             "request.")
        if any(isinstance(x, list) and not x for x in p):
            raise ValueError("prompt must not contain an empty list of token ids.")
        return list(p)  # type: ignore[return-value]


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, le=_INT32_MAX)
    max_completion_tokens: int | None = Field(None, le=_INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=_INT32_MAX)
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None  # checked by resolve_tool_choice, with vLLM's rules
    parallel_tool_calls: bool = True  # false: only the first call is returned, as vLLM does
    # vLLM extras for the chat template
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True  # false: no `reasoning` in the answer (with --reasoning-parser)

    def _requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def _default_max_tokens(self, max_model_len: int, prompt_len: int) -> int:
        return max_model_len - prompt_len

    def _logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def _logprob_fields(self) -> dict[str, int | None]:
        return {"top_logprobs": self.top_logprobs}

    def check_unsupported(self) -> None:
        super().check_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true.")
        self.resolved_tool_choice()
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("add_generation_prompt and continue_final_message cannot both be true.")

    def resolved_tool_choice(self) -> ToolChoice:
        return resolve_tool_choice(self.tools, self.tool_choice)

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [tool.template_dict() for tool in self.tools] if self.tools else None

    def to_sampling_params(self, max_model_len: int, prompt_len: int) -> SamplingParams:
        """As for every request, plus the schema that "required" or a named tool_choice forces."""
        params = super().to_sampling_params(max_model_len, prompt_len)
        forced = forced_structured_outputs(self.resolved_tool_choice(), self.tools)
        if forced is None:
            return params
        if params.structured_outputs is not None:
            raise ToolChoiceError("tool_choice \"required\" or a named function already constrains the output; "
                                  "it cannot be combined with structured outputs.", "tool_choice")
        return dataclasses.replace(params, structured_outputs=forced)

    @property
    def structured_outputs_param(self) -> str:
        """A forced tool choice's schema is made of the tools' parameters: errors in it name `tools`."""
        if self.resolved_tool_choice().mode in ("required", "named"):
            return "tools"
        return super().structured_outputs_param


class TokenizeRequest(OpenAIRequestModel):
    """vLLM's /tokenize: either `prompt` (text) or `messages` (rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None  # rendered by the template, as on chat
    return_token_strs: bool = False


class DetokenizeRequest(OpenAIRequestModel):
    model: str | None = None
    tokens: TokenIds


_LEADING_NAME = re.compile(r"^([a-z_]+)(?:[ =:.])")


def guess_param(message: str) -> str | None:
    """The request field an error message starts with ("temperature must be ..."), for OpenAI's `param`."""
    m = _LEADING_NAME.match(message)
    if m and (m.group(1) in CompletionRequest.model_fields or m.group(1) in ChatCompletionRequest.model_fields):
        return m.group(1)
    return None
