"""DeepSeek-V2 / V3 (MLA, grouped routing, shared experts, dense first layers) against transformers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.parity import assert_logits_match_over_two_chunked_steps, load_forward, ragged_sequences
from tests.helpers.tiny_models import make_tiny_checkpoint

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}


@pytest.mark.parametrize("arch, overrides", [("deepseek_v3", {}), ("deepseek_v2", {}),
                                             ("deepseek_v3", {"rope_interleave": False, "rope_scaling": YARN})])
def test_logits_match_transformers_on_ragged_chunked_batches(arch, overrides, tmp_path):
    """V3 (q LoRA, sigmoid + bias routing), V2 (plain q_proj, group-limited greedy) and V3 with the rotate-half
    rope layout and YaRN (frequencies, and mscale in the softmax scale): every computed position's logits within 1e-4 of
    transformers' over two chunked steps."""
    hf = make_tiny_checkpoint(arch, tmp_path, **overrides)
    spec = load_forward(tmp_path)[0]
    assert spec.architecture == hf.config.architectures[0]
    assert spec.rope_interleave == (overrides.get("rope_interleave", True))
    assert spec.kv_cache_heads == 1 and spec.kv_cache_width == 128  # 32 + 8, padded to 128 lanes
    assert spec.moe_layers[0] is False and all(spec.moe_layers[1:])
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences())


def test_logits_match_transformers_with_unrolled_layers(tmp_path):
    """V3's Python loop over per-layer arrays (--no-scan-layers, the GPU's default)."""
    hf = make_tiny_checkpoint("deepseek_v3", tmp_path)
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences(), layers="unrolled")


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_deepseek_v3")
    return path, make_tiny_checkpoint("deepseek_v3", path, seed=3)


def test_engine_greedy_prefix_caching_preemption_and_kv_layout(v3):
    """Through LLM.generate with a small cache and 16-token steps (chunked prefill, preemption): 32 greedy tokens
    identical to transformers; a shared 40-token prefix hits the prefix cache without changing outputs; the cache
    is one latent row per token, sized as such."""
    from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy
    from vllm_jax import LLM, SamplingParams
    from vllm_jax.worker.kv_cache import spec_bytes_per_block

    path, hf = v3
    llm = LLM(str(path), max_model_len=64, num_gpu_blocks_override=14, block_size=8, max_num_seqs=8,
              max_num_batched_tokens=16, min_token_bucket=16, min_seq_bucket=8)  # one bucket: one forward compiles
    runner = llm.llm_engine.runner
    assert runner.kv_cache.shape == (3, 14, 8, 1, 128)  # 32 + 8 padded to 128 lanes
    assert spec_bytes_per_block(runner.spec, 8, "float32") == 3 * 8 * 128 * 4
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 30, 1, 20)]
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 32) for p in prompts]
    assert llm.llm_engine.scheduler.num_preemptions_total > 0
    shared = rng.integers(3, VOCAB_SIZE, 40).tolist()
    family = [shared + rng.integers(3, VOCAB_SIZE, 5).tolist() for _ in range(3)]
    manager = llm.llm_engine.kv_cache_manager
    hits = manager.prefix_cache_hits
    short = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate(family, short, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 8) for p in family]
    assert manager.prefix_cache_hits > hits


def _routing_case(arch: str, **overrides):
    """(our spec, transformers' router module with random weights and bias, hidden states [40, 64])."""
    import torch

    from tests.helpers.tiny_models import MLA_ARCHS
    from vllm_jax.model.mla_spec import mla_spec_from_hf_config

    config_cls, model_cls, extra = MLA_ARCHS[arch]
    config = config_cls(**{**extra, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 320,
                           "intermediate_size": 128, **overrides})
    config.architectures = [model_cls.__name__]
    module = __import__(model_cls.__module__, fromlist=["x"])
    router_cls = getattr(module, model_cls.__name__.replace("ForCausalLM", "TopkRouter"))
    torch.manual_seed(0)
    router = router_cls(config)
    with torch.no_grad():
        router.weight.normal_(0, 0.3)
        if hasattr(router, "e_score_correction_bias"):
            router.e_score_correction_bias.normal_(0, 0.1)
    return mla_spec_from_hf_config(config), router, torch.randn(40, 64)


@pytest.mark.parametrize("arch, overrides", [
    ("deepseek_v3", {}), ("deepseek_v3", {"norm_topk_prob": False, "n_group": 1, "topk_group": 1}),
    ("deepseek_v2", {}), ("deepseek_v2", {"topk_method": "greedy", "num_experts_per_tok": 3}),
])
def test_routing_matches_transformers_routers(arch, overrides):
    import jax.numpy as jnp
    import torch

    from vllm_jax.model.deepseek_routing import deepseek_route

    spec, router, x = _routing_case(arch, **overrides)
    with torch.no_grad():
        _, ref_w, ref_ids = router(x)
    bias = getattr(router, "e_score_correction_bias", None)
    weights, ids = deepseek_route(spec, jnp.asarray(x.numpy()), jnp.asarray(router.weight.detach().numpy().T),
                                  None if bias is None else jnp.asarray(bias.numpy()))
    order, ref_order = np.argsort(np.asarray(ids), -1), np.argsort(ref_ids.numpy(), -1)
    ids_sorted = np.take_along_axis(np.asarray(ids), order, -1)
    np.testing.assert_array_equal(ids_sorted, np.take_along_axis(ref_ids.numpy(), ref_order, -1))
    np.testing.assert_allclose(np.take_along_axis(np.asarray(weights), order, -1),
                               np.take_along_axis(ref_w.numpy(), ref_order, -1), rtol=1e-5, atol=1e-6)
    assert len({tuple(row) for row in ids_sorted.tolist()}) >= 8  # the routing really varies


def test_bad_configs_and_options_are_refused_by_name(v3):
    from transformers import AutoConfig

    from vllm_jax import LLM
    from vllm_jax.model.mla_spec import mla_spec_from_hf_config

    path, _ = v3
    config = AutoConfig.from_pretrained(path)
    for key, value, message in (("attention_bias", True, "attention_bias"), ("n_group", 3, "n_group"),
                                ("hidden_act", "gelu", "hidden_act")):
        bad = AutoConfig.from_pretrained(path, **{key: value})
        with pytest.raises(ValueError, match=message):
            mla_spec_from_hf_config(bad)
    assert mla_spec_from_hf_config(config).sm_scale == pytest.approx((16 + 8) ** -0.5)
    with pytest.raises(ValueError, match="quantization"):
        LLM(str(path), quantization="int8", max_model_len=64, num_gpu_blocks_override=16)


def test_softmax_scale_takes_yarn_mscale_as_transformers_does():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    from vllm_jax.model.mla_spec import yarn_softmax_scale

    for rope in ({"rope_type": "default"}, {"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0},
                 {"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": 0.707}, {"rope_type": "yarn", "factor": 4.0}):
        assert yarn_softmax_scale(rope, 192) == pytest.approx(yarn_apply_mscale(rope, 192 ** -0.5), rel=1e-12)
    assert yarn_softmax_scale({"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0}, 192) != 192 ** -0.5


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_pallas_backends_run_their_mla_kernel_with_the_xla_backends_logits(v3, backend):
    """A DeepSeek model built for a Pallas backend (interpret mode on CPU) calls its MLA kernel (a pallas_call in
    the forward, none with xla) and gives the xla backend's logits on a chunked prefill + decode batch."""
    from functools import partial

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tests.helpers.parity import BLOCK_SIZE, MAX_BLOCKS
    from vllm_jax.model.decoder import forward
    from vllm_jax.model.registry import resolve_architecture
    from vllm_jax.model_loader.loader import build_model
    from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
    from vllm_jax.worker.batch import RowChunk, pack_step_inputs

    source = resolve_model_source(str(v3[0]))
    entry, spec = resolve_architecture(load_hf_config(source))
    inputs = pack_step_inputs([RowChunk(list(range(3, 12)), 0, [1, 2, 3]), RowChunk([5, 6], 0, [4])],
                              block_size=BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS, num_tokens_padded=16,
                              num_seqs_padded=4)
    rng = np.random.default_rng(0)  # earlier pages hold latent rows, so the chunks read a context
    kv = jnp.asarray(rng.standard_normal((spec.num_layers, 8, BLOCK_SIZE, 1, spec.kv_cache_width)), jnp.float32)
    logits, kernels = {}, {}
    for name in ("xla", backend):
        model = build_model(entry, spec, "float32", source, attention_backend=name)
        graphdef, params = nnx.split(model)
        fn = jax.jit(partial(forward, graphdef))
        kernels[name] = "vllm_jax_mla_attention" in str(jax.make_jaxpr(fn)(params, kv, inputs))
        logits[name] = np.asarray(fn(params, kv, inputs)[1])
    assert kernels == {"xla": False, backend: True}
    np.testing.assert_allclose(logits[backend], logits["xla"], rtol=0, atol=2e-5)


def test_compile_checks_want_the_mla_kernel_in_an_mla_models_forward():
    """compile-check with a Pallas backend: an MLA model's forward passes with the MLA kernel alone (the latent row
    is written by XLA), fails without it; a copy of the cache still fails."""
    from vllm_jax.aot import checks
    from vllm_jax.aot.compile import CompileReport
    from vllm_jax.aot.results import ProgramResult, TargetResult
    from vllm_jax.worker.kv_budget import KVBudget

    budget = KVBudget(device_bytes=1 << 30, usable_bytes=1 << 29, weight_bytes=1 << 20, temp_bytes=1 << 10,
                      bytes_per_block=1 << 10, num_blocks=1 << 10)
    mla = ("vllm_jax_mla_attention",)
    for temp, names, ok in ((1 << 10, mla, True), (1 << 20, mla, False), (1 << 10, (), False)):
        memory = {"alias_size_in_bytes": 1 << 20, "temp_size_in_bytes": temp}
        report = CompileReport(target="x", ok=True, memory=memory, kernel_names=names)
        program = ProgramResult("forward T=8 S=8", "forward", 8, 8, report)
        result = checks.check(TargetResult("x", attention_backend="pallas_tpu", mla=True, budget=budget,
                                           programs=[program]))
        assert result.ok == ok, result.failures
