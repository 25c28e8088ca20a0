"""--quantization gguf: a GGUF's Q8_0 / Q4_0 / Q4_1 blocks kept on the device (model/grouped_quant.py,
model_loader/gguf_file/kept.py; docs/architecture/06-model.md, "Quantized weights").

Bounds. The kept blocks dequantize to the dequantizing loader's float32 arrays bit for bit (checked), and the
matmul is weight-only on every platform: the float weight is rebuilt inside the dot (or, on CPU, the native kernel
reads the blocks: native/gguf_matvec.py, float32 too). So the logits differ from the dequantizing loader's only by
the order of summation: the relative L2 error must stay below 1e-5 (the LOGIT_BOUND; measured ~1e-7), and scales off
by 1% (the same program) must land above it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.engine.test_gguf import tiny_checkpoint, write_gguf
from tests.helpers.quantized_models import RUNNER_ARGS, prompt_logits, quant_runner, relative_error
from vllm_jax import EngineArgs
from vllm_jax.model.grouped_quant import dequantize_grouped, min_name
from vllm_jax.model.quantization import scale_name
from vllm_jax.model_loader.gguf_file import GGUFCheckpoint
from vllm_jax.model_loader.gguf_file.kept import kept_formats
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
from vllm_jax.models.llama.weights import LAYER_TENSORS
from vllm_jax.models.registry import resolve_architecture

LOGIT_BOUND = 1e-5
TYPES = ("Q8_0", "Q4_0", "Q4_1")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """An untied llama (q/k rows permuted by llama.cpp's converter), one file per type; vocab 320 so the shared
    test prompts' ids fit."""
    tmp = tmp_path_factory.mktemp("gguf_kept")
    config, tensors = tiny_checkpoint(tmp, "llama", hidden_size=128, intermediate_size=256, vocab_size=320)
    out = {t: write_gguf(tmp / f"{t.lower()}.gguf", "llama", config, tensors, quant=t) for t in TYPES}
    out["mixed"] = write_gguf(tmp / "mixed.gguf", "llama", config, tensors, quant="Q8_0", only="q_proj")
    out["hf_dir"] = tmp / "llama"
    return out


def _kept_params(path) -> tuple[dict, dict]:
    source = resolve_model_source(str(path))
    entry, spec = resolve_architecture(load_hf_config(source))
    formats = kept_formats(str(path))
    model = build_model(entry, spec, "float32", source, platform="cpu", quantization=formats)
    return dict(formats.formats), jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))


def _dequantized(params: dict, name: str, fmt: str, axis: int) -> np.ndarray:
    return dequantize_grouped(params[name], params[scale_name(name)], params.get(min_name(name)), fmt, axis)


def _assert_kept_equal_the_dequantizing_loader(params: dict, reference: GGUFCheckpoint, fmt: str) -> None:
    """Every kept linear (2 layers), the embedding and the LM head rebuild the dequantizing loader's arrays bit
    for bit."""
    for name in LINEARS:
        want = np.stack([reference.read(f"model.layers.{i}.{LAYER_TENSORS[name][0]}", ()).T for i in range(2)])
        assert np.array_equal(_dequantized(params["layers"], name, fmt, -2), want), name
    embed = reference.read("model.embed_tokens.weight", ())
    assert np.array_equal(_dequantized(params, "embed_tokens", fmt, -1), embed)
    assert np.array_equal(_dequantized(params, "lm_head", fmt, -2), reference.read("lm_head.weight", ()).T)


@pytest.mark.parametrize("qtype", TYPES)
def test_kept_blocks_dequantize_bit_exactly_to_the_dequantizing_loader(files, qtype):
    formats, params = _kept_params(files[qtype])
    fmt = qtype.lower()
    assert formats == {name: fmt for name in (*LINEARS, "embed_tokens", "lm_head")}
    reference = GGUFCheckpoint(str(files[qtype]))
    layers = params["layers"]
    assert layers["q_proj"].dtype == (np.int8 if fmt == "q8_0" else np.uint8)
    assert layers["q_proj_scale"].dtype == np.float16 and layers["q_proj_scale"].shape == (2, 128 // 32, 128)
    assert (min_name("q_proj") in layers) == (fmt == "q4_1")
    _assert_kept_equal_the_dequantizing_loader(params, reference, fmt)


def test_a_param_in_another_type_is_dequantized_as_before(files):
    formats, params = _kept_params(files["mixed"])  # q_proj Q8_0, everything else F32
    assert formats == {"q_proj": "q8_0"}
    reference = GGUFCheckpoint(str(files["mixed"]))
    assert params["layers"]["k_proj"].dtype == np.float32
    assert np.array_equal(params["layers"]["k_proj"][1], reference.read("model.layers.1.self_attn.k_proj.weight", ()).T)


def test_gguf_quantization_refuses_a_non_gguf_model(files):
    with pytest.raises(ValueError, match="quantization 'gguf' keeps a GGUF file's quantized blocks; .* is not a GGUF"):
        EngineArgs(model=str(files["hf_dir"]), quantization="gguf").create_config()


@pytest.mark.parametrize("qtype", ["Q4_1"])  # Q8_0's tied head: the default model's greedy test below
def test_logits_within_bound_of_the_dequantizing_loader_and_a_wrong_scale_is_caught(files, qtype):
    reference = prompt_logits(quant_runner(files[qtype], None))
    runner = quant_runner(files[qtype], "gguf")
    logits = prompt_logits(runner)
    assert relative_error(logits, reference) < LOGIT_BOUND
    assert (logits.argmax(-1) == reference.argmax(-1)).all()
    params = runner.device.params
    runner.device.params = jax.tree_util.tree_map_with_path(
        lambda path, v: (v.astype(jnp.float32) * 1.01).astype(v.dtype) if "_scale" in jax.tree_util.keystr(path)
        else v, params)
    assert relative_error(prompt_logits(runner), reference) > LOGIT_BOUND
    runner.device.params = params


@pytest.mark.parametrize("layout", ["unrolled", "stacked"])
def test_other_layer_layouts_equal_the_dequantizing_loader(files, monkeypatch, layout):
    """The CPU default (a scan over per-layer arrays through LayerSwitch) is tested above; here --no-scan-layers
    (a loop over per-layer GGUFBlocksWeights) and the stacked scan TPU / GPU run (sliced per layer)."""
    from vllm_jax.model.decoder import DecoderLM

    reference = prompt_logits(quant_runner(files["Q4_1"], None))
    if layout == "stacked":
        monkeypatch.setattr(DecoderLM, "switched_scan", False)
    runner = quant_runner(files["Q4_1"], "gguf", scan_layers=layout != "unrolled")
    assert relative_error(prompt_logits(runner), reference) < LOGIT_BOUND


def test_cpu_program_reads_the_kept_blocks_natively(files, monkeypatch):
    """The engine's CPU forward takes the native kernel for its layers' dots where a compiler built it (the bounds
    above then hold for it too); without one it keeps the XLA path."""
    from vllm_jax.native import gguf_matvec

    calls = []
    traced = gguf_matvec.gguf_matvec
    monkeypatch.setattr(gguf_matvec, "gguf_matvec",
                        lambda x, valid, weights: calls.append(len(weights)) or traced(x, valid, weights))
    reference = prompt_logits(quant_runner(files["Q4_0"], None))
    assert relative_error(prompt_logits(quant_runner(files["Q4_0"], "gguf")), reference) < LOGIT_BOUND
    # one call a layer for q / k / v, one for gate / up, one each for o and down
    assert sorted(set(calls)) == ([1, 2, 3] if gguf_matvec.available() else [])


# ---- the default model (SmolLM2-135M Q4_1, Q8_0 tied embedding) ----------------------------------------------

DEFAULT_RUNNER_ARGS = dict(RUNNER_ARGS, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=160,
                           num_gpu_blocks_override=33)  # README's 4 prompts: 8 blocks of 16 each


@pytest.fixture(scope="module")
def default_runners() -> dict:
    """The default model's runners: dequantized (None) and kept (gguf)."""
    from vllm_jax.worker.model_runner import ModelRunner

    return {q: ModelRunner(EngineArgs(model=None, quantization=q, **DEFAULT_RUNNER_ARGS).create_config())
            for q in (None, "gguf")}


def test_default_model_params_are_at_most_20_percent_of_float32(default_runners):
    runner = default_runners["gguf"]
    entry, spec = resolve_architecture(runner.config.model_config.hf_config)
    abstract = nnx.eval_shape(lambda: entry.model_class(spec, jnp.float32, rngs=nnx.Rngs(0), platform="cpu"))
    float32_bytes = sum(leaf.size * 4 for leaf in jax.tree.leaves(nnx.state(abstract)))
    kept_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(runner.params))
    state = nnx.to_pure_dict(runner.params)
    assert state["embed_tokens"].dtype == jnp.int8 and state["layers"]["q_proj"][0].dtype == jnp.uint8
    assert kept_bytes <= 0.20 * float32_bytes, (kept_bytes, float32_bytes)


def _greedy(runner, prompts: list[list[int]], max_tokens: int, width: int = 160,
            decode_width: int = 4) -> list[list[int]]:
    """Greedy continuations through the runner's forward programs alone (no engine, no warm-up): one prefill step
    of all prompts padded to `width` tokens, then one decode step per token padded to `decode_width` (two
    programs; a 160-token program per decode step was most of this test's time)."""
    from vllm_jax.worker.batch import RowChunk, pack_step_inputs

    per_seq = runner.max_blocks_per_seq
    blocks = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(len(prompts))]
    seqs = [list(p) for p in prompts]
    rows = [RowChunk(token_ids=p, num_computed=0, block_ids=b) for p, b in zip(seqs, blocks)]
    answers: list[list[int]] = [[] for _ in prompts]
    for step in range(max_tokens):
        padded = width if step == 0 else decode_width
        inputs = pack_step_inputs(rows, block_size=runner.block_size, max_blocks_per_seq=per_seq,
                                  num_tokens_padded=padded, num_seqs_padded=runner.seq_bucket(padded))
        tokens = np.asarray(runner.step(inputs))[:len(prompts)].argmax(-1)
        rows = []
        for i, token in enumerate(tokens.tolist()):
            rows.append(RowChunk(token_ids=[token], num_computed=len(seqs[i]), block_ids=blocks[i]))
            seqs[i].append(token)
            answers[i].append(token)
    return answers


def test_default_model_greedy_answers_equal_the_dequantizing_loader(default_runners):
    """README's prompts (chat template), 10 greedy tokens each: the same weights give the same tokens."""
    from vllm_jax.commands.generate import DEFAULT_PROMPTS
    from vllm_jax.model_loader.gguf_file import load_gguf_tokenizer
    from vllm_jax.model_loader.source import default_model_path

    tok = load_gguf_tokenizer(default_model_path())
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False)
               for p in DEFAULT_PROMPTS]
    answers = {q: _greedy(runner, prompts, 10) for q, runner in default_runners.items()}
    assert answers["gguf"] == answers[None]


def test_default_model_lm_heads_skip_the_buckets_padding_rows(default_runners):
    """Three prompts in a step of more logits rows: on CPU both LM heads (the kept Q8_0 table and the dequantizing
    loader's float32 one, each read by a native kernel) compute the three real rows only (the padding's are zeros),
    and those agree within the kept bound."""
    from vllm_jax.native import float_head, gguf_matvec
    from vllm_jax.worker.batch import RowChunk, pack_step_inputs

    logits = {}
    for q, runner in default_runners.items():
        per_seq = runner.max_blocks_per_seq
        rows = [RowChunk([1 + i, 50 + i, 99, 7], 0, list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)))
                for i in range(3)]
        inputs = pack_step_inputs(rows, block_size=runner.block_size, max_blocks_per_seq=per_seq,
                                  num_tokens_padded=16, num_seqs_padded=runner.seq_bucket(16))
        logits[q] = np.asarray(runner.step(inputs))
        assert logits[q].shape[0] > 3
        native = (gguf_matvec if q else float_head).available()
        assert not logits[q][3:].any() if native else logits[q][3:].any()
    assert relative_error(logits["gguf"][:3], logits[None][:3]) < LOGIT_BOUND


def test_kept_engine_compiles_nothing_after_warm_up(files):
    from vllm_jax import LLM, SamplingParams

    args = dict(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=2, num_gpu_blocks_override=16,
                async_scheduling=False, compilation_cache=False)
    llm = LLM(str(files["Q4_1"]), quantization="gguf", **args)
    before = llm.llm_engine.runner.num_compilations
    outs = llm.generate([[5, 17, 200, 33, 41], [99, 3]], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
                        use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    assert llm.llm_engine.runner.num_compilations == before


# ---- K-quants: Q4_K and Q6_K (256-weight super-blocks, so rows of 256) --------------------------------------

K_TYPES = ("Q4_K", "Q6_K")


@pytest.fixture(scope="module")
def k_files(tmp_path_factory):
    """An untied llama of width 256 (K-quant super-blocks span 256 input rows), one file per K-quant type."""
    tmp = tmp_path_factory.mktemp("gguf_kquants")
    config, tensors = tiny_checkpoint(tmp, "llama", hidden_size=256, intermediate_size=512, vocab_size=320,
                                      head_dim=64)
    files = {t: write_gguf(tmp / f"{t.lower()}.gguf", "llama", config, tensors, quant=t) for t in K_TYPES}
    return files, tensors


@pytest.mark.parametrize("qtype", K_TYPES)
def test_k_quants_dequantize_near_the_weights_and_keep_bit_exactly(k_files, qtype):
    """The dequantizing loader reads K-quants (gguf-py) within their rounding of the original weights; kept, each
    32-row (Q4_K) or 16-row (Q6_K) sub-block has one float32 scale (and Q4_K a min), and the kept blocks rebuild the
    dequantizing loader's arrays bit for bit (our decoding of the super-blocks against gguf-py's)."""
    files, tensors = k_files
    reference = GGUFCheckpoint(str(files[qtype]))
    step = {"Q4_K": 1 / 15, "Q6_K": 1 / 31}[qtype]  # a sub-block's quantization step over its range
    for name, want in tensors.items():
        if want.ndim == 2:
            got = reference.read(name, ())
            assert np.abs(got - want).max() <= 1.1 * step * np.abs(want).max(), name
    formats, params = _kept_params(files[qtype])
    fmt = qtype.lower()
    assert formats == {name: fmt for name in (*LINEARS, "embed_tokens", "lm_head")}
    layers, rows = params["layers"], {"q4_k": 32, "q6_k": 16}[fmt]
    assert layers["q_proj"].dtype == (np.uint8 if fmt == "q4_k" else np.int8)
    assert layers["q_proj_scale"].dtype == np.float32 and layers["q_proj_scale"].shape == (2, 256 // rows, 256)
    assert (min_name("q_proj") in layers) == (fmt == "q4_k")
    _assert_kept_equal_the_dequantizing_loader(params, reference, fmt)


def test_k_quant_logits_equal_the_dequantizing_loader(k_files):
    """Q6_K (16-row groups, int8 values) through the engine's program: logits within LOGIT_BOUND of the
    dequantizing loader's, and scales 1% off fall outside it."""
    files, _ = k_files
    reference = prompt_logits(quant_runner(files["Q6_K"], None))
    runner = quant_runner(files["Q6_K"], "gguf")
    assert relative_error(prompt_logits(runner), reference) < LOGIT_BOUND
    runner.device.params = jax.tree_util.tree_map_with_path(
        lambda path, v: v * 1.01 if "_scale" in jax.tree_util.keystr(path) else v, runner.device.params)
    assert relative_error(prompt_logits(runner), reference) > LOGIT_BOUND


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q4_k", "q8_0"])
@pytest.mark.parametrize("rows", [1, 7])
def test_gguf_dot_equals_x_times_the_dequantized_weight(fmt, rows):
    """gguf_dot is x @ dequantize_grouped(...) up to float32 summation order, for every kept format."""
    from vllm_jax.model.grouped_quant import grouped_shapes
    from vllm_jax.model.quantized_dots import gguf_dot

    rng = np.random.default_rng(0)
    shapes = grouped_shapes((128, 48), fmt, axis=-2)
    parts = {}
    for part, (shape, dtype) in shapes.items():
        if part == "values":
            parts[part] = rng.integers(0, 256, shape).astype(np.uint8) if dtype == np.uint8 else \
                rng.integers(-127, 128, shape).astype(np.int8)
        else:
            parts[part] = ((rng.random(shape) - (0.5 if part == "min" else 0.0)) * 0.1).astype(dtype)
    w = dequantize_grouped(parts["values"], parts["scale"], parts.get("min"), fmt, axis=-2)
    x = rng.standard_normal((rows, 128)).astype(np.float32)
    got = np.asarray(jax.jit(gguf_dot, static_argnums=4)(
        jnp.asarray(x), jnp.asarray(parts["values"]), jnp.asarray(parts["scale"]),
        None if "min" not in parts else jnp.asarray(parts["min"]), fmt))
    want = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
