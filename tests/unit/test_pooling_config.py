"""The pooling runner's pure parts: runner / convert / pooler-config resolution (sentence-transformers' files,
*ForSequenceClassification), PoolingParams, score pairing, and the pooler's arithmetic across chunks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from vllm_jax.pooling.config import prefix_caching_allowed, resolve_pooling
from vllm_jax.pooling.device.pooler import PoolInputs, pool
from vllm_jax.pooling_params import PoolingParams, pair_up, truncate_prompt


def _hf(arch: str, **extra):
    return SimpleNamespace(architectures=[arch], hidden_size=8, **extra)


def _st_dir(tmp_path, mode: str, normalize: bool):
    modules = [{"path": "", "type": "sentence_transformers.models.Transformer"},
               {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({mode: True}))
    return str(tmp_path)


def test_auto_runner_reads_sentence_transformers_and_classifiers(tmp_path):
    assert resolve_pooling("auto", "auto", None, _hf("Qwen3ForCausalLM"), None)[0] is None
    st = _st_dir(tmp_path, "pooling_mode_mean_tokens", normalize=False)
    pooler, _ = resolve_pooling("auto", "auto", None, _hf("Qwen3ForCausalLM"), st)
    assert (pooler.task, pooler.pooling_type, pooler.normalize) == ("embed", "MEAN", False)
    assert not prefix_caching_allowed(pooler)
    pooler, hf = resolve_pooling("auto", "auto", None, _hf("LlamaForSequenceClassification", num_labels=3), None)
    assert (pooler.task, pooler.num_labels, pooler.activation, pooler.pooling_type) == ("classify", 3, True, "LAST")
    assert hf.architectures == ["LlamaForCausalLM"] and hf.tie_word_embeddings
    assert prefix_caching_allowed(pooler)


def test_convert_embed_and_pooler_config_overrides():
    pooler, _ = resolve_pooling("pooling", "embed", '{"pooling_type": "cls", "normalize": false, "dimensions": 4}',
                                _hf("LlamaForCausalLM"), None)
    assert (pooler.pooling_type, pooler.normalize, pooler.dimensions, pooler.is_matryoshka) == ("CLS", False, 4, True)


@pytest.mark.parametrize("args, field", [
    (("pooling", "classify", None), "convert 'classify'"),
    (("pooling", "embed", '{"pooling_type": "ALL"}'), "pooler_config.pooling_type"),
    (("pooling", "embed", '{"bogus": 1}'), "pooler_config: unknown keys"),
    (("pooling", "embed", '{"dimensions": 99}'), "pooler_config.dimensions"),
    (("generate", "embed", None), "need runner 'pooling'"),
    (("serve", "auto", None), "runner must be one of"),
])
def test_bad_pooling_flags_name_the_flag(args, field):
    with pytest.raises(ValueError, match=field):
        resolve_pooling(*args, _hf("LlamaForCausalLM"), None)


def test_dimensions_need_a_matryoshka_model():
    pooler, _ = resolve_pooling("pooling", "embed", None, _hf("LlamaForCausalLM"), None)
    with pytest.raises(ValueError, match="^dimensions: this model does not support Matryoshka"):
        pooler.check_dimensions(4, 8)
    pooler, _ = resolve_pooling("pooling", "embed", None, _hf("LlamaForCausalLM", is_matryoshka=True), None)
    pooler.check_dimensions(4, 8)
    with pytest.raises(ValueError, match="dimensions must be in"):
        pooler.check_dimensions(9, 8)


def test_pooling_params_and_pairs():
    assert truncate_prompt(list(range(10)), 3, 64) == [7, 8, 9]
    assert truncate_prompt(list(range(10)), -1, 5) == [6, 7, 8, 9]
    with pytest.raises(ValueError, match="dimensions must be >= 1"):
        PoolingParams(dimensions=0)
    with pytest.raises(ValueError, match="max_tokens 1"):
        PoolingParams(max_tokens=4)
    assert pair_up("q", ["a", "b"]) == (["q", "q"], ["a", "b"])
    with pytest.raises(ValueError, match="1 text with N"):
        pair_up(["a", "b"], ["c", "d", "e"])


@pytest.mark.parametrize("pooling_type", ["MEAN", "CLS", "LAST"])
def test_pooler_carries_mean_and_cls_across_chunks(pooling_type):
    """One 5-token prompt in two chunks (3 then 2 tokens, slot 1) next to a 2-token prompt (slot 0), normalized."""
    rng = np.random.default_rng(0)
    prompt, other = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(2, 4)).astype(np.float32)
    acc = jnp.zeros((3, 4), jnp.float32)

    def step(hidden, rows, firsts, lasts, slots, starts, lens):
        return pool(acc, jnp.asarray(hidden), PoolInputs(
            token_rows=jnp.asarray(rows, jnp.int32), first_index=jnp.asarray(firsts, jnp.int32),
            last_index=jnp.asarray(lasts, jnp.int32), slots=jnp.asarray(slots, jnp.int32),
            starts=jnp.asarray(starts), num_tokens=jnp.asarray(lens, jnp.float32),
            dims=jnp.asarray([4, 4], jnp.int32)), None, pooling_type=pooling_type, normalize=True, activation=False)

    acc, _ = step(np.concatenate([prompt[:3], np.zeros((1, 4), np.float32)]), [0, 0, 0, 2], [0, 3], [2, 3],
                  [1, 2], [True, False], [5, 1])
    acc, pooled = step(np.concatenate([other, prompt[3:]]), [0, 0, 1, 1], [0, 2], [1, 3], [0, 1],
                       [True, False], [2, 5])
    expected = {"MEAN": (prompt.mean(0), other.mean(0)), "CLS": (prompt[0], other[0]),
                "LAST": (prompt[-1], other[-1])}[pooling_type]
    for row, vector in zip((1, 0), expected):
        np.testing.assert_allclose(np.asarray(pooled[row]), vector / np.linalg.norm(vector), rtol=1e-5, atol=1e-6)


def test_the_other_runner_is_refused_by_name():
    """A pooling request on a generate engine (engine and server), and a generation request on a pooling one."""
    from vllm_jax.pooling.requests import check_pooling_request
    from vllm_jax.sampling_params import SamplingParams
    from vllm_jax.server.errors import APIError
    from vllm_jax.server.serving_pooling import _admit

    generate = SimpleNamespace(pooler_config=None, model_config=SimpleNamespace(max_model_len=64))
    with pytest.raises(ValueError, match="generate runner"):
        check_pooling_request(generate, PoolingParams(), [1, 2], 8)
    assert check_pooling_request(generate, SamplingParams(), [1, 2], 8) == [1, 2]
    pooler, _ = resolve_pooling("pooling", "embed", None, _hf("LlamaForCausalLM"), None)
    pooling = SimpleNamespace(pooler_config=pooler, model_config=SimpleNamespace(max_model_len=64))
    with pytest.raises(ValueError, match="runner pooling .convert 'embed'."):
        check_pooling_request(pooling, SamplingParams(), [1, 2], 8)
    ctx = SimpleNamespace(model_name=lambda name: "m", require_ready=lambda: None,
                          engine=SimpleNamespace(config=generate))
    with pytest.raises(APIError, match="generate runner") as err:
        _admit(ctx, None, "embed")
    assert (err.value.status, err.value.param) == (400, "model")


def test_pooling_flags_reach_engine_args():
    from vllm_jax.cli import build_parser
    from vllm_jax.config import engine_args_from_namespace

    ns = build_parser().parse_args(["serve", "m", "--runner", "pooling", "--convert", "embed", "--pooler-config",
                                    '{"pooling_type": "MEAN"}', "--hf-overrides", '{"is_matryoshka": true}'])
    args = engine_args_from_namespace(ns, ns.model)
    assert (args.runner, args.convert) == ("pooling", "embed")
    assert args.pooler_config == '{"pooling_type": "MEAN"}' and args.hf_overrides == '{"is_matryoshka": true}'
