"""What every endpoint needs before it talks to the engine: the model name, readiness, tokens, sampling params.

`ServingContext` turns each way a request can be wrong into an `APIError` with the right status and the
offending `param`, so that bad input is answered with a 4xx before it reaches the engine (where an error
would cost the other requests a step, or worse). Long texts are tokenized in a worker thread, so that a
megabytes-long prompt does not stall the event loop (and with it every other request and /health).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from vllm_jax.lora.request import LoRARequest
from vllm_jax.reasoning import ThinkTagParser
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.server.errors import APIError, bad_request, model_not_found, unavailable
from vllm_jax.server.openai_base import is_valid_unicode
from vllm_jax.server.protocol import guess_param
from vllm_jax.server.tool_parsers import ToolParser

if TYPE_CHECKING:
    from vllm_jax.engine.async_llm import AsyncLLM

logger = logging.getLogger("vllm_jax.server")

THREADED_TOKENIZE_CHARS = 32_768  # longer texts are tokenized off the event loop (tokenizers releases the GIL)

# apply_chat_template arguments a client must not override through chat_template_kwargs
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "chat_template", "tokenize", "add_generation_prompt", "continue_final_message", "tools",
    "documents", "return_dict", "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs",
    "return_assistant_tokens_mask"})


MAX_TEMPLATE_KWARGS_DEPTH = 64  # far beyond any template's needs; transformers recurses twice per level


def nesting_depth(value: Any) -> int:
    """How deep lists and dicts nest in a JSON value (counted without recursion: the input is the client's)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def load_chat_template(value: str | None) -> str | None:
    """`--chat-template`: a file path, or the Jinja template itself (anything with braces or newlines)."""
    if value is None:
        return None
    try:
        is_file = Path(value).expanduser().is_file()
    except OSError:  # a long inline template is no valid file name
        is_file = False
    if is_file:
        return Path(value).expanduser().read_text(encoding="utf-8")
    if any(c in value for c in "{}\n"):
        return value
    raise ValueError(f"--chat-template {value!r}: no such file (and it does not look like a Jinja template)")


def error_param(exc: Exception) -> str | None:
    """The request field an input error concerns: its own `param` (ToolChoiceError), else the field its
    message starts with."""
    return getattr(exc, "param", None) or guess_param(str(exc))


@dataclass
class ServingContext:
    engine: AsyncLLM
    served_model_names: list[str]
    chat_template: str | None = None
    log_requests: bool = False
    tool_parser: ToolParser | None = None  # --enable-auto-tool-choice --tool-call-parser NAME
    reasoning_parser: ThinkTagParser | None = None  # --reasoning-parser NAME
    # LoRA adapters served by name (--lora-modules, and /v1/load_lora_adapter): a request's `model` may name one
    lora_adapters: dict[str, LoRARequest] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lora_config = getattr(getattr(self.engine, "config", None), "lora_config", None)
        if lora_config is not None and not self.lora_adapters:
            self.lora_adapters = {r.lora_name: r for r in lora_config.lora_modules}

    @property
    def max_model_len(self) -> int:
        return self.engine.config.model_config.max_model_len

    def model_name(self, requested: str | None) -> str:
        """The name to answer with; 404 for a model this server does not serve (neither the base model's names
        nor an adapter's)."""
        if requested is None or requested == "":
            return self.served_model_names[0]
        if requested not in self.served_model_names and requested not in self.lora_adapters:
            raise model_not_found(requested)
        return requested

    def lora_request(self, requested: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names, None for the base model."""
        return self.lora_adapters.get(requested) if requested else None

    def admit(self, body: Any) -> str:
        """The checks every generation route starts with: a served model name, a ready engine, only options we
        can honor. Returns the model name to report."""
        model = self.model_name(body.model)
        self.require_ready()
        try:
            body.check_unsupported()
        except ValueError as exc:
            raise bad_request(str(exc), param=error_param(exc)) from exc
        return model

    def require_ready(self) -> None:
        """503 while the engine warms up, shuts down, or after it died: the request could not be served."""
        if self.engine.dead:
            raise unavailable(f"The engine is not running: {self.engine.error}", code="engine_dead")
        if self.engine.shutting_down:
            raise unavailable("The server is shutting down and accepts no new requests.",
                              code="engine_shutting_down")
        if not self.engine.ready:
            raise unavailable("The engine is still warming up; retry when /health returns 200.",
                              code="engine_not_ready")

    # ---- tokens ----
    async def tokenize(self, text: str, *, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
        if not is_valid_unicode(text):
            raise bad_request(f"{param} is not valid Unicode text (it contains unpaired surrogates).", param=param)

        def encode() -> list[int]:
            return list(self.engine.tokenizer.encode(text, add_special_tokens=add_special_tokens))

        try:
            if len(text) <= THREADED_TOKENIZE_CHARS:
                return encode()
            return await anyio.to_thread.run_sync(encode)
        except Exception as exc:
            raise bad_request(f"{param} cannot be tokenized: {exc}", param=param) from exc

    def check_token_ids(self, ids: list[int], param: str) -> list[int]:
        vocab = self.engine.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"{param} contains token ids outside the vocabulary [0, {vocab}): {bad[:10]}",
                              param=param)
        return ids

    def detokenize(self, ids: list[int]) -> str:
        self.check_token_ids(ids, "tokens")
        try:
            return self.engine.tokenizer.decode(ids)
        except Exception as exc:
            raise bad_request(f"tokens cannot be decoded: {exc}", param="tokens") from exc

    def render_chat(self, conversation: list[dict[str, Any]], *, add_generation_prompt: bool,
                    continue_final_message: bool, template_kwargs: dict[str, Any] | None,
                    tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for a conversation (and the tools offered), from --chat-template or the tokenizer's
        own template."""
        tokenizer = self.engine.tokenizer
        template = self.chat_template or getattr(tokenizer, "chat_template", None)
        if not template:
            raise bad_request("This model has no chat template; start the server with --chat-template, or use "
                              "/v1/completions.", param="messages")
        if continue_final_message and conversation[-1]["role"] != "assistant":
            raise bad_request("continue_final_message needs the last message to be from the assistant.",
                              param="messages")
        extra = {k: v for k, v in (template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_KWARGS}
        # transformers and the template walk these values recursively
        for param, value in (("chat_template_kwargs", extra), ("tools", tools), ("messages", conversation)):
            if nesting_depth(value) > MAX_TEMPLATE_KWARGS_DEPTH:
                raise bad_request(f"{param} may nest at most {MAX_TEMPLATE_KWARGS_DEPTH} levels deep.", param=param)
        try:
            text = tokenizer.apply_chat_template(
                conversation, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tools=tools, **extra)
        except Exception as exc:
            raise bad_request(f"The chat template cannot render these messages: {exc}", param="messages") from exc
        if not isinstance(text, str):
            raise APIError(500, "The chat template did not produce text.", code="internal_error")
        return text

    async def chat_prompt_ids(self, conversation: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        # The template already wrote the special tokens it wants (BOS included): add none.
        return await self.tokenize(self.render_chat(conversation, **kwargs), add_special_tokens=False,
                                   param="messages")

    # ---- sampling ----
    def sampling_params(self, request: Any, prompt_len: int, prompt_param: str) -> SamplingParams:
        """`request.to_sampling_params` with its ValueError turned into a 400 naming the field."""
        max_logprobs = self.engine.config.model_config.max_logprobs
        for name, count in request.logprob_requests().items():
            if count > max_logprobs:
                raise bad_request(f"{name}={count} exceeds the server's maximum of {max_logprobs} "
                                  "(--max-logprobs).", param=name, code="invalid_value")
        try:
            return request.to_sampling_params(self.max_model_len, prompt_len)
        except (ValueError, TypeError) as exc:
            message = str(exc)
            if message.startswith("This model's maximum context length"):
                param = "max_tokens" if "in the completion" in message else prompt_param
            else:
                param = error_param(exc)
            raise bad_request(message, param=param, code="invalid_value") from exc

    async def compile_structured_outputs(self, request: Any, params: SamplingParams) -> None:
        """Compile the request's constraint in a worker thread (cached: a repeated schema is a lookup), so an
        invalid schema, regex or grammar is a 400 naming its field, and a slow one never stalls the engine."""
        constraint = params.structured_outputs
        compiler = self.engine.grammar_compiler
        if constraint is None or compiler is None:
            return
        try:
            await anyio.to_thread.run_sync(compiler.compile, constraint)
        except ValueError as exc:
            param = request.structured_outputs_param
            raise bad_request(str(exc).replace("structured_outputs", param, 1), param=param,
                              code="invalid_value") from exc

    def log_request(self, request_id: str, prompt: Any, params: SamplingParams) -> None:
        """Prompt text reaches the log only with --enable-log-requests."""
        if self.log_requests:
            logger.info("request %s: prompt=%r, params=%s", request_id, prompt, params)
