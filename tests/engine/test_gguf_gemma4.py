"""GGUF files of Gemma 4 (models/gemma4/gguf.py): a tiny random Gemma 4 text checkpoint
(tests/helpers/gemma4_models.py) is written out as llama.cpp's converter (`Gemma4Model`) would (its tensor names,
norms as they are, layer_scalar as `layer_output_scale`, per-layer KV heads and MLP widths, the sliding flags,
per-type head widths and rope bases, the proportional rope's `rope_freqs` mask, no `attn_v` on k_eq_v layers),
then read back. The config must give the HF config's Gemma4Spec, a float32 GGUF the HF checkpoint's logits
through the engine within 1e-5; what cannot be mapped back is refused by name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoConfig

from tests.helpers.gemma4_models import make_tiny_gemma4
from tests.helpers.gguf_writing import add_tensor, finish_gguf
from tests.helpers.quantized_models import PROMPTS, prompt_logits, quant_runner, relative_error
from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.gguf_file import iter_gguf_tensors, load_gguf_tokenizer, read_gguf_config
from vllm_jax.models.gemma4.spec import gemma4_spec_from_hf_config

GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm",
          "model.embed_tokens_per_layer": "per_layer_token_embd",
          "model.per_layer_model_projection": "per_layer_model_proj",
          "model.per_layer_projection_norm": "per_layer_proj_norm"}
BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
         "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj",
         "post_per_layer_input_norm": "post_norm"}
# the MoE block (enable_moe_block): HF suffix under model.layers.{i}. -> the converter's name, tensors as they are
MOE_BLOCK = {"router.proj.weight": "ffn_gate_inp.weight", "router.scale": "ffn_gate_inp.scale",
             "router.per_expert_scale": "ffn_down_exps.scale", "experts.gate_up_proj": "ffn_gate_up_exps.weight",
             "experts.down_proj": "ffn_down_exps.weight", "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
             "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
             "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight"}
# no PLE, no KV sharing, one KV head count, V projections on the full layers, no final cap, a wider rope share
PLAIN = dict(hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
             attention_k_eq_v=False, num_global_key_value_heads=None, final_logit_softcapping=None,
             rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                 "rope_theta": 50000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})


def write_gemma4_gguf(path: Path, hf_dir: Path, quant: str | None = None,
                      extra: Callable[[gguf.GGUFWriter], None] | None = None,
                      rope_mask: list[float] | None = None, omit: tuple[str, ...] = ()) -> Path:
    """The GGUF llama.cpp's converter writes for this checkpoint (2-D / 3-D weights in `quant` but the router, the
    rest F32); `extra` adds metadata or tensors, `rope_mask` replaces the rope_freqs mask, `omit` leaves out keys
    ("freq_base_swa") or GGUF tensors (by name)."""
    config = AutoConfig.from_pretrained(hf_dir)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    n, types = config.num_hidden_layers, config.layer_types
    swa = [t == "sliding_attention" for t in types]
    full = next(i for i in range(n) if not swa[i])
    local = next(i for i in range(n) if swa[i])
    head_dim, global_head_dim = config.per_layer_config[local].head_dim, config.per_layer_config[full].head_dim
    kv_heads = [config.per_layer_config[i].num_key_value_heads for i in range(n)]
    rope = config.rope_parameters
    writer = gguf.GGUFWriter(str(path), "gemma4")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(n)
    first_shared = n - config.num_kv_shared_layers
    if config.use_double_wide_mlp:  # the converter writes per layer widths only then
        writer.add_feed_forward_length([config.intermediate_size * (1 if i < first_shared else 2) for i in range(n)])
    else:
        writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(kv_heads if len(set(kv_heads)) > 1 else kv_heads[0])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    if "freq_base_swa" not in omit:
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_key_length(global_head_dim)
    writer.add_value_length(global_head_dim)
    writer.add_key_length_swa(head_dim)
    writer.add_value_length_swa(head_dim)
    writer.add_rope_dimension_count(global_head_dim)
    writer.add_rope_dimension_count_swa(head_dim)
    writer.add_sliding_window(config.sliding_window)
    writer.add_sliding_window_pattern(swa)
    if config.final_logit_softcapping:
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    writer.add_shared_kv_layers(config.num_kv_shared_layers)
    writer.add_embedding_length_per_layer_input(config.hidden_size_per_layer_input or 0)
    if config.enable_moe_block:
        writer.add_expert_count(config.num_experts)
        if "expert_used_count" not in omit:
            writer.add_expert_used_count(config.top_k_experts)
        if "expert_feed_forward_length" not in omit:
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    rotated = int(global_head_dim * rope["full_attention"]["partial_rotary_factor"] / 2)
    mask = rope_mask or [1.0] * rotated + [1e30] * (global_head_dim // 2 - rotated)
    writer.add_tensor("rope_freqs.weight", np.array(mask, np.float32))
    if extra is not None:
        extra(writer)
    for name, array in tensors.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        stem, kind = name.rsplit(".", 1)
        if stem in GLOBAL:
            gguf_name = f"{GLOBAL[stem]}.{kind}"
        elif kind == "layer_scalar":
            gguf_name = f"blk.{stem.removeprefix('model.layers.')}.layer_output_scale.weight"
        elif (parts := name.removeprefix("model.layers.").split(".", 1))[1] in MOE_BLOCK:
            gguf_name = f"blk.{parts[0]}.{MOE_BLOCK[parts[1]]}"
        else:
            layer, sub = stem.removeprefix("model.layers.").split(".", 1)
            gguf_name = f"blk.{layer}.{BLOCK[sub]}.{kind}"
        if gguf_name in omit:
            continue
        quantized = array.ndim >= 2 and array.shape[-1] % 32 == 0 and ".ffn_gate_inp." not in gguf_name
        # llama.cpp keeps the rest (and the router) F32
        add_tensor(writer, gguf_name, array, quant if quantized else None)
    return finish_gguf(writer, path)


@pytest.fixture(scope="module", params=["full", "plain"])
def checkpoint(request, tmp_path_factory):
    """(HF dir, its float32 GGUF): the helper's checkpoint (k_eq_v, KV sharing, double-wide MLP, PLE, one global
    KV head) and a plain one without those."""
    tmp = tmp_path_factory.mktemp(f"gemma4_{request.param}")
    make_tiny_gemma4(tmp / "hf", seed=5, **(PLAIN if request.param == "plain" else {}))
    return tmp / "hf", write_gemma4_gguf(tmp / "f32.gguf", tmp / "hf")


def test_config_gives_the_hf_configs_spec(checkpoint):
    hf_dir, path = checkpoint
    got, want = read_gguf_config(str(path)), AutoConfig.from_pretrained(hf_dir)
    assert got.architectures == ["Gemma4ForCausalLM"]
    assert gemma4_spec_from_hf_config(got) == gemma4_spec_from_hf_config(want)
    for key in ("layer_types", "num_kv_shared_layers", "use_double_wide_mlp", "attention_k_eq_v", "sliding_window",
                "hidden_size_per_layer_input", "final_logit_softcapping", "rope_parameters", "tie_word_embeddings",
                "rms_norm_eps", "intermediate_size"):
        assert getattr(got, key) == getattr(want, key), key
    for i in range(want.num_hidden_layers):
        assert got.per_layer_config[i].head_dim == want.per_layer_config[i].head_dim
        assert got.per_layer_config[i].num_key_value_heads == want.per_layer_config[i].num_key_value_heads


def test_f32_tensors_equal_the_hf_tensors(checkpoint):
    """Norms as stored (Gemma 4 scales by w, not 1 + w), layer_scalar and the PLE tensors under their HF names."""
    hf_dir, path = checkpoint
    want = {k: v for k, v in load_file(str(hf_dir / "model.safetensors")).items() if k != "lm_head.weight"}
    got = dict(iter_gguf_tensors(str(path)))
    assert set(got) == set(want)
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_f32_gguf_gives_the_hf_checkpoints_logits(checkpoint):
    hf_dir, path = checkpoint
    reference = prompt_logits(quant_runner(hf_dir, None))
    assert np.abs(reference).max() > 0.1
    np.testing.assert_allclose(prompt_logits(quant_runner(path, None)), reference, atol=1e-5, rtol=0)


def _hf_logits(model) -> np.ndarray:
    """transformers' float32 logits of the last token of each of PROMPTS."""
    with torch.no_grad():
        return np.stack([model(torch.tensor([p])).logits[0, -1].numpy() for p in PROMPTS])


def test_q8_0_gives_the_hf_model_of_its_dequantized_weights_and_keeping_its_blocks_is_refused(tmp_path):
    model = make_tiny_gemma4(tmp_path / "hf", seed=5)
    q8 = write_gemma4_gguf(tmp_path / "q8.gguf", tmp_path / "hf", quant="Q8_0")
    reference = _hf_logits(model)
    dequantized = dict(iter_gguf_tensors(str(q8)))
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name in dequantized:
                tensor.copy_(torch.from_numpy(dequantized[name]))
    want = _hf_logits(model)
    assert relative_error(want, reference) > 1e-3  # really quantized
    np.testing.assert_allclose(prompt_logits(quant_runner(q8, None)), want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"quantization \(gguf\) is not supported for Gemma 4"):
        quant_runner(q8, "gguf")


@pytest.mark.parametrize("extra, message", [
    (lambda w: w.add_tensor("blk.0.ffn_gate_up_exps.weight", np.zeros((2, 4, 64), np.float32)),
     "ffn_gate_up_exps.weight belongs to Gemma 4's MoE block, but the metadata has no gemma4.expert_count"),
    (lambda w: w.add_tensor("v.patch_embd.weight", np.zeros((4, 4), np.float32)), "vision / audio encoder"),
    (lambda w: w.add_expert_count(4), "sets gemma4.expert_count but lacks gemma4.expert_used_count"),
    (lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR) or w.add_rope_scaling_factor(2.0),
     "rope scaling"),
])
def test_what_cannot_be_mapped_back_is_refused_by_name(tmp_path, extra, message):
    make_tiny_gemma4(tmp_path / "hf", seed=5)
    path = str(write_gemma4_gguf(tmp_path / "bad.gguf", tmp_path / "hf", extra=extra))
    with pytest.raises(ModelSourceError, match=message):
        read_gguf_config(path)
        dict(iter_gguf_tensors(path))


def test_a_rope_freqs_tensor_other_than_the_proportional_mask_is_refused(tmp_path):
    make_tiny_gemma4(tmp_path / "hf", seed=5)
    path = write_gemma4_gguf(tmp_path / "bad.gguf", tmp_path / "hf", rope_mask=[1.0] * 4 + [8.0] * 12)
    with pytest.raises(ModelSourceError, match="proportional-rope mask"):
        read_gguf_config(str(path))


def test_keys_llama_cpp_lets_default_take_its_defaults(tmp_path):
    """Without `rope.freq_base_swa` llama.cpp's sliding layers use the full layers' base."""
    make_tiny_gemma4(tmp_path / "hf", seed=5)
    path = write_gemma4_gguf(tmp_path / "g.gguf", tmp_path / "hf", omit=("freq_base_swa",))
    rope = read_gguf_config(str(path)).rope_parameters
    assert rope["sliding_attention"] == {"rope_type": "default", "rope_theta": rope["full_attention"]["rope_theta"]}


def test_gemma4_tokenizer_metadata_gives_a_tokenizer(tmp_path):
    """The converter's tokenizer (`tokenizer.ggml.model` gemma4: tokens, scores, types, merges, BOS added) through
    transformers' GGUF builder: merges apply, bytes fall back, BOS is prepended, the chat template is kept."""
    tokens = (["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)] + list("abcdefghij")
              + ["\u2581", "ab", "\u2581ab"])
    types = [gguf.TokenType.CONTROL] * 4 + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 13
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "gemma4")
    writer.add_tokenizer_model("gemma4")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_token_merges(["a b", "\u2581 ab"])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(True)
    writer.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 4), np.float32))
    finish_gguf(writer, tmp_path / "t.gguf")
    tokenizer = load_gguf_tokenizer(str(tmp_path / "t.gguf"))
    ids = tokenizer.encode("ab ab cz")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<bos>", "ab", "\u2581ab", "\u2581", "c", "<0x7A>"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab ab cz"
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<bos>hi"
