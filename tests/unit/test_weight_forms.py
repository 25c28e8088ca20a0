"""model/weight_forms: every weight form is a `WeightForm` whose product equals x times the float matrix it stands
for (dequantized here with numpy, independently of the form's own dot), through `jit` (the forms are pytrees),
`layers.linear` and the joined `layers.linears`; every MoE expert stack (`ExpertStack`) gives each grouped row
times its own expert's matrix; every embedding table (`EmbeddingTable`) its rows and the tied head's logits
(docs/architecture/06-model.md, "Weight forms")."""

from __future__ import annotations

import importlib
import pkgutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import vllm_jax.model.weight_forms as weight_forms_package
from vllm_jax.model.grouped_quant import FORMATS, dequantize_grouped, grouped_shapes
from vllm_jax.model.layers import linear, linears
from vllm_jax.model.quantization import KeptFormats, Quantization, dequantize, quantize, quantize_table
from vllm_jax.model.weight_forms.base import WeightForm
from vllm_jax.model.weight_forms.bundle import bundle_experts, bundle_quantized, switched_forms
from vllm_jax.model.weight_forms.channel_scaled import ChannelScaledWeight
from vllm_jax.model.weight_forms.dense import DenseWeight
from vllm_jax.model.weight_forms.embedding_tables import DenseTable, EmbeddingTable, GGUFBlocksTable, RowScaledTable
from vllm_jax.model.weight_forms.expert_lora import LoRAExperts
from vllm_jax.model.weight_forms.experts import ChannelScaledExperts, DenseExperts, ExpertGroups, ExpertStack
from vllm_jax.model.weight_forms.gguf_blocks import GGUFBlocksWeight
from vllm_jax.model.weight_forms.group_scaled import GroupScaledWeight
from vllm_jax.model.weight_forms.layer_switch import LayerSwitch
from vllm_jax.model.weight_forms.lora import LoRAAdapter, LoRAMask, LoRAWeight

IN, OUT, ROWS, LAYERS, GROUP = 64, 48, 5, 3, 16


def _float(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((IN, OUT)).astype(np.float32) * 0.1


def _gguf(rng: np.random.Generator, fmt: str) -> tuple[GGUFBlocksWeight, np.ndarray]:
    """Random blocks of `fmt` (any bytes are a valid weight) and the float32 matrix they stand for."""
    parts = {}
    for part, (shape, dtype) in grouped_shapes((IN, OUT), fmt, axis=-2).items():
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            parts[part] = rng.integers(max(info.min, -32), min(info.max, 255) + 1, shape).astype(dtype)
        else:
            parts[part] = (rng.standard_normal(shape) * 0.01).astype(dtype)
    minimum = parts.get("min")
    want = dequantize_grouped(parts["values"], parts["scale"], minimum, fmt, axis=-2)
    form = GGUFBlocksWeight(jnp.asarray(parts["values"]), jnp.asarray(parts["scale"]),
                            None if minimum is None else jnp.asarray(minimum), fmt)
    return form, want


def _channel_scaled(rng: np.random.Generator, scheme: str) -> tuple[ChannelScaledWeight, np.ndarray]:
    values, scale = quantize(_float(rng), scheme)
    return ChannelScaledWeight(DenseWeight(jnp.asarray(values)), jnp.asarray(scale), False), dequantize(values, scale)


def _w8a8(rng: np.random.Generator) -> tuple[ChannelScaledWeight, np.ndarray]:
    values, scale = quantize(_float(rng), "int8")
    return ChannelScaledWeight(DenseWeight(jnp.asarray(values)), jnp.asarray(scale), True), dequantize(values, scale)


def _group_scaled(rng: np.random.Generator) -> tuple[GroupScaledWeight, np.ndarray]:
    values = _float(rng).astype(ml_dtypes.float8_e4m3fn)
    scale = rng.uniform(0.5, 2.0, (IN // GROUP, OUT)).astype(np.float32)
    return GroupScaledWeight(DenseWeight(jnp.asarray(values)), jnp.asarray(scale)), dequantize(values, scale)


def _switch(rng: np.random.Generator, make) -> tuple[LayerSwitch, np.ndarray]:
    """A switch over LAYERS forms made by `make`, pointing at layer 1."""
    layers = [make(rng) for _ in range(LAYERS)]
    return LayerSwitch(tuple(form for form, _ in layers), jnp.int32(1)), layers[1][1]


def _lora(rng: np.random.Generator) -> tuple[LoRAWeight, np.ndarray]:
    """Every token on adapter slot 1 of 3 (slot 0 zeros): the matrix is W + a[1] @ b[1]."""
    w, rank = _float(rng), 4
    a = rng.standard_normal((3, IN, rank)).astype(np.float32) * 0.1
    b = rng.standard_normal((3, rank, OUT)).astype(np.float32) * 0.1
    a[0], b[0] = 0, 0
    mask = LoRAMask.of(jnp.ones((ROWS,), jnp.int32), 3)
    return LoRAWeight(DenseWeight(jnp.asarray(w)), LoRAAdapter(jnp.asarray(a), jnp.asarray(b), mask)), w + a[1] @ b[1]


CASES = {
    "dense": lambda rng: (DenseWeight(jnp.asarray(w := _float(rng))), w),
    **{f"gguf_{fmt}": (lambda rng, fmt=fmt: _gguf(rng, fmt)) for fmt in FORMATS},
    "int8_weight_only": lambda rng: _channel_scaled(rng, "int8"),
    "fp8_channel": lambda rng: _channel_scaled(rng, "fp8"),
    "int8_w8a8": _w8a8,
    "fp8_block_groups": _group_scaled,
    "switch_dense": lambda rng: _switch(rng, lambda r: (DenseWeight(jnp.asarray(w := _float(r))), w)),
    "switch_gguf_q4_1": lambda rng: _switch(rng, lambda r: _gguf(r, "q4_1")),
    "int8_over_switch": lambda rng: _channel_over_switch(rng),
    "lora": _lora,
}


def _channel_over_switch(rng: np.random.Generator) -> tuple[ChannelScaledWeight, np.ndarray]:
    """The CPU scan's int8: per-layer values switched, the layer's scale sliced by the scan."""
    pairs = [quantize(_float(rng), "int8") for _ in range(LAYERS)]
    switch = LayerSwitch(tuple(DenseWeight(jnp.asarray(v)) for v, _ in pairs), jnp.int32(2))
    return ChannelScaledWeight(switch, jnp.asarray(pairs[2][1]), False), dequantize(*pairs[2])


def _input(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((ROWS, IN)).astype(np.float32)


def _reference(name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 x @ w; W8A8 quantizes each row of x to int8 first (its product is of those rows)."""
    x = x.astype(np.float64)
    if name == "int8_w8a8":
        row_scale = np.abs(x).max(-1, keepdims=True) / 127
        x = np.clip(np.round(x / row_scale), -127, 127) * row_scale
    return x @ w.astype(np.float64)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_form_gives_the_product_of_its_dequantized_matrix(name):
    rng = np.random.default_rng(7)
    form, want_w = CASES[name](rng)
    x = _input(rng)
    assert isinstance(form, WeightForm)
    assert np.abs(want_w).max() > 0, "an all-zero matrix would prove nothing"
    want = _reference(name, x, want_w)
    got = np.asarray(jax.jit(lambda form, x: form.matmul(x))(form, jnp.asarray(x)))  # the form crosses jit
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    bias = rng.standard_normal((OUT,)).astype(np.float32)
    y = np.asarray(linear(jnp.asarray(x), form, jnp.asarray(bias)))
    np.testing.assert_allclose(y, want + bias, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("names", [("dense", "dense"), ("gguf_q8_0", "gguf_q4_k"), ("switch_dense", "switch_dense"),
                                   ("dense", "int8_weight_only"), ("switch_gguf_q4_1", "switch_dense")])
def test_joined_linears_equal_each_form_alone(names):
    """`linears` joins forms that share a join key (one call) and runs the others one by one: the same outputs."""
    rng = np.random.default_rng(11)
    index = jnp.int32(1)
    forms = []
    for name in names:
        form, _ = CASES[name](rng)
        forms.append(LayerSwitch(form.forms, index) if isinstance(form, LayerSwitch) else form)  # one index
    x = jnp.asarray(_input(rng))
    joined = linears(x, forms, [None] * len(forms))
    for form, y in zip(forms, joined):
        np.testing.assert_allclose(np.asarray(y), np.asarray(linear(x, form)), rtol=1e-5, atol=1e-5)


def test_every_form_in_the_package_is_covered():
    """A new form (one class in model/weight_forms) must join CASES above."""
    for module in pkgutil.iter_modules(weight_forms_package.__path__):
        importlib.import_module(f"{weight_forms_package.__name__}.{module.name}")
    forms = {cls for cls in _subclasses(WeightForm)}
    covered = {type(CASES[name](np.random.default_rng(0))[0]) for name in CASES}
    assert forms == covered, f"weight forms without a case: {forms - covered}"


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct} | _subclasses(direct)}


@pytest.mark.parametrize(("quant", "form_class", "scale_shape"), [
    (Quantization.for_platform("int8", "cpu"), ChannelScaledWeight, (OUT,)),
    (Quantization.for_platform("int8", "tpu"), ChannelScaledWeight, (OUT,)),
    (Quantization.for_platform("fp8", "cpu", group_size=GROUP), GroupScaledWeight, (IN // GROUP, OUT)),
    (Quantization.for_platform(KeptFormats((("q_proj", "q8_0"),)), "cpu"), GGUFBlocksWeight, (IN // 32, OUT)),
], ids=["w8a8", "int8_weight_only", "fp8_block_groups", "gguf_q8_0"])
def test_bundle_picks_the_form_of_the_models_quantization(quant, form_class, scale_shape):
    """`bundle_quantized` joins a linear with its scale into the form its Quantization names; the MoE experts'
    stacks stay values and scales (the grouped expert FFN's operands), and nothing changes without quantization."""
    values, scale = jnp.zeros((IN, OUT), jnp.int8), jnp.ones(scale_shape, jnp.float32)
    experts, expert_scale = jnp.zeros((2, IN, OUT), jnp.int8), jnp.ones((2, OUT), jnp.float32)
    w = {"q_proj": values, "q_proj_scale": scale, "experts_gate": experts, "experts_gate_scale": expert_scale,
         "input_norm": jnp.ones((IN,))}
    out = bundle_quantized(w, quant)
    assert type(out["q_proj"]) is form_class and "q_proj_scale" not in out
    assert out["experts_gate"] is experts and out["experts_gate_scale"] is expert_scale
    assert out["input_norm"] is w["input_norm"]
    if form_class is ChannelScaledWeight:
        assert out["q_proj"].quantize_activations == quant.quantize_activations
    assert bundle_quantized(w, None) is w


def test_the_switched_scan_switches_kept_blocks_with_their_scales():
    """Kept blocks' values, scales and mins switch together (their siblings consumed); other matrices switch as
    DenseWeights."""
    rng = np.random.default_rng(5)
    blocks = [_gguf(rng, "q4_1")[0] for _ in range(LAYERS)]
    per_layer = {"q_proj": tuple(b.values for b in blocks), "q_proj_scale": tuple(b.scale for b in blocks),
                 "q_proj_min": tuple(b.minimum for b in blocks),
                 "o_proj": tuple(jnp.asarray(_float(rng)) for _ in range(LAYERS))}
    quant = Quantization.for_platform(KeptFormats((("q_proj", "q4_1"),)), "cpu")
    out = switched_forms(per_layer, jnp.int32(0), quant)
    assert set(out) == {"q_proj", "o_proj"}
    assert all(type(f) is GGUFBlocksWeight and f.fmt == "q4_1" for f in out["q_proj"].forms)
    assert all(type(f) is DenseWeight for f in out["o_proj"].forms)


# ---- MoE expert stacks -------------------------------------------------------------------------------------

EXPERTS, TOKENS, TOP_K, RANK = 4, 7, 2, 3


def _expert_floats(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((EXPERTS, IN, OUT)).astype(np.float32) * 0.1


def _expert_lora(rng: np.random.Generator, base: ExpertStack, want: np.ndarray) -> tuple[ExpertStack, np.ndarray]:
    """Every token on adapter slot 1 of 3 (slot 0 zeros): expert e's matrix is W[e] + a[1, e] @ b[1, e]."""
    a = rng.standard_normal((1, 3, EXPERTS, IN, RANK)).astype(np.float32) * 0.1
    b = rng.standard_normal((1, 3, EXPERTS, RANK, OUT)).astype(np.float32) * 0.1
    a[:, 0], b[:, 0] = 0, 0
    mask = LoRAMask.of(jnp.ones((TOKENS,), jnp.int32), 3)
    form = LoRAExperts.of(base, jnp.asarray(a), jnp.asarray(b), 0, mask)
    return form, want + np.einsum("eir,ero->eio", a[0, 1], b[0, 1])


def _scaled_experts(rng: np.random.Generator) -> tuple[ChannelScaledExperts, np.ndarray]:
    values, scale = quantize(_expert_floats(rng), "int8")
    return ChannelScaledExperts(jnp.asarray(values), jnp.asarray(scale)), dequantize(values, scale)


EXPERT_CASES = {
    "dense": lambda rng: (DenseExperts(jnp.asarray(w := _expert_floats(rng))), w),
    "int8_channel": _scaled_experts,
    "lora_over_dense": lambda rng: _expert_lora(rng, DenseExperts(jnp.asarray(w := _expert_floats(rng))), w),
    "lora_over_int8": lambda rng: _expert_lora(rng, *_scaled_experts(rng)),
}


@pytest.mark.parametrize("name", sorted(EXPERT_CASES))
def test_each_expert_stack_gives_each_row_times_its_experts_matrix(name):
    """Rows grouped by `ExpertGroups` meet their own expert's (dequantized, adapted) matrix, after jit; the biased
    linear adds the row's expert's bias; a slab of experts (an offset) leaves other experts' rows out."""
    rng = np.random.default_rng(3)
    form, want_w = EXPERT_CASES[name](rng)
    assert isinstance(form, ExpertStack) and form.num_experts == EXPERTS
    ids = jnp.asarray(rng.integers(0, EXPERTS, (TOKENS, TOP_K)), jnp.int32)
    x = rng.standard_normal((TOKENS, IN)).astype(np.float32)
    groups = ExpertGroups.of(ids, EXPERTS)
    rows = jnp.asarray(x)[groups.row_token]
    got = np.asarray(jax.jit(lambda form, rows, groups: form.grouped_matmul(rows, groups))(form, rows, groups))
    row_expert = np.asarray(ids).reshape(-1)[np.asarray(groups.order)]
    want = np.einsum("ri,rio->ro", np.asarray(rows, np.float64), want_w[row_expert].astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    bias = rng.standard_normal((EXPERTS, OUT)).astype(np.float32)
    y = np.asarray(form.grouped_linear(rows, groups, jnp.asarray(bias)))
    np.testing.assert_allclose(y, want + bias[row_expert], rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_every_expert_stack_in_the_package_is_covered():
    """A new expert stack form must join EXPERT_CASES above, and give shard_map a spec for each of its arrays."""
    covered = {type(EXPERT_CASES[name](np.random.default_rng(0))[0]) for name in EXPERT_CASES}
    assert _subclasses(ExpertStack) == covered
    for name in EXPERT_CASES:
        form = EXPERT_CASES[name](np.random.default_rng(0))[0]
        specs = form.expert_axis_specs("model")
        assert len(jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))) == len(jax.tree.leaves(form))


def test_bundle_experts_picks_plain_or_channel_scaled_stacks():
    experts, scale = jnp.zeros((2, IN, OUT), jnp.int8), jnp.ones((2, OUT), jnp.float32)
    w = {"experts_gate": experts, "experts_gate_scale": scale, "router": jnp.ones((IN, 2))}
    out = bundle_experts(w, ("experts_gate",), Quantization.for_platform("int8", "cpu"))
    assert type(out["experts_gate"]) is ChannelScaledExperts and "experts_gate_scale" not in out
    assert out["experts_gate"].scale is scale and out["router"] is w["router"]
    plain = bundle_experts({"experts_gate": experts}, ("experts_gate",), None)
    assert type(plain["experts_gate"]) is DenseExperts and plain["experts_gate"].array is experts


# ---- embedding tables --------------------------------------------------------------------------------------

VOCAB = 96


def _gguf_table(rng: np.random.Generator, fmt: str) -> tuple[GGUFBlocksTable, np.ndarray]:
    parts = {}
    for part, (shape, dtype) in grouped_shapes((VOCAB, IN), fmt, axis=-1).items():
        if np.issubdtype(dtype, np.integer):
            parts[part] = rng.integers(0, min(np.iinfo(dtype).max, 255) + 1, shape).astype(dtype)
        else:
            parts[part] = (rng.standard_normal(shape) * 0.01).astype(dtype)
    minimum = parts.get("min")
    want = dequantize_grouped(parts["values"], parts["scale"], minimum, fmt, axis=-1)
    form = GGUFBlocksTable(jnp.asarray(parts["values"]), jnp.asarray(parts["scale"]),
                           None if minimum is None else jnp.asarray(minimum), fmt, jnp.dtype(jnp.float32), False, 32)
    return form, want


def _row_scaled_table(rng: np.random.Generator) -> tuple[RowScaledTable, np.ndarray]:
    values, scale = quantize_table(rng.standard_normal((VOCAB, IN)).astype(np.float32), "int8")
    return (RowScaledTable(jnp.asarray(values), jnp.asarray(scale), jnp.dtype(jnp.float32), False, 32),
            values.astype(np.float32) * scale)


TABLE_CASES = {
    "dense": lambda rng: (DenseTable(jnp.asarray(t := rng.standard_normal((VOCAB, IN)).astype(np.float32)), False,
                                     None), t),
    "int8_rows": _row_scaled_table,
    "gguf_q8_0": lambda rng: _gguf_table(rng, "q8_0"),
    "gguf_q4_1": lambda rng: _gguf_table(rng, "q4_1"),
}


@pytest.mark.parametrize("name", sorted(TABLE_CASES))
def test_each_embedding_table_looks_up_its_rows_and_gives_the_tied_heads_logits(name):
    rng = np.random.default_rng(9)
    form, want_table = TABLE_CASES[name](rng)
    assert np.abs(want_table).max() > 0
    ids = jnp.asarray(rng.integers(0, VOCAB, (ROWS,)), jnp.int32)
    rows = np.asarray(jax.jit(lambda form, ids: form.lookup(ids))(form, ids))
    np.testing.assert_allclose(rows, want_table[np.asarray(ids)], rtol=1e-6, atol=1e-6)
    x = _input(rng)
    want = x.astype(np.float64) @ want_table.T.astype(np.float64)
    got = np.asarray(jax.jit(lambda form, x: form.logits(x))(form, jnp.asarray(x)))
    assert got.shape == (ROWS, VOCAB) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_every_embedding_table_in_the_package_is_covered():
    covered = {type(TABLE_CASES[name](np.random.default_rng(0))[0]) for name in TABLE_CASES}
    assert _subclasses(EmbeddingTable) == covered
