"""The encoder cache: each image's encoder output, kept by content hash while a request uses it and LRU after
(docs/architecture/15-multimodal.md, "In the engine"). Host numpy only, no jax."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class EncoderCache:
    """Image hash -> its encoder output [tokens, hidden] (host numpy), LRU over entries no running request
    holds, bounded by `max_tokens` image tokens (vLLM's encoder cache budget: entries in use are never evicted)."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.entries: OrderedDict[str, np.ndarray] = OrderedDict()
        self.users: dict[str, set[str]] = {}
        self.hits = self.misses = 0

    def get(self, image_hash: str, req_id: str) -> np.ndarray | None:
        out = self.entries.get(image_hash)
        if out is not None:
            self.entries.move_to_end(image_hash)
            self.users.setdefault(image_hash, set()).add(req_id)
        return out

    def put(self, image_hash: str, req_id: str, embeds: np.ndarray) -> None:
        self.entries[image_hash] = embeds
        self.users.setdefault(image_hash, set()).add(req_id)
        self._evict()

    def release(self, req_id: str) -> None:
        for users in self.users.values():
            users.discard(req_id)
        self._evict()

    def _evict(self) -> None:
        total = sum(len(e) for e in self.entries.values())
        for image_hash in list(self.entries):
            if total <= self.max_tokens:
                break
            if not self.users.get(image_hash):
                total -= len(self.entries.pop(image_hash))
                self.users.pop(image_hash, None)


def encoder_cache_tokens(flag: int, max_num_batched_tokens: int, largest_image_tokens: int) -> int:
    """The encoder cache's bound in image tokens: `--encoder-cache-size`, or by default vLLM's
    max(max_num_batched_tokens, the largest image's tokens). A bound below one image is refused, as vLLM refuses an
    item larger than its encoder cache: entries in use are never evicted, so that bound could not be kept."""
    if flag == 0:
        return max(max_num_batched_tokens, largest_image_tokens)
    if flag < largest_image_tokens:
        raise ValueError(f"encoder_cache_size {flag} is smaller than one image at the processor's max_pixels "
                         f"({largest_image_tokens} image tokens); give at least that, or 0 for the default")
    return flag
