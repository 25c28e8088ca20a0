"""Weight updates on a `--quantization gguf` engine, whose params are kept in GGUF blocks (docs/architecture/
05-worker.md, "Sleep and weight updates"): float updates are quantized by gguf-py's rule, the one the file's
blocks were made by, so an engine on GGUF A updated with B's float tensors answers exactly as a fresh engine on
B's GGUF quantized the same way; a GGUF path's own blocks are taken as loading takes them; a bad update changes
nothing; nothing recompiles."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from tests.engine.test_gguf import tiny_checkpoint, write_gguf
from tests.engine.test_weight_sync import greedy
from vllm_jax import EngineArgs
from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.model_loader.gguf_file.kept import stored_parts
from vllm_jax.model_loader.gguf_file.requantize import quantized_parts
from vllm_jax.worker.weight_update import ArrayCheckpoint, WeightUpdater

ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=32, max_num_seqs=2, max_num_batched_tokens=8,
            quantization="gguf")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """An untied tiny llama A (q/k rows permuted as llama.cpp writes them) and B (other random values), as
    Q4_1 GGUFs, plus B's float tensors."""
    tmp = tmp_path_factory.mktemp("gguf_sync")
    config, tensors_a = tiny_checkpoint(tmp, "llama")
    rng = np.random.default_rng(7)
    tensors_b = {k: (rng.standard_normal(v.shape) * v.std() + v.mean()).astype(np.float32)
                 for k, v in tensors_a.items()}
    out = {q: write_gguf(tmp / f"a_{q}.gguf", "llama", config, tensors_a, quant=q) for q in ("Q8_0", "Q4_0")}
    out["a"] = write_gguf(tmp / "a.gguf", "llama", config, tensors_a, quant="Q4_1")
    out["b"] = write_gguf(tmp / "b.gguf", "llama", config, tensors_b, quant="Q4_1")
    out["a_float"], out["b_float"] = tensors_a, tensors_b
    return out


def engine_on(path) -> LLMEngine:
    return LLMEngine(EngineArgs(model=str(path), **ARGS).create_config(), warmup=False, show_progress=False)


@pytest.fixture(scope="module")
def engine(files):
    return engine_on(files["a"])


def leaves(engine: LLMEngine) -> list:
    return jax.tree.leaves(nnx.to_pure_dict(engine.runner.params))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantized_float_rows_equal_the_files_blocks(files, qtype):
    """q_proj (rows permuted in the file) and the embedding (not transposed): gguf-py's blocks of the HF rows."""
    path = files["a"] if qtype == "Q4_1" else files[qtype]
    for name, transpose in (("model.layers.1.self_attn.q_proj.weight", True), ("model.embed_tokens.weight", False)):
        want = stored_parts(str(path), name, qtype.lower(), transpose)
        got = quantized_parts(files["a_float"][name], qtype.lower(), transpose)
        assert want.keys() == got.keys()
        for part in want:
            np.testing.assert_array_equal(got[part], want[part], err_msg=f"{name} {part}")


def test_float_update_of_kept_blocks_equals_a_fresh_engine_on_the_quantized_file(files, engine):
    on_a = greedy(engine)
    on_b = greedy(engine_on(files["b"]))
    assert on_a != on_b
    traces = engine.runner.num_compilations
    assert engine.runner.params["layers"]["q_proj"].get_value()[0].dtype == np.uint8  # kept Q4_1 blocks
    engine.update_weights(files["b_float"])
    assert greedy(engine) == on_b
    engine.update_weights(str(files["a"]))  # a GGUF path: its own blocks
    assert greedy(engine) == on_a
    assert engine.runner.num_compilations == traces


def test_bad_shape_or_k_quant_changes_nothing(files, engine):
    before = leaves(engine)
    bad = dict(files["b_float"], **{"model.layers.0.mlp.up_proj.weight": np.zeros((128, 96), np.float32)})
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.up_proj.weight' has shape \(128, 96\)"):
        engine.update_weights(bad)
    runner = engine.runner
    updater = WeightUpdater(runner.params, runner.spec, runner.config.model_config)
    updater.kept["down_proj"] = "q4_k"  # as a Q4_K file's engine keeps it
    with pytest.raises(ValueError, match="down_proj.weight.*Q4_K blocks"):
        updater.update(ArrayCheckpoint(files["b_float"].items()))
    assert all(a is b for a, b in zip(before, leaves(engine)))
