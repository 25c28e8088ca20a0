"""The EAGLE-3 head: a tiny random checkpoint under the published names (config.json + safetensors with d2t),
loaded and run over a ragged batch in two chunked steps (the second reads the first's KV from the head's pages),
against an independent dense torch float32 reference; its spec from the config; the d2t helpers; and the
loader's errors, each naming the tensor or key."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import save_file
from transformers import LlamaConfig

from vllm_jax.model.spec import spec_from_hf_config
from vllm_jax.model_loader.source import ModelSourceError
from vllm_jax.spec_decode.device.eagle3_head import (
    draft_to_target_ids,
    eagle3_forward,
    eagle3_kv_cache_shape,
    target_vocab_logits,
)
from vllm_jax.spec_decode.device.eagle3_loader import load_eagle3_head, read_eagle3_spec
from vllm_jax.worker.batch import RowChunk, pack_step_inputs

VOCAB, DRAFT_VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 96, 40, 32, 4, 2, 8, 64
BLOCK_SIZE, MAX_BLOCKS, NUM_BLOCKS = 4, 16, 64
SEQ_LENS, SPLITS = (5, 19, 2, 11), (3, 8, 1, 11)  # the last row has nothing left for the second step
EPS, THETA = 1e-6, 10000.0


def _config(target_hidden: int, norm_before_residual: bool, **extra) -> dict:
    """A config.json as published (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's keys), tiny."""
    return dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_act="silu",
                hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                head_dim=HEAD_DIM, num_hidden_layers=1, rms_norm_eps=EPS, rope_theta=THETA,
                max_position_embeddings=256, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB,
                target_hidden_size=target_hidden, norm_before_residual=norm_before_residual,
                tie_word_embeddings=False, torch_dtype="float32", **extra)


def _tensors(target_hidden: int, own_embedding: bool, seed: int = 0, prefix: str = "midlayer.") -> dict:
    """Random weights under the published names; d2t from a random sorted subset of the target vocabulary."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm():
        return (1.0 + rng.standard_normal(HIDDEN) * 0.1).astype(np.float32)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    t = {"fc.weight": w(HIDDEN, 3 * target_hidden), "norm.weight": norm(), "lm_head.weight": w(DRAFT_VOCAB, HIDDEN),
         f"{prefix}input_layernorm.weight": norm(), f"{prefix}hidden_norm.weight": norm(),
         f"{prefix}post_attention_layernorm.weight": norm(),
         f"{prefix}self_attn.q_proj.weight": w(q, 2 * HIDDEN), f"{prefix}self_attn.k_proj.weight": w(kv, 2 * HIDDEN),
         f"{prefix}self_attn.v_proj.weight": w(kv, 2 * HIDDEN), f"{prefix}self_attn.o_proj.weight": w(HIDDEN, q),
         f"{prefix}mlp.gate_proj.weight": w(FFN, HIDDEN), f"{prefix}mlp.up_proj.weight": w(FFN, HIDDEN),
         f"{prefix}mlp.down_proj.weight": w(HIDDEN, FFN)}
    targets = np.sort(rng.choice(VOCAB, DRAFT_VOCAB, replace=False))
    t["d2t"] = (targets - np.arange(DRAFT_VOCAB)).astype(np.int64)
    t["t2d"] = np.isin(np.arange(VOCAB), targets)
    if own_embedding:
        t["embed_tokens.weight"] = w(VOCAB, HIDDEN, scale=1.0)
    return t


def _write(path: Path, config: dict, tensors: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    return path


# ---- the independent reference: dense causal attention over each whole sequence, torch float32 -------------

def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding (rotate_half) on [n, heads, head_dim]."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
    half = HEAD_DIM // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _reference(t: dict, token_ids: list[int], features: np.ndarray, from_target: bool, embedding: np.ndarray,
               norm_before_residual: bool) -> tuple[np.ndarray, np.ndarray]:
    """One whole sequence -> (pre-norm hidden [n, H], draft logits [n, draft_vocab])."""
    g = {name: torch.from_numpy(np.asarray(v, np.float32)) for name, v in t.items() if v.dtype == np.float32}
    p = "midlayer."
    n = len(token_ids)
    feature = torch.from_numpy(features)
    if from_target:
        feature = feature @ g["fc.weight"].T
    normed = _rms(feature, g[p + "hidden_norm.weight"])
    x = torch.cat([_rms(torch.from_numpy(embedding)[token_ids], g[p + "input_layernorm.weight"]), normed], -1)
    positions = torch.arange(n)
    q = _rope((x @ g[p + "self_attn.q_proj.weight"].T).view(n, HEADS, HEAD_DIM), positions)
    k = _rope((x @ g[p + "self_attn.k_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM), positions)
    v = (x @ g[p + "self_attn.v_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
    k, v = (a.repeat_interleave(HEADS // KV_HEADS, dim=1) for a in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) / HEAD_DIM ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, HEADS * HEAD_DIM)
    hidden = (normed if norm_before_residual else feature) + attn @ g[p + "self_attn.o_proj.weight"].T
    m = _rms(hidden, g[p + "post_attention_layernorm.weight"])
    gate, up = m @ g[p + "mlp.gate_proj.weight"].T, m @ g[p + "mlp.up_proj.weight"].T
    hidden = hidden + (torch.nn.functional.silu(gate) * up) @ g[p + "mlp.down_proj.weight"].T
    logits = _rms(hidden, g["norm.weight"]) @ g["lm_head.weight"].T
    return hidden.numpy(), logits.numpy()


# ---- the head over two chunked ragged steps ----------------------------------------------------------------

@pytest.mark.parametrize("own_embedding,target_hidden,norm_before_residual",
                         [(True, 24, False), (False, HIDDEN, True)])
@pytest.mark.parametrize("from_target", [True, False])
def test_head_matches_dense_reference_over_chunked_ragged_steps(own_embedding, target_hidden, norm_before_residual,
                                                                from_target, tmp_path):
    """Four sequences split into two chunks over two steps: every token's hidden output and each row's last
    token's draft logits match the reference within 1e-4; the fed features are the target's aux states
    (through fc) or the head's own previous outputs (no fc); the embedding is the head's or the target's."""
    tensors = _tensors(target_hidden, own_embedding)
    path = _write(tmp_path / "head", _config(target_hidden, norm_before_residual), tensors)
    head = load_eagle3_head(path, "float32")
    spec = head.spec
    rng = np.random.default_rng(7)
    target_embedding = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    embedding = tensors["embed_tokens.weight"] if own_embedding else target_embedding
    width = 3 * target_hidden if from_target else HIDDEN
    seqs = [rng.integers(0, VOCAB, n).tolist() for n in SEQ_LENS]
    features = [rng.standard_normal((n, width)).astype(np.float32) for n in SEQ_LENS]

    graphdef, state = nnx.split(head)
    run = jax.jit(partial(eagle3_forward, graphdef), static_argnames="from_target", donate_argnums=1)
    kv = jnp.zeros(eagle3_kv_cache_shape(spec, NUM_BLOCKS, BLOCK_SIZE), jnp.float32)
    blocks, next_block = [], 1
    for s in seqs:
        n = -(-len(s) // BLOCK_SIZE)
        blocks.append(list(range(next_block, next_block + n)))
        next_block += n
    hidden_got = [[] for _ in seqs]
    logits_got = {}
    for step in range(2):
        chunks = [(0, c) if step == 0 else (c, len(s)) for s, c in zip(seqs, SPLITS)]
        rows = [RowChunk(s[a:b], a, blk) for s, (a, b), blk in zip(seqs, chunks, blocks)]
        inputs = pack_step_inputs(rows, block_size=BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS, num_tokens_padded=32,
                                  num_seqs_padded=8)
        feats = np.zeros((32, width), np.float32)
        for (a, b), f, start in zip(chunks, features, inputs.query_start_loc):
            feats[start:start + b - a] = f[a:b]
        kv, hidden, logits = run(state, kv, inputs, feats, None if own_embedding else target_embedding,
                                 from_target=from_target)
        assert hidden.shape == (32, HIDDEN) and logits.shape == (8, DRAFT_VOCAB) and logits.dtype == jnp.float32
        for i, ((a, b), start) in enumerate(zip(chunks, inputs.query_start_loc)):
            hidden_got[i].append(np.asarray(hidden)[start:start + b - a])
            if b > a:
                logits_got[(i, b - 1)] = np.asarray(logits)[i]
    for i, seq in enumerate(seqs):
        ref_hidden, ref_logits = _reference(tensors, seq, features[i], from_target, embedding, norm_before_residual)
        np.testing.assert_allclose(np.concatenate(hidden_got[i]), ref_hidden, atol=1e-4, rtol=0)
        for (row, pos), got in logits_got.items():
            if row == i:
                np.testing.assert_allclose(got, ref_logits[pos], atol=1e-4, rtol=0)
    assert np.abs(ref_logits).max() > 0.1, "reference logits too small for a meaningful comparison"


def test_draft_ids_map_to_target_ids_through_d2t(tmp_path):
    tensors = _tensors(HIDDEN, own_embedding=False)
    head = load_eagle3_head(_write(tmp_path / "head", _config(HIDDEN, False), tensors))
    d2t = head.d2t.get_value()
    assert d2t.dtype == jnp.int32
    targets = np.flatnonzero(tensors["t2d"])  # the draft vocabulary, in order
    np.testing.assert_array_equal(draft_to_target_ids(jnp.arange(DRAFT_VOCAB), d2t), targets)
    logits = jnp.asarray(np.random.default_rng(0).standard_normal((3, DRAFT_VOCAB)), jnp.float32)
    full = np.asarray(target_vocab_logits(logits, d2t, VOCAB))
    assert full.shape == (3, VOCAB)
    np.testing.assert_array_equal(full[:, targets], np.asarray(logits))
    assert np.all(np.isneginf(np.delete(full, targets, axis=1)))
    np.testing.assert_array_equal(full.argmax(-1), targets[np.asarray(logits).argmax(-1)])


# ---- the spec and the loader's checks ----------------------------------------------------------------------

def test_spec_reads_the_published_config_keys(tmp_path):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    config = _config(48, True) | {"rope_theta": 500000.0, "rope_scaling": rope}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = read_eagle3_spec(tmp_path)
    layer = spec.layer
    assert (spec.hidden_size, layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.intermediate_size) == \
        (HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN)
    assert (spec.vocab_size, spec.draft_vocab_size, spec.target_hidden_size, spec.norm_before_residual) == \
        (VOCAB, DRAFT_VOCAB, 48, True)
    assert layer.rms_norm_eps == EPS and layer.sliding_windows == (0,)
    # rope as the target decoder reads it (tested against transformers in test_model_parity.py)
    target = spec_from_hf_config(LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                                             num_hidden_layers=1, rope_theta=500000.0, rope_scaling=rope,
                                             architectures=["LlamaForCausalLM"]))
    assert layer.inv_freq == target.inv_freq and layer.rope_attention_scaling == target.rope_attention_scaling
    del config["draft_vocab_size"], config["target_hidden_size"], config["norm_before_residual"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = read_eagle3_spec(tmp_path)
    assert (spec.draft_vocab_size, spec.target_hidden_size, spec.norm_before_residual) == (VOCAB, HIDDEN, False)


@pytest.mark.parametrize("change,message", [
    (dict(num_hidden_layers=2), "only one-layer"),
    (dict(architectures=["LlamaForCausalLM"]), "not an EAGLE-3 head config"),
    (dict(draft_vocab_size=VOCAB + 1), "exceeds vocab_size"),
    (dict(eagle_config={"use_aux_hidden_state": False}), "use_aux_hidden_state"),
])
def test_unsupported_configs_are_refused_by_key(change, message, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_config(HIDDEN, False) | change))
    with pytest.raises(ValueError, match=message):
        read_eagle3_spec(tmp_path)


def _broken(tensors: dict, drop: str | None = None, changed: dict | None = None) -> dict:
    """The tensors without `drop`, with `changed` put in."""
    return {k: v for k, v in tensors.items() if k != drop} | (changed or {})


@pytest.mark.parametrize("edit,message", [
    (lambda t: _broken(t, drop="midlayer.hidden_norm.weight"), r"lacks 1 tensor.*midlayer\.hidden_norm\.weight"),
    (lambda t: _broken(t, changed={"fc.weight": np.zeros((HIDDEN, 2 * HIDDEN), np.float32)}),
     r"'fc\.weight' has shape \(32, 64\) but the config implies \(32, 96\)"),
    (lambda t: _broken(t, drop="d2t"), r"lacks 1 tensor.*d2t"),
    (lambda t: _broken(t, changed={"d2t": np.full(DRAFT_VOCAB, VOCAB, np.int64)}),
     r"'d2t' maps draft id 0 to target id 96"),
    (lambda t: _broken(t, changed={"extra.weight": np.zeros(3, np.float32)}), r"unexpected tensor.*extra\.weight"),
])
def test_a_bad_checkpoint_is_one_error_naming_the_tensor(edit, message, tmp_path):
    path = _write(tmp_path / "head", _config(HIDDEN, False), edit(_tensors(HIDDEN, own_embedding=False)))
    with pytest.raises(ModelSourceError, match=message):
        load_eagle3_head(path)


def test_layers_0_naming_and_a_missing_d2t_with_the_targets_vocabulary_load(tmp_path):
    """Checkpoints naming the layer `layers.0.` load the same; without d2t (draft vocab = target vocab) the
    draft ids are the target ids."""
    tensors = _tensors(HIDDEN, own_embedding=True)
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    head = load_eagle3_head(_write(tmp_path / "a", _config(HIDDEN, False), renamed))
    np.testing.assert_array_equal(np.asarray(head.midlayer.q_proj.get_value()),
                                  tensors["midlayer.self_attn.q_proj.weight"].T)
    same_vocab = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    same_vocab["lm_head.weight"] = np.zeros((VOCAB, HIDDEN), np.float32)
    head = load_eagle3_head(_write(tmp_path / "b", _config(HIDDEN, False) | {"draft_vocab_size": VOCAB}, same_vocab))
    np.testing.assert_array_equal(draft_to_target_ids(jnp.arange(VOCAB), head.d2t.get_value()), np.arange(VOCAB))


def test_head_without_embedding_needs_the_targets(tmp_path):
    head = load_eagle3_head(_write(tmp_path / "head", _config(HIDDEN, False), _tensors(HIDDEN, False)))
    inputs = pack_step_inputs([RowChunk([1, 2], 0, [1])], block_size=BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS,
                              num_tokens_padded=4, num_seqs_padded=2)
    kv = jnp.zeros(eagle3_kv_cache_shape(head.spec, 4, BLOCK_SIZE), jnp.float32)
    feats = jnp.zeros((4, 3 * HIDDEN), jnp.float32)
    with pytest.raises(ValueError, match="pass the target's embedding"):
        head(kv, inputs, feats, from_target=True)
    with pytest.raises(ValueError, match=r"must be \[T, 32\]"):
        head(kv, inputs, feats, from_target=False, embed_tokens=jnp.zeros((VOCAB, HIDDEN)))
