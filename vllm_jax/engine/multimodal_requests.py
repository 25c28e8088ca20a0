"""`multi_modal_data` of a prompt, at add_request (docs/architecture/15-multimodal.md, "A request's images"): the
images are processed on the host before the request is scheduled; a model without a vision tower, or a prompt
whose placeholders do not match its images, is refused with a ValueError naming it."""

from __future__ import annotations

from typing import Any

from vllm_jax.multimodal.inputs import MultiModalInputs, load_image_processor, process_images


class ImagePrompts:
    """The engine's image processor (loaded at the first image) and the model facts the prompts need."""

    def __init__(self, spec: Any, model_path: str):
        self.spec = spec
        self.model_path = model_path
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
        if self._processor is None:
            self._processor = load_image_processor(self.model_path, self.spec)
        return process_images(token_ids, images, self.spec, self._processor)
