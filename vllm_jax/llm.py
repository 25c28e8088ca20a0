"""The offline API, as in vLLM: `LLM(model, **engine_args).generate(prompts, sampling_params)` and `.chat(...)`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from vllm_jax.config import engine_args_from_kwargs
from vllm_jax.engine.llm_engine import LLMEngine, PromptType
from vllm_jax.logger import configure_logging
from vllm_jax.lora.request import LoRARequest
from vllm_jax.multimodal.chat_parts import check_prompt_images, offline_chat
from vllm_jax.outputs import RequestOutput
from vllm_jax.pooling.offline import PoolingMixin
from vllm_jax.sampling_params import RequestOutputKind, SamplingParams
from vllm_jax.worker.weight_update import Weights


class LLM(PoolingMixin):
    def __init__(self, model: str | None = None, **kwargs: Any):
        configure_logging()
        args = engine_args_from_kwargs(model, kwargs)
        self.llm_engine = LLMEngine.from_engine_args(args)
        self._counter = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; results come back in input order. `lora_request`: one adapter for
        every prompt, or one (or None) per prompt (needs enable_lora=True)."""
        prompt_list = _as_prompt_list(prompts)
        for i, prompt in enumerate(prompt_list):
            check_prompt_images(prompt, f"prompts[{i}]", **self._media_rules())
        params = _per_prompt(sampling_params, len(prompt_list))
        return self._run(prompt_list, params, use_tqdm, _per_prompt_lora(lora_request, len(prompt_list)))

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation or a list of them, then generate.
        `chat_template_kwargs`: extra variables for the template (e.g. gpt-oss's harmony template reads
        reasoning_effort, model_identity, builtin_tools), as vLLM's LLM.chat takes them. Images come as vLLM's
        content parts: {"type": "image_url", "image_url": {"url": "data:..."}} or {"type": "image_pil",
        "image_pil": PIL.Image} (docs/serving.md, "Images")."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.get_tokenizer()
        extra = dict(chat_template_kwargs or {})
        clash = sorted(set(extra) & {"conversation", "chat_template", "tokenize", "add_generation_prompt",
                                     "continue_final_message"})
        if clash:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(clash)}: pass them as LLM.chat's own "
                             f"arguments")
        prompts = []
        for conv in conversations:
            conv, images = offline_chat(conv, **self._media_rules())
            ids = tokenizer.apply_chat_template(conv, chat_template=chat_template, tokenize=True,
                                                add_generation_prompt=add_generation_prompt,
                                                continue_final_message=continue_final_message, **extra)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            prompt: dict[str, Any] = {"prompt_token_ids": list(ids)}
            if images:
                prompt["multi_modal_data"] = {"image": images}
            prompts.append(prompt)
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)

    def _media_rules(self) -> dict[str, Any]:
        """What decides whether a prompt's images are accepted: the model, and the multimodal flags."""
        config = self.llm_engine.config
        return {"model": config.model_config.served_model_name, "hf_config": config.model_config.hf_config,
                "config": config.multimodal_config}

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    # RL loops (docs/rl.md): vLLM's names
    def update_weights(self, weights: Weights) -> int:
        """Swap in new weights: (HF name, numpy / jax / torch array) pairs, or a checkpoint directory or GGUF
        path, under the loader's own rules and shardings; some params (or layers) only is fine. A bad name or
        shape is a ValueError and changes nothing. Nothing recompiles; the prefix cache is reset."""
        return self.llm_engine.update_weights(weights)

    def sleep(self, level: int = 1) -> None:
        """Free the devices (needs enable_sleep_mode=True): level 1 keeps the weights in host memory, level 2
        drops them (update them before or after waking); the KV cache is freed. Refused while requests run."""
        self.llm_engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back "weights" and / or "kv_cache" (default both) on their shardings; compiles nothing."""
        self.llm_engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.llm_engine.is_sleeping()

    @staticmethod
    def _prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
        return _as_prompt_list(prompts)

    def _run(self, prompts: list[PromptType], params: list[SamplingParams], use_tqdm: bool,
             loras: list[LoRARequest | None] | None = None) -> list[RequestOutput]:
        engine = self.llm_engine
        ids = []
        loras = loras or [None] * len(prompts)
        try:
            for prompt, p, lora in zip(prompts, params, loras):
                p = p.clone()
                p.output_kind = RequestOutputKind.FINAL_ONLY
                rid = str(next(self._counter))
                engine.add_request(rid, prompt, p, lora_request=lora)
                ids.append(rid)
            results: dict[str, RequestOutput] = {}
            with tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm) as bar:
                while engine.has_work():  # until the step in flight, if any, is finished too
                    for out in engine.step():
                        if out.finished:
                            results[out.request_id] = out
                            bar.update(1)
        except BaseException:
            engine.abort_request(ids)
            raise
        return [results[rid] for rid in ids]


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # a single prompt given as token ids
    return prompts


def _per_prompt_lora(lora: LoRARequest | Sequence[LoRARequest | None] | None,
                     n: int) -> list[LoRARequest | None]:
    if lora is None or isinstance(lora, LoRARequest):
        return [lora] * n
    loras = list(lora)
    if len(loras) != n:
        raise ValueError(f"got {len(loras)} lora requests for {n} prompts")
    return loras


def _per_prompt(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} sampling params for {n} prompts")
    return params
