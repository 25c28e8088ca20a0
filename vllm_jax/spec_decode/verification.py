"""The host side of verifying proposals (docs/architecture/08-sampling.md, "Speculative decoding"): a row verifying d
proposals owns d + 1 logits rows, and the sampler compares each of the first d with its proposal. Pure numpy."""

from __future__ import annotations

import numpy as np


def draft_token_rows(req_ids: list[str], drafts: dict[str, list[int]], num_drafts: np.ndarray,
                     num_rows_padded: int) -> np.ndarray:
    """[S] int32 per logits row: the proposal it verifies, -1 for a row's last logits row and for padding."""
    out = np.full(num_rows_padded, -1, np.int32)
    start = 0
    for req_id, num_draft in zip(req_ids, num_drafts.tolist()):
        if num_draft:
            out[start:start + num_draft] = drafts[req_id]
        start += num_draft + 1
    return out
