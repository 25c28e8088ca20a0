"""Chat messages with image parts -> the conversation a chat template reads, plus the images in order
(docs/serving.md, "Images").

HF chat templates take a message's content as a list of `{"type": "text", "text": ...}` and `{"type": "image"}`
items and write the model's placeholder for each image (Qwen2.5-VL's: `<|vision_start|><|image_pad|><|vision_end|>`);
the engine expands each placeholder to the image's tokens. A message without images keeps its content as one
string (text parts joined with newlines, as vLLM does), so text-only chats render exactly as before. The checks that
need no decoding (a model that reads images, --limit-mm-per-prompt) run before any image is loaded.
"""

from __future__ import annotations

from typing import Any

from vllm_jax.multimodal.config import MultiModalConfig
from vllm_jax.multimodal.media import ImageSource, load_image

IMAGE_PART_TYPES = ("image_url", "image_pil")


class ContentPartError(ValueError):
    """A bad content part; `param` is its place in the request (what the server's 400 names)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def message_content(parts: list[Any], where: str, *, allow_pil: bool) -> tuple[str | list[dict], list[ImageSource]]:
    """One message's content parts (plain dicts): the joined text when there is no image, else the template's
    item list; and the images' sources. `where` is the message (`messages[1]`)."""
    items: list[dict[str, Any]] = []
    sources: list[ImageSource] = []
    for j, part in enumerate(parts):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise ContentPartError(f"{at}: a text content part needs a `text` field.", at)
            items.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            sources.append(ImageSource(f"{at}.image_url", url=_image_url(part.get("image_url"), f"{at}.image_url")))
            items.append({"type": "image"})
        elif kind == "image_pil" and allow_pil:
            sources.append(ImageSource(f"{at}.image_pil", image=part.get("image_pil")))
            items.append({"type": "image"})
        elif kind == "image_pil":
            raise ContentPartError(f"{at}: image_pil parts are for the offline API (LLM.chat); send an image_url "
                                   "part with a data: URL", at)
        else:
            known = "text, image_url" + (", image_pil" if allow_pil else "")
            raise ContentPartError(f"{at}: content parts of type {kind!r} are not supported ({known} are).", at)
    if not sources:
        return "\n".join(item["text"] for item in items), []
    return items, sources


def offline_conversation(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[ImageSource]]:
    """LLM.chat's messages: one whose content has image parts gets the template's items; the others are passed on
    exactly as given (as before images existed)."""
    conversation, sources = [], []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES
                                             for p in content):
            items, found = message_content(content, f"messages[{i}]", allow_pil=True)
            message = {**message, "content": items}
            sources += found
        conversation.append(message)
    return conversation, sources


def check_images(sources: list[ImageSource], *, model: str, hf_config: Any, config: MultiModalConfig) -> None:
    """Refuse images for a model that reads none, and more than --limit-mm-per-prompt allows; before loading."""
    check_image_places([s.where for s in sources], model=model, hf_config=hf_config, config=config)


def check_image_places(places: list[str], *, model: str, hf_config: Any, config: MultiModalConfig) -> None:
    """check_images for images named by their places in the request (the first refused one is named)."""
    if not places:
        return
    if not model_accepts_images(hf_config):
        raise ContentPartError(f"{places[0]}: model {model} does not accept image inputs (its config has no vision "
                               "tower)", places[0])
    limit = image_limit(hf_config, config)
    if len(places) > limit:
        raise ContentPartError(f"{places[limit]}: at most {limit} image(s) may be given in one prompt "
                               f"(--limit-mm-per-prompt); this one has {len(places)}", places[limit])


def check_prompt_images(prompt: Any, where: str, *, model: str, hf_config: Any, config: MultiModalConfig) -> None:
    """LLM.generate's `{"prompt": ..., "multi_modal_data": {"image": img | [img, ...]}}`: only images, for a model
    that reads them, at most --limit-mm-per-prompt of them."""
    data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
    if not data:
        return
    if not isinstance(data, dict):
        raise ValueError(f"{where}.multi_modal_data must be a dict such as {{'image': [PIL.Image, ...]}}")
    unknown = sorted(set(data) - {"image"})
    if unknown:
        raise ValueError(f"{where}.multi_modal_data: modalities {unknown} are not supported (image is)")
    images = data.get("image")
    count = len(images) if isinstance(images, (list, tuple)) else int(images is not None)
    places = [f"{where}.multi_modal_data['image'][{k}]" for k in range(count)]
    check_image_places(places, model=model, hf_config=hf_config, config=config)


def offline_chat(messages: list[dict[str, Any]], *, model: str, hf_config: Any,
                 config: MultiModalConfig) -> tuple[list[dict[str, Any]], list[Any]]:
    """LLM.chat's conversation for the template, and its images loaded (checked first, as the server does)."""
    conversation, sources = offline_conversation(messages)
    check_images(sources, model=model, hf_config=hf_config, config=config)
    return conversation, load_part_images(sources, config)


def load_part_images(sources: list[ImageSource], config: MultiModalConfig) -> list[Any]:
    """The images, in order (RGB PIL); a ContentPartError naming the first part that cannot be loaded."""
    images = []
    for source in sources:
        try:
            images.append(load_image(source, config))
        except ValueError as exc:
            raise ContentPartError(str(exc), source.where) from None
    return images


def model_accepts_images(hf_config: Any) -> bool:
    """Whether the model has a vision tower that reads images (docs/architecture/15-multimodal.md, "Interfaces")."""
    from vllm_jax.multimodal.capabilities import supports_images

    return bool(supports_images(hf_config))


def image_limit(hf_config: Any, config: MultiModalConfig) -> int:
    """The most images one prompt may carry: --limit-mm-per-prompt, within the model's own cap if it has one (0,
    a text-only model's, is refused before this by model_accepts_images)."""
    from vllm_jax.multimodal.capabilities import max_images_per_prompt

    model_cap = max_images_per_prompt(hf_config)
    return min(config.limit("image"), model_cap) if model_cap else config.limit("image")


def _image_url(value: Any, where: str) -> str:
    """OpenAI's `{"url": ..., "detail": ...}` (detail is ignored: the processor's pixel bounds decide), or a bare
    string as some clients send it."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise ContentPartError(f"{where}: an image_url part needs `image_url.url` (a data:, file:// or http(s) URL)",
                               where)
    return url
