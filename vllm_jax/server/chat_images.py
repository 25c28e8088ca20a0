"""A chat request's images, checked and loaded before the engine sees the request (docs/serving.md, "Images").

The checks that need no decoding come first (a model with a vision tower, --limit-mm-per-prompt), then the images
load in a worker thread (decoding, reading a file or fetching a URL must not stall the event loop). Every refusal
is a 400 whose `param` is the part (`messages[1].content[0].image_url`); nothing reaches the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from vllm_jax.multimodal.chat_parts import ContentPartError, check_images, load_part_images
from vllm_jax.multimodal.media import ImageSource
from vllm_jax.server.errors import bad_request

if TYPE_CHECKING:
    from vllm_jax.server.serving import ServingContext


async def load_chat_images(ctx: ServingContext, sources: list[ImageSource], model: str) -> list[Any]:
    """The request's images as RGB PIL images, in placeholder order (none: an empty list)."""
    if not sources:
        return []
    config = ctx.engine.config
    try:
        check_images(sources, model=model, hf_config=config.model_config.hf_config,
                     config=config.multimodal_config)
        return await anyio.to_thread.run_sync(load_part_images, sources, config.multimodal_config)
    except ContentPartError as exc:
        raise bad_request(str(exc), param=exc.param) from exc


def engine_prompt(prompt_ids: list[int], images: list[Any]) -> list[int] | dict[str, Any]:
    """What goes to the engine: the token ids, with the images as vLLM's `multi_modal_data` when there are any."""
    if not images:
        return prompt_ids
    return {"prompt_token_ids": prompt_ids, "multi_modal_data": {"image": list(images)}}
