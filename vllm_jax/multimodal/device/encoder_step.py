"""The vision-language side of the runner's step (docs/architecture/15-multimodal.md, "In the engine"): the
encoder program over fixed patch buckets, the encoder cache (multimodal/encoder_cache.py), and the three StepInputs
arrays a vision-language step carries (M-RoPE positions, image-token embeddings, their mask)."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import numpy as np

from vllm_jax.model.qwen2_5_vl import encode_images
from vllm_jax.model.qwen2_5_vl_spec import Qwen2_5_VLSpec
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.model.vision_layout import image_pixel_limits
from vllm_jax.multimodal.encoder_cache import EncoderCache, encoder_cache_tokens
from vllm_jax.worker.device_step import DeviceStep
from vllm_jax.worker.programs import CompiledPrograms, input_signature
from vllm_jax.worker.warmup import WarmupContext, WarmupPlan

MIN_PATCH_BUCKET = 64


def patch_buckets(max_patches: int, unit: int) -> list[int]:
    """Patches per encoder call: powers of two from MIN_PATCH_BUCKET up to the first that holds `max_patches`
    (the processor's max_pixels / patch area), so a ladder of log2 programs covers every image size."""
    buckets = [max(MIN_PATCH_BUCKET, unit)]
    while buckets[-1] < max_patches:
        buckets.append(buckets[-1] * 2)
    return buckets


def add_empty_mm_arrays(inputs: StepInputs, hidden: int, dtype) -> StepInputs:
    """A vision-language step's extra arrays with no image rows (warm-up, text-only steps); `hidden`: the
    spec's mm_embed_width."""
    num_tokens = inputs.input_ids.shape[0]
    inputs.mrope_positions = np.broadcast_to(np.asarray(inputs.positions, np.int32), (3, num_tokens)).copy()
    inputs.mm_embeds = np.zeros((num_tokens, hidden), dtype)
    inputs.mm_mask = np.zeros(num_tokens, bool)
    return inputs


class MultimodalStep(CompiledPrograms):
    """Per runner: the requests' images, the encoder program and cache, and the step's extra arrays."""

    def __init__(self, device: DeviceStep, spec: Qwen2_5_VLSpec, max_patches: int, cache_tokens: int):
        """`device`: the engine's DeviceStep (its params, and its load_or_compile, which the encoder compiles
        through: the compilation cache, and compile-check's recorder)."""
        super().__init__(device.replicated.mesh, compile_with=device.load_or_compile)
        self.device, self.spec = device, spec
        self.buckets = patch_buckets(max_patches, spec.vision.merge_unit)
        self.encode = jax.jit(partial(encode_images, device.graphdef))
        self.cache = EncoderCache(cache_tokens)
        self.requests: dict[str, Any] = {}  # req_id -> MultiModalInputs
        self.num_encoder_calls = 0

    def update(self, sched) -> None:
        """Track the scheduled requests' images; release the cache entries of requests that left."""
        for req_id in sched.finished_req_ids | sched.preempted_req_ids:
            if self.requests.pop(req_id, None) is not None:
                self.cache.release(req_id)
        for new in sched.scheduled_new_reqs:
            if new.mm_inputs is not None:
                self.requests[new.req_id] = new.mm_inputs

    # --- warm-up (worker/warmup.py, WarmupPart): after every bucket's programs ---
    def bucket_plan(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> WarmupPlan:
        return []

    def final_plan(self, manager: WarmupContext) -> WarmupPlan:
        return [(f"vision encoder P={p}", partial(self._compile, p)) for p in self.buckets]

    def device_arrays(self) -> list:
        return []

    def _compile(self, num_patches: int) -> None:
        v = self.spec.vision
        grid = (1, v.spatial_merge_size, num_patches // v.spatial_merge_size)
        batch = v.encoder_inputs(np.zeros((num_patches, v.patch_dim), np.float32), [grid], num_patches)
        args = (self.device.params, batch)
        self.make_ready(("vision", input_signature(batch)), self.encode, args, args, 0)

    def _run_encoder(self, batch: Any) -> np.ndarray:
        """The warmed-up executable of the batch's bucket (jax.jit for one warm-up did not make)."""
        program = self.program(("vision", input_signature(batch)), self.encode)
        return np.asarray(program(self.device.params, batch))

    def fill(self, inputs: StepInputs, req_ids: list[str]) -> StepInputs:
        """Set the step's M-RoPE positions and image rows: each scheduled token of a request with images takes
        its prompt position triple (past the prompt: index + delta), and each placeholder token its image's
        encoder output row. An image whose first scheduled token is in this step is encoded whole now (or read
        from the cache), so a chunk that splits it finds the rest later."""
        add_empty_mm_arrays(inputs, self.spec.mm_embed_width, np.float32)
        qsl = np.asarray(inputs.query_start_loc)
        for i, req_id in enumerate(req_ids):
            mm = self.requests.get(req_id)
            if mm is None:
                continue
            start, stop = int(qsl[i]), int(qsl[i + 1])
            index = np.asarray(inputs.positions[start:stop], np.int64)
            num_prompt = mm.mrope_positions.shape[1]
            in_prompt = index < num_prompt
            rows = inputs.mrope_positions[:, start:stop]
            rows[:, in_prompt] = mm.mrope_positions[:, index[in_prompt]]
            rows[:, ~in_prompt] = index[~in_prompt] + mm.mrope_delta
            for item in mm.images:
                lo, hi = max(item.offset, int(index[0])), min(item.offset + item.length, int(index[-1]) + 1)
                if lo >= hi:
                    continue
                embeds = self._embeds(item, req_id)
                at = start + lo - int(index[0])
                inputs.mm_embeds[at:at + hi - lo] = embeds[lo - item.offset:hi - item.offset]
                inputs.mm_mask[at:at + hi - lo] = True
        return inputs

    def _embeds(self, item, req_id: str) -> np.ndarray:
        out = self.cache.get(item.hash, req_id)
        if out is not None:
            self.cache.hits += 1
            return out
        self.cache.misses += 1
        v = self.spec.vision
        n = len(item.pixel_values)
        bucket = next((b for b in self.buckets if b >= n), None)
        if bucket is None:
            raise ValueError(f"an image of {n} patches exceeds the largest encoder bucket ({self.buckets[-1]})")
        batch = v.encoder_inputs(item.pixel_values, [item.grid], bucket)
        out = self._run_encoder(batch)[:item.length]
        self.num_encoder_calls += 1
        self.cache.put(item.hash, req_id, out)
        return out



def build_multimodal_step(config: Any, spec: Any, device: DeviceStep) -> MultimodalStep | None:
    """The MultimodalStep for a vision-language model over the engine's DeviceStep (None otherwise). Patch buckets
    reach the processor's max_pixels (capped: vision_layout.image_pixel_limits)."""
    if getattr(spec, "vision", None) is None:
        return None
    max_patches = -(-image_pixel_limits(config.model_config.source.path, spec.vision.patch_size)[1]
                    // spec.vision.patch_size ** 2)
    cache_tokens = encoder_cache_tokens(config.multimodal_config.encoder_cache_size,
                                        config.scheduler_config.max_num_batched_tokens,
                                        max_patches // spec.vision.merge_unit)
    return MultimodalStep(device, spec, max_patches, cache_tokens)
