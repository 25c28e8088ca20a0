"""A tiny model whose layers outweigh its embedding (so quantizing the layers shows in its bytes), and its logits
through the runner's own forward program (research path: `ModelRunner.step`, no warm-up)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers.tiny_models import make_tiny_checkpoint

# Llama, 4 layers of width 128 (4 heads of 32, 2 KV heads), FFN 512, tied 320-token embedding: the layers hold
# ~96% of the float32 bytes.
QUANT_MODEL = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, tie_word_embeddings=True)
RUNNER_ARGS = dict(num_gpu_blocks_override=8, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16,
                   compilation_cache=False)
PROMPTS = ([5, 17, 200, 33, 41, 260, 7], [99, 3, 150, 12, 280])


def make_quant_checkpoint(path: Path) -> Path:
    make_tiny_checkpoint("llama", path, seed=3, **QUANT_MODEL)
    return path


def quant_runner(model_dir: Path, quantization: str | None, **args):
    from vllm_jax import EngineArgs
    from vllm_jax.worker.model_runner import ModelRunner

    config = EngineArgs(model=str(model_dir), quantization=quantization, **{**RUNNER_ARGS, **args}).create_config()
    return ModelRunner(config)


def prompt_logits(runner) -> np.ndarray:
    """float32 logits [2, vocab] of the last token of each of PROMPTS (one 16-token prefill step)."""
    from vllm_jax.worker.batch import RowChunk, pack_step_inputs

    rows = [RowChunk(token_ids=p, num_computed=0, block_ids=[1 + i], state_slot=1 + i) for i, p in enumerate(PROMPTS)]
    inputs = pack_step_inputs(rows, block_size=runner.block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                              num_tokens_padded=16, num_seqs_padded=runner.seq_bucket(16),
                              state_slots=runner.num_state_slots > 0)  # a hybrid model's rows: slots 1, 2
    return np.asarray(runner.step(inputs))[:len(PROMPTS)]


def relative_error(logits: np.ndarray, reference: np.ndarray) -> float:
    """The largest per-row ||logits - reference|| / ||reference||."""
    return float(np.max(np.linalg.norm(logits - reference, axis=-1) / np.linalg.norm(reference, axis=-1)))


def param_bytes(runner) -> int:
    """Bytes of the model's param leaves (the KV cache excluded)."""
    import jax

    return sum(leaf.nbytes for leaf in jax.tree.leaves(runner.params))



def dequantized_logits(float_runner, quantized_params) -> np.ndarray:
    """`prompt_logits` of `float_runner` with each quantized weight (the embedding's too) replaced by values * scale
    (float32) from `quantized_params` (a runner's params, same layout): the float model a weight-only quantized one
    computes exactly. The same program runs (same shapes); the runner's own params are put back afterwards."""
    import jax.numpy as jnp
    from flax import nnx

    from vllm_jax.model.quantization import SCALE_SUFFIX, dequantize

    def deq(values, scale):
        if isinstance(values, tuple):  # per-layer arrays (CPU's LayerSwitch layout)
            return tuple(deq(v, s) for v, s in zip(values, scale))
        return jnp.asarray(dequantize(np.asarray(values), np.asarray(scale)))

    quantized = nnx.to_pure_dict(quantized_params)
    params = float_runner.device.params
    original = nnx.to_pure_dict(params)
    state = nnx.to_pure_dict(params)
    # the layers' linears, and the embedding [V, H] (row scales [V, 1]) / an untied LM head of online quantization
    for group, target in ((quantized["layers"], state["layers"]), (quantized, state)):
        for name in group:
            if name.endswith(SCALE_SUFFIX):
                weight = name[:-len(SCALE_SUFFIX)]
                target[weight] = deq(group[weight], group[name])
    _fuse_qkv(state["layers"], float_runner.spec)
    nnx.replace_by_pure_dict(params, state)
    try:
        return prompt_logits(float_runner)
    finally:
        nnx.replace_by_pure_dict(params, original)


def _fuse_qkv(layers: dict, spec) -> None:
    """The dequantized q/k/v joined into the float model's fused weight where it has one
    (model/fused_projections.py), in place."""
    from vllm_jax.model.fused_projections import qkv_layout

    layout = qkv_layout(spec)
    if layout.name not in layers or layout.parts[0] not in layers:
        return
    parts = [layers.pop(name) for name in layout.parts]
    if isinstance(parts[0], tuple):  # per-layer arrays
        layers[layout.name] = tuple(layout.join(list(layer)) for layer in zip(*parts))
    else:
        layers[layout.name] = layout.join(parts)
