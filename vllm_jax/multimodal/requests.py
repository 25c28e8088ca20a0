"""`multi_modal_data` of a prompt, at add_request (docs/architecture/15-multimodal.md, "A request's images"): the
images are processed on the host before the request is scheduled; a model without a vision tower, or a prompt
whose placeholders do not match its images, is refused with a ValueError naming it."""

from __future__ import annotations

from typing import Any

from vllm_jax.multimodal.inputs import MultiModalInputs, load_image_processor, process_images


class ImagePrompts:
    """The engine's image processor (loaded at the first image) and the model facts the prompts need."""

    def __init__(self, spec: Any, model_path: str, refusal: str | None = None):
        """`refusal`: why this engine takes no images although its model reads them (a multi-host run, the
        pooling runner), or None."""
        self.spec = spec
        self.model_path = model_path
        self.refusal = refusal
        self._processor = None

    @property
    def reads_images(self) -> bool:
        return getattr(self.spec, "vision", None) is not None

    def prepare(self, prompt: Any, token_ids: list[int]) -> tuple[list[int], MultiModalInputs | None]:
        """-> (the prompt's tokens, placeholders expanded; its MultiModalInputs or None without images)."""
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if not data:
            if self.reads_images and self.spec.image_token_id in token_ids:
                raise ValueError(f"the prompt has image placeholder(s) (<|image_pad|>, id {self.spec.image_token_id})"
                                 " but no image in multi_modal_data")
            return token_ids, None
        unknown = sorted(set(data) - {"image"})
        if unknown:
            raise ValueError(f"multi_modal_data: unsupported modality {unknown} (supported: image)")
        images = data.get("image")
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        if not self.reads_images:
            raise ValueError(f"multi_modal_data has {len(images)} image(s) but model {self.spec.architecture} "
                             "has no vision tower (it reads text only)")
        if self.refusal:
            raise ValueError(f"multi_modal_data: {self.refusal}")
        if self._processor is None:
            self._processor = load_image_processor(self.model_path, self.spec)
        return process_images(token_ids, images, self.spec, self._processor)


def image_refusal(config: Any, multi_host: bool) -> str | None:
    """Why an engine of `config` cannot take images although its model reads them (None: it can)."""
    if multi_host:
        return "images are not supported in a multi-host run yet (the encoder runs on one process)"
    if config.pooler_config is not None:
        return "images are not supported by the pooling runner"
    return None
