"""GGUF files of gpt-oss and DeepSeek-V2 / V3 (models/deepseek/gguf.py): a tiny random HF checkpoint
is written out as llama.cpp's converter would (its names and metadata keys; gpt-oss's gate / up de-interleaved and
transposed, its experts optionally MXFP4; DeepSeek's experts stacked and kv_b split into k_b / v_b, or one kv_b as
older converters wrote), then read back: the config on the fields the model uses, every HF tensor exactly, and the
engine's logits within 1e-5 of the HF checkpoint's through the same engine."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from transformers import AutoConfig

from tests.helpers.gguf_writing import finish_gguf
from tests.helpers.quantized_models import prompt_logits, quant_runner
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.gguf_file import iter_gguf_tensors, read_gguf_config

GLOBAL = {"model.embed_tokens": "token_embd", "lm_head": "output", "model.norm": "output_norm"}
GPT_OSS_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.router": "ffn_gate_inp"}
DEEPSEEK_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                  "self_attn.q_proj": "attn_q", "self_attn.q_a_proj": "attn_q_a",
                  "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
                  "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
                  "self_attn.o_proj": "attn_output", "mlp.gate": "ffn_gate_inp", "mlp.gate_proj": "ffn_gate",
                  "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
                  "mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
                  "mlp.shared_experts.down_proj": "ffn_down_shexp"}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 0.5, "mscale_all_dim": 0.5, "rope_theta": 10000.0}


def _add(writer: gguf.GGUFWriter, name: str, array: np.ndarray, quant: str | None = None) -> None:
    if quant is not None:
        qtype = gguf.GGMLQuantizationType[quant]
        writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(array), qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))


def _common_keys(writer: gguf.GGUFWriter, config, num_kv_heads: int) -> None:
    """TextModel.set_gguf_parameters' keys."""
    rope = config.rope_parameters
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(num_kv_heads)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if rope["rope_type"] == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])


def gpt_oss_keys(writer: gguf.GGUFWriter, config) -> gguf.GGUFWriter:
    """GptOssModel.set_gguf_parameters' keys."""
    _common_keys(writer, config, config.num_key_value_heads)
    writer.add_expert_count(config.num_local_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_sliding_window(config.sliding_window)
    writer.add_expert_feed_forward_length(config.intermediate_size)
    return writer


def deepseek_keys(writer: gguf.GGUFWriter, config) -> gguf.GGUFWriter:
    """DeepseekV2Model.set_gguf_parameters' keys (the gating function from V2 / V3's scoring function)."""
    v3 = config.architectures == ["DeepseekV3ForCausalLM"]
    rope = config.rope_parameters
    _common_keys(writer, config, 1)  # MLA written as MQA
    writer.add_expert_count(config.n_routed_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_group_count(config.n_group)
    writer.add_expert_group_used_count(config.topk_group)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_leading_dense_block_count(config.first_k_dense_replace)
    if config.q_lora_rank is not None:
        writer.add_q_lora_rank(config.q_lora_rank)
    writer.add_kv_lora_rank(config.kv_lora_rank)
    writer.add_key_length(config.kv_lora_rank + config.qk_rope_head_dim)
    writer.add_value_length(config.kv_lora_rank)
    writer.add_key_length_mla(config.qk_nope_head_dim + config.qk_rope_head_dim)
    writer.add_value_length_mla(config.v_head_dim)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_expert_shared_count(config.n_shared_experts)
    writer.add_expert_weights_scale(config.routed_scaling_factor)
    if config.norm_topk_prob:
        writer.add_expert_weights_norm(True)
    writer.add_rope_dimension_count(config.qk_rope_head_dim)
    if rope.get("mscale_all_dim") is not None:
        writer.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    return writer


def write_gpt_oss_gguf(path: Path, hf_dir: Path, expert_quant: str | None = None, fused: bool = False) -> Path:
    """convert_hf_to_gguf.py's GptOssModel (`fused`: --fuse-gate-up-exps); `expert_quant` for the expert weights."""
    config = AutoConfig.from_pretrained(hf_dir)
    writer = gpt_oss_keys(gguf.GGUFWriter(str(path), "gpt-oss"), config)
    for name, array in load_file(str(hf_dir / "model.safetensors")).items():
        stem, kind = name.rsplit(".", 1)
        if stem in GLOBAL:
            _add(writer, f"{GLOBAL[stem]}.{kind}", array)
            continue
        layer, sub = name.removeprefix("model.layers.").split(".", 1)
        blk = f"blk.{layer}"
        if sub == "self_attn.sinks":
            _add(writer, f"{blk}.attn_sinks.weight", array)
        elif sub.startswith("mlp.experts.gate_up_proj"):
            bias = sub.endswith("_bias")
            rows = array if bias else array.swapaxes(1, 2)  # weight: [E, 2I, H]
            gate, up = rows[:, ::2], rows[:, 1::2]
            kind, quant = ("bias", None) if bias else ("weight", expert_quant)
            if fused:
                _add(writer, f"{blk}.ffn_gate_up_exps.{kind}", np.concatenate([gate, up], axis=1), quant)
            else:
                _add(writer, f"{blk}.ffn_gate_exps.{kind}", gate, quant)
                _add(writer, f"{blk}.ffn_up_exps.{kind}", up, quant)
        elif sub == "mlp.experts.down_proj":
            _add(writer, f"{blk}.ffn_down_exps.weight", array.swapaxes(1, 2), expert_quant)
        elif sub == "mlp.experts.down_proj_bias":
            _add(writer, f"{blk}.ffn_down_exps.bias", array)
        else:
            _add(writer, f"{blk}.{GPT_OSS_BLOCK[sub.rsplit('.', 1)[0]]}.{kind}", array)
    return finish_gguf(writer, path)


def write_deepseek_gguf(path: Path, hf_dir: Path, legacy_kv_b: bool = False, mtp: bool = False) -> Path:
    """convert_hf_to_gguf.py's DeepseekV2Model: experts stacked, kv_b split into k_b / v_b (`legacy_kv_b`: one
    attn_kv_b, as converters before the split wrote), the V3 routing bias as exp_probs_b; `mtp`: a
    multi-token-prediction layer's tensors after the last layer (as other converters write them)."""
    config = AutoConfig.from_pretrained(hf_dir)
    writer = deepseek_keys(gguf.GGUFWriter(str(path), "deepseek2"), config)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    for name, array in tensors.items():
        stem, kind = name.rsplit(".", 1)
        if stem in GLOBAL:
            _add(writer, f"{GLOBAL[stem]}.{kind}", array)
            continue
        layer, sub = stem.removeprefix("model.layers.").split(".", 1)
        blk = f"blk.{layer}"
        if sub.startswith("mlp.experts."):
            expert, proj = sub.removeprefix("mlp.experts.").split(".")
            if expert == "0":
                stack = [tensors[f"{stem.rsplit('.', 3)[0]}.experts.{e}.{proj}.weight"]
                         for e in range(config.n_routed_experts)]
                _add(writer, f"{blk}.ffn_{proj.removesuffix('_proj')}_exps.weight", np.stack(stack))
        elif sub == "mlp.gate" and kind == "e_score_correction_bias":
            _add(writer, f"{blk}.exp_probs_b.bias", array)
        elif sub == "self_attn.kv_b_proj" and not legacy_kv_b:
            kv_b = array.reshape(config.num_attention_heads, config.qk_nope_head_dim + config.v_head_dim, -1)
            _add(writer, f"{blk}.attn_k_b.weight", kv_b[:, :config.qk_nope_head_dim].swapaxes(1, 2))
            _add(writer, f"{blk}.attn_v_b.weight", kv_b[:, config.qk_nope_head_dim:])
        elif sub == "self_attn.kv_b_proj":
            _add(writer, f"{blk}.attn_kv_b.weight", array)
        else:
            _add(writer, f"{blk}.{DEEPSEEK_BLOCK[sub]}.{kind}", array)
    if mtp:
        n = config.num_hidden_layers
        _add(writer, f"blk.{n}.attn_norm.weight", np.ones(config.hidden_size, np.float32))
        _add(writer, f"blk.{n}.nextn.eh_proj.weight", np.ones((config.hidden_size, 2 * config.hidden_size), np.float32))
    return finish_gguf(writer, path)


CHECKPOINTS = {  # llama.cpp fixes gpt-oss's SwiGLU limit at 7.0 (the published value)
    "gpt_oss": lambda path: make_tiny_checkpoint("gpt_oss", path, swiglu_limit=7.0),
    "deepseek_v3": lambda path: make_tiny_checkpoint("deepseek_v3", path, rope_scaling=YARN),
    "deepseek_v2": lambda path: make_tiny_checkpoint("deepseek_v2", path),
}
CONFIG_FIELDS = {
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", "intermediate_size", "head_dim", "num_key_value_heads",
                "sliding_window", "layer_types", "swiglu_limit", "swiglu_alpha", "attention_bias"),
    "deepseek_v3": ("moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
                    "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                    "v_head_dim", "routed_scaling_factor", "norm_topk_prob", "n_group", "topk_group",
                    "num_key_value_heads", "rope_interleave"),
}
CONFIG_FIELDS["deepseek_v2"] = CONFIG_FIELDS["deepseek_v3"][:-1] + ("topk_method",)
COMMON_FIELDS = ("architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                 "rope_parameters")


def _write(arch: str, path: Path, hf_dir: Path, **kwargs) -> Path:
    return (write_gpt_oss_gguf if arch == "gpt_oss" else write_deepseek_gguf)(path, hf_dir, **kwargs)


def _logits(path: Path, quantization: str | None = None) -> np.ndarray:
    return prompt_logits(quant_runner(path, quantization))


@pytest.mark.parametrize("arch, variant", [("gpt_oss", {}), ("gpt_oss", {"fused": True}),
                                           ("deepseek_v3", {"mtp": True}), ("deepseek_v2", {"legacy_kv_b": True})])
def test_config_and_tensors_read_back_as_the_hf_checkpoint(tmp_path, arch, variant):
    """The config on every field the model reads and every HF tensor (names, shapes, values) exactly."""
    hf_dir = tmp_path / "hf"
    CHECKPOINTS[arch](hf_dir)
    path = _write(arch, tmp_path / "f32.gguf", hf_dir, **variant)
    config, want = read_gguf_config(str(path)), AutoConfig.from_pretrained(hf_dir)
    for name in COMMON_FIELDS + CONFIG_FIELDS[arch]:
        assert getattr(config, name) == getattr(want, name), name
    tensors = dict(iter_gguf_tensors(str(path)))
    expected = load_file(str(hf_dir / "model.safetensors"))
    assert sorted(tensors) == sorted(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(tensors[name], array, err_msg=name)


@pytest.mark.parametrize("arch", list(CHECKPOINTS))
def test_moe_gguf_gives_the_hf_checkpoints_logits(tmp_path, arch):
    hf_dir = tmp_path / "hf"
    CHECKPOINTS[arch](hf_dir)
    path = _write(arch, tmp_path / "f32.gguf", hf_dir)
    reference = _logits(hf_dir)
    assert np.abs(reference).max() > 0.1
    np.testing.assert_allclose(_logits(path), reference, atol=1e-5, rtol=0)


def _mxfp4_round(rows: np.ndarray) -> np.ndarray:
    """Each row (last axis) through gguf-py's MXFP4 and back."""
    mx = gguf.GGMLQuantizationType.MXFP4
    return gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(rows), mx), mx).reshape(rows.shape)


def test_gpt_oss_mxfp4_experts_dequantize(tmp_path):
    """Experts stored in MXFP4 (as llama.cpp converts the published checkpoints) give the logits of the HF
    checkpoint whose experts hold the same MXFP4-rounded values."""
    hf_dir, rounded_dir = tmp_path / "hf", tmp_path / "rounded"
    make_tiny_checkpoint("gpt_oss", hf_dir, swiglu_limit=7.0, intermediate_size=64)  # rows of 32-weight blocks
    path = write_gpt_oss_gguf(tmp_path / "mxfp4.gguf", hf_dir, expert_quant="MXFP4")
    tensors = load_file(str(hf_dir / "model.safetensors"))
    rounded = {name: _mxfp4_round(a.swapaxes(1, 2)).swapaxes(1, 2).copy() if name.endswith(("gate_up_proj",
                                                                                              "down_proj")) else a
               for name, a in tensors.items()}
    assert any(not np.array_equal(rounded[n], tensors[n]) for n in tensors)
    rounded_dir.mkdir()
    for item in hf_dir.iterdir():
        if item.name != "model.safetensors":
            (rounded_dir / item.name).write_bytes(item.read_bytes())
    save_file(rounded, str(rounded_dir / "model.safetensors"), metadata={"format": "pt"})
    np.testing.assert_allclose(_logits(path), _logits(rounded_dir), atol=1e-5, rtol=0)


def _copy_without(src: Path, dst: Path, arch: str, key: str | None = None, tensor: str | None = None) -> Path:
    """`src` rewritten without one metadata key / one tensor."""
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), arch)
    for name, entry in reader.fields.items():
        if name.startswith(f"{arch}.") and name != key:
            writer.add_key_value(name, entry.contents(), entry.types[0],
                                 entry.types[-1] if entry.types[0] == gguf.GGUFValueType.ARRAY else None)
    for item in reader.tensors:
        if item.name != tensor:
            writer.add_tensor(item.name, np.asarray(item.data).reshape(tuple(reversed(item.shape))))
    return finish_gguf(writer, dst)


def test_missing_key_or_tensor_and_kept_quantization_are_refused(tmp_path):
    hf_dir = tmp_path / "hf"
    make_tiny_checkpoint("deepseek_v3", hf_dir)
    path = write_deepseek_gguf(tmp_path / "full.gguf", hf_dir)
    with pytest.raises(ModelSourceError, match="--quantization gguf .* not supported for GGUF architecture deepseek2"):
        quant_runner(path, "gguf")
    no_rank = _copy_without(path, tmp_path / "no_rank.gguf", "deepseek2", key="deepseek2.attention.kv_lora_rank")
    with pytest.raises(ModelSourceError, match="lacks deepseek2.attention.kv_lora_rank"):
        read_gguf_config(str(no_rank))
    no_v_b = _copy_without(path, tmp_path / "no_v_b.gguf", "deepseek2", tensor="blk.2.attn_v_b.weight")
    with pytest.raises(ModelSourceError, match="blk.2 has only attn_k_b of its kv_b tensors"):
        dict(iter_gguf_tensors(str(no_v_b)))


def test_gpt_oss_swiglu_clamp_key_is_read(tmp_path):
    hf_dir = tmp_path / "hf"
    make_tiny_checkpoint("gpt_oss", hf_dir)
    config = AutoConfig.from_pretrained(hf_dir)
    path = tmp_path / "clamp.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    _common_keys(writer, config, config.num_key_value_heads)
    writer.add_expert_count(4)
    writer.add_expert_used_count(2)
    writer.add_sliding_window(5)
    writer.add_swiglu_clamp_exp([0.5] * config.num_hidden_layers)
    writer.add_uint32("gpt-oss.attention.sliding_window_pattern", 3)
    writer.add_tensor("token_embd.weight", np.zeros((config.vocab_size, config.hidden_size), np.float32))
    read = read_gguf_config(str(finish_gguf(writer, path)))
    assert read.swiglu_limit == 0.5
    assert read.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]


@pytest.mark.parametrize("model", ["gpt-oss-20b", "deepseek-v3"])
def test_published_shapes_give_the_same_spec(tmp_path, model):
    """The published gpt-oss-20b and DeepSeek-V3 configs (aot/model_configs.py) through GGUF metadata written as the
    converter would give the spec their config.json gives (sizes, layer kinds, routing, rope tables, scales)."""
    from vllm_jax.aot.model_configs import MODELS, write_config
    from vllm_jax.models.registry import resolve_architecture

    config = AutoConfig.from_pretrained(write_config(tmp_path / "hf", MODELS[model]))
    path = tmp_path / "meta.gguf"
    arch = "gpt-oss" if model == "gpt-oss-20b" else "deepseek2"
    writer = (gpt_oss_keys if arch == "gpt-oss" else deepseek_keys)(gguf.GGUFWriter(str(path), arch), config)
    # the config reads an untied head and attention biases off the tensors present: one-value stand-ins
    for name in ("output.weight", "blk.0.attn_q.bias") if arch == "gpt-oss" else ("output.weight",):
        writer.add_tensor(name, np.zeros(1, np.float32))
    read = read_gguf_config(str(finish_gguf(writer, path)))
    assert resolve_architecture(read, 4096)[1] == resolve_architecture(config, 4096)[1]
