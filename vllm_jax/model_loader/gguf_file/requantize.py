"""Float weights quantized to the GGUF block format a `--quantization gguf` engine keeps them in: how a weight
update (worker/weight_update.py) reaches kept params. The rule is the file's own: gguf-py's `quantize` (the
quantizer llama.cpp's Python converter writes Q8_0 / Q4_0 / Q4_1 with) on each HF [out, in] row, then the
loader's repacking (gguf_file/kept.py, `block_parts`). So an engine updated with float tensors holds exactly
what an engine loading a GGUF quantized from those tensors by gguf-py holds. gguf-py has no K-quant quantizer
(Q4_K / Q6_K need llama.cpp's C quantizer): a float update of a K-quant kept param is refused; a GGUF path
that stores the param in its kept format is taken block for block (`stored_parts`).
"""

from __future__ import annotations

import numpy as np

from vllm_jax.model.grouped_quant import GROUP
from vllm_jax.model_loader.gguf_file.kept import block_parts

QUANTIZABLE = ("q8_0", "q4_0", "q4_1")


def quantized_parts(weight: np.ndarray, fmt: str, transpose: bool) -> dict[str, np.ndarray]:
    """{"values", "scale"[, "min"]} of an HF weight [rows, cols] (float, HF row order) quantized to `fmt`,
    transposed to [in, out] for a linear weight (not for the embedding)."""
    import gguf

    if fmt not in QUANTIZABLE:
        raise ValueError(f"a float weight cannot be quantized to {fmt.upper()} here (gguf-py quantizes "
                         f"{', '.join(f.upper() for f in QUANTIZABLE)} only)")
    rows, cols = weight.shape
    blocks = gguf.quants.quantize(np.ascontiguousarray(weight, np.float32), gguf.GGMLQuantizationType[fmt.upper()])
    return block_parts(blocks.reshape(rows, cols // GROUP, -1), fmt, None, transpose)
