"""Checks that need several devices: the test session has 8 fake CPU devices (tests/conftest.py), so they run
in-process. `run_check(NAME, WORKDIR)` returns one check's result as the JSON-shaped dict the tests read."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np

from tests.helpers.parallel_workload import ENGINE_ARGS, prompts
from tests.helpers.tiny_models import make_tiny_checkpoint


def _greedy(model_dir: str, **args) -> tuple[list[list[int]], object]:
    """Greedy tokens of `prompts()` and the LLMEngine that made them. No warm-up: these checks compare tokens
    and placements, and compiling every bucket on 8 fake devices (interpret-mode kernels worst) dominated their
    time; only the programs this workload runs are compiled."""
    from vllm_jax import EngineArgs, SamplingParams
    from vllm_jax.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineArgs(model=model_dir, **{**ENGINE_ARGS, **args}).create_config(), warmup=False)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    for i, prompt in enumerate(prompts()):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        tokens.update((out.request_id, out.outputs[0].token_ids) for out in engine.step() if out.finished)
    return [tokens[str(i)] for i in range(len(prompts()))], engine


def _layer_spec(layers: dict, name: str) -> list:
    """`_spec_list` of a layer param, or of the fused weight it is part of (q_proj in qkv_proj:
    model/fused_projections.py), whose output columns split the same way."""
    return _spec_list(layers[name] if name in layers else layers["qkv_proj"])


def _fused(layers: dict) -> list[str]:
    return [name for name in ("qkv_proj",) if name in layers]


def _spec_list(value) -> list:
    """A param's PartitionSpec as a list without trailing None (P(None, 'model') == P(None, 'model', None)).
    Layers unstacked into per-layer arrays (CPU) report the stacked view: a leading None for the layer axis."""
    if isinstance(value, tuple):
        return [None] + _spec_list(value[0]) if _spec_list(value[0]) else []
    parts = list(value.sharding.spec)
    while parts and parts[-1] is None:
        parts.pop()
    return parts


def _specs(engine) -> dict[str, list]:
    from flax import nnx

    runner = engine.runner
    state = nnx.to_pure_dict(runner.params)
    specs = {"kv_cache": _spec_list(runner.kv_cache)}
    specs["embed_tokens"] = _spec_list(state["embed_tokens"])
    for name in ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj", "input_norm"):
        specs[name] = _layer_spec(state["layers"], name)
    specs["fused"] = _fused(state["layers"])
    return specs


def check_tensor_parallel(workdir: Path) -> dict:
    """Greedy tokens for TP 1/2/4 (llama: 4 q heads, 2 kv heads, so TP=4 replicates KV) and TP 1/2 (qwen3),
    the param shardings, which checkpoint slices each device read, and the start-up errors."""
    from vllm_jax.model_loader import safetensors_checkpoint as checkpoint

    result: dict = {}
    llama = workdir / "llama"
    make_tiny_checkpoint("llama", llama, seed=1)
    reads: list[tuple[str, list]] = []
    original_read = checkpoint.SafetensorsCheckpoint.read

    def recording_read(self, name, index):
        reads.append((name, [[s.start, s.stop] for s in index]))
        return original_read(self, name, index)

    checkpoint.SafetensorsCheckpoint.read = recording_read
    try:
        for tp in (1, 2, 4):
            reads.clear()
            tokens, llm = _greedy(str(llama), tensor_parallel_size=tp)
            result[f"llama_tp{tp}"] = tokens
            result[f"llama_tp{tp}_specs"] = _specs(llm)
            result[f"llama_tp{tp}_q_proj_reads"] = [i for n, i in reads
                                                    if n == "model.layers.0.self_attn.q_proj.weight"]
    finally:
        checkpoint.SafetensorsCheckpoint.read = original_read
    qwen3 = workdir / "qwen3"
    make_tiny_checkpoint("qwen3", qwen3, seed=2)
    for tp in (1, 2):
        result[f"qwen3_tp{tp}"] = _greedy(str(qwen3), tensor_parallel_size=tp)[0]
    for tp in (3, 16):
        try:
            _greedy(str(llama), tensor_parallel_size=tp)
            result[f"error_tp{tp}"] = None
        except ValueError as exc:
            result[f"error_tp{tp}"] = str(exc)
    return result


def check_pallas_tensor_parallel(workdir: Path) -> dict:
    """Greedy tokens through each Pallas kernel (interpret mode) for the tiny Llama (2 KV heads: split at tp 2,
    replicated at tp 4): the TPU kernel at TP 1 and 4, the GPU kernel at TP 1 and 2 (the attention-level checks,
    tests/helpers/kernel_sharding_checks.py, cover both layouts for both kernels; interpret-mode engines are the
    slowest part of the suite); which primitives each TP forward traces to (the kernel inside shard_map,
    not a GSPMD-partitioned kernel), the MoE model's too; and a KV-head layout the kernels cannot split (6 KV
    heads, tp 4) refused at start-up under a Pallas backend, accepted under xla."""
    from vllm_jax import EngineArgs
    from vllm_jax.worker.model_runner import ModelRunner

    result: dict = {}
    llama = workdir / "llama"
    make_tiny_checkpoint("llama", llama, seed=1)
    for backend, tps in (("pallas_tpu", (1, 4)), ("pallas_gpu", (1, 2))):
        for tp in tps:
            tokens, engine = _greedy(str(llama), tensor_parallel_size=tp, attention_backend=backend)
            result[f"{backend}_tp{tp}"] = tokens
            result[f"{backend}_tp{tp}_traced"] = _forward_primitives(engine.runner)
    moe = workdir / "qwen3_moe"
    make_tiny_checkpoint("qwen3_moe", moe, seed=5)
    args = EngineArgs(model=str(moe), tensor_parallel_size=2, attention_backend="pallas_tpu", **ENGINE_ARGS)
    result["qwen3_moe_tp2_traced"] = _forward_primitives(ModelRunner(args.create_config(), random_weights=True))
    odd = workdir / "kv6"
    make_tiny_checkpoint("llama", odd, seed=2, hidden_size=96, num_attention_heads=12, num_key_value_heads=6)
    for backend in ("pallas_gpu", "xla"):
        args = EngineArgs(model=str(odd), tensor_parallel_size=4, attention_backend=backend, **ENGINE_ARGS)
        try:
            ModelRunner(args.create_config(), random_weights=True)
            result[f"kv6_tp4_{backend}"] = "ok"
        except ValueError as exc:
            result[f"kv6_tp4_{backend}"] = str(exc)
    return result


def _forward_primitives(runner) -> dict[str, bool]:
    """Whether the runner's forward (smallest bucket) traces to a pallas_call and to a shard_map."""
    import jax

    from vllm_jax.model.decoder import forward
    from vllm_jax.worker.batch import pack_step_inputs

    inputs = pack_step_inputs([], block_size=runner.block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                              num_tokens_padded=runner.token_buckets[0],
                              num_seqs_padded=runner.seq_bucket(runner.token_buckets[0]))
    graphdef = runner.device.graphdef
    text = str(jax.make_jaxpr(lambda p, c, i: forward(graphdef, p, c, i))(runner.params, runner.kv_cache, inputs))
    return {"pallas_call": "pallas_call" in text, "shard_map": "shard_map" in text}


def check_orbax_restore_into_another_mesh(workdir: Path) -> dict:
    """Convert on one device, restore into a TP=2 mesh: same params, same greedy tokens, sharded placement. And
    into TP=4, which keeps q/k/v separate (the tiny Llama's 2 KV heads): the converted fused q/k/v is split at
    restore (model/fused_projections.py)."""
    import jax
    from flax import nnx

    from vllm_jax.model.fused_projections import qkv_layout
    from vllm_jax.model_loader.convert import convert

    model_dir = workdir / "llama"
    make_tiny_checkpoint("llama", model_dir, seed=4)
    converted, _ = convert(str(model_dir), str(workdir / "converted"))
    direct_tokens, direct = _greedy(str(model_dir))
    restored_tokens, restored = _greedy(str(converted), tensor_parallel_size=2)
    a = nnx.to_pure_dict(direct.runner.params)
    b = nnx.to_pure_dict(restored.runner.params)
    same = all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(_leaves(a), _leaves(b)))
    tp4_tokens, tp4 = _greedy(str(converted), tensor_parallel_size=4)
    c = nnx.to_pure_dict(tp4.runner.params)["layers"]
    layout = qkv_layout(direct.runner.spec)
    split_equal = all(np.array_equal(np.asarray(jax.tree.leaves(c[name])[0]), np.asarray(part))
                      for name, part in zip(layout.parts, layout.split(jax.tree.leaves(a["layers"][layout.name])[0])))
    return {"direct": direct_tokens, "restored_tp2": restored_tokens, "params_equal": same,
            "restored_specs": _specs(restored), "source_kind": restored.config.model_config.source.kind,
            "restored_tp4": tp4_tokens, "tp4_fused": _fused(c), "tp4_parts_equal": split_equal}


def _leaves(tree: dict) -> list:
    import jax

    return jax.tree.leaves(tree)


def check_expert_parallel(workdir: Path) -> dict:
    """Tiny Mixtral and Qwen3-MoE: TP=4 with experts sharded (EP) and without, against one device."""
    from flax import nnx

    result: dict = {}
    for arch in ("mixtral", "qwen3_moe"):
        model_dir = workdir / arch
        make_tiny_checkpoint(arch, model_dir, seed=5)
        result[f"{arch}_tp1"] = _greedy(str(model_dir))[0]
        result[f"{arch}_tp4"] = _greedy(str(model_dir), tensor_parallel_size=4)[0]
        tokens, llm = _greedy(str(model_dir), tensor_parallel_size=4, enable_expert_parallel=True)
        result[f"{arch}_tp4_ep"] = tokens
        experts = nnx.to_pure_dict(llm.runner.params)["layers"]["experts_gate"]
        result[f"{arch}_ep_spec"] = _spec_list(experts)
    return result


def check_gpt_oss_parallel(workdir: Path) -> dict:
    """Tiny gpt-oss (sinks, alternating windows, biased experts): greedy tokens at TP 1, TP 2 (xla: GSPMD; and
    the Pallas TPU kernel in interpret mode: the sinks split with the q heads inside shard_map) and TP 4 with
    expert parallelism; the placements of the sinks and the fused gate_up experts."""
    from flax import nnx

    model_dir = workdir / "gpt_oss"
    make_tiny_checkpoint("gpt_oss", model_dir, seed=5)
    result: dict = {"tp1": _greedy(str(model_dir))[0]}
    tokens, engine = _greedy(str(model_dir), tensor_parallel_size=2)
    layers = nnx.to_pure_dict(engine.runner.params)["layers"]
    result |= {"tp2": tokens, "tp2_sinks_spec": _spec_list(layers["sinks"]),
               "tp2_gate_up_spec": _spec_list(layers["experts_gate_up"])}
    result["tp2_pallas_tpu"] = _greedy(str(model_dir), tensor_parallel_size=2, attention_backend="pallas_tpu")[0]
    tokens, engine = _greedy(str(model_dir), tensor_parallel_size=4, enable_expert_parallel=True)
    layers = nnx.to_pure_dict(engine.runner.params)["layers"]
    result |= {"tp4_ep": tokens, "ep_gate_up_spec": _spec_list(layers["experts_gate_up"]),
               "ep_down_bias_spec": _spec_list(layers["experts_down_bias"])}
    return result


def check_gpt_oss_mxfp4_parallel(workdir: Path) -> dict:
    """Tiny gpt-oss with MXFP4 experts: greedy tokens at TP 1, TP 2 (the fused gate_up's columns split: each device
    reads half the blocks' output rows) and TP 4 with expert parallelism (each device one expert's blocks); the
    row / expert ranges the devices read from the packed tensors."""
    from tests.helpers.mxfp4 import make_mxfp4_checkpoint
    from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint

    make_tiny_checkpoint("gpt_oss", workdir / "float", seed=5, intermediate_size=64)
    model_dir = str(make_mxfp4_checkpoint(workdir / "float", workdir / "mxfp4"))
    reads: list[tuple[int, int]] = []
    original = SafetensorsCheckpoint.read

    def recording_read(self, name, index):
        if name.endswith("gate_up_proj_blocks"):
            experts, rows = (tuple(index) + (slice(None),) * 2)[:2]
            shape = self.shape(name)
            reads.append((len(range(*experts.indices(shape[0]))), len(range(*rows.indices(shape[1])))))
        return original(self, name, index)

    result: dict = {"tp1": _greedy(model_dir)[0]}
    SafetensorsCheckpoint.read = recording_read
    try:
        reads.clear()
        result["tp2"] = _greedy(model_dir, tensor_parallel_size=2)[0]
        result["tp2_reads"] = sorted(set(reads))
        reads.clear()
        result["tp4_ep"] = _greedy(model_dir, tensor_parallel_size=4, enable_expert_parallel=True)[0]
        result["ep_reads"] = sorted(set(reads))
    finally:
        SafetensorsCheckpoint.read = original
    return result


def check_mla_tensor_parallel(workdir: Path) -> dict:
    """Tiny DeepSeek-V3 (4 heads, one latent KV row): greedy tokens at TP 1 and at TP 2 with expert parallelism
    (one engine for both splits, to keep the check short), and the TP 2 shardings (heads split, latent cache
    replicated, experts split)."""
    from flax import nnx

    model_dir = workdir / "deepseek_v3"
    make_tiny_checkpoint("deepseek_v3", model_dir, seed=5)
    result: dict = {"tp1": _greedy(str(model_dir))[0]}
    tokens, engine = _greedy(str(model_dir), tensor_parallel_size=2, enable_expert_parallel=True)
    result["tp2_ep"] = tokens
    layers = nnx.to_pure_dict(engine.runner.params)["layers"]
    result["specs"] = {name: _spec_list(layers[name]) for name in ("q_b_proj", "kv_b_proj", "o_proj", "kv_a_proj",
                                                                   "shared_gate", "shared_down", "experts_gate")}
    result["specs"]["kv_cache"] = _spec_list(engine.runner.kv_cache)
    return result


def check_data_parallel(workdir: Path) -> dict:
    """DP=2 x TP=2 on 4 devices answering concurrent requests, against one engine on one device."""
    import asyncio

    from vllm_jax import EngineArgs, SamplingParams
    from vllm_jax.engine.data_parallel import DataParallelAsyncLLM
    from vllm_jax.sampling_params import RequestOutputKind

    model_dir = workdir / "llama"
    make_tiny_checkpoint("llama", model_dir, seed=8)
    single = _greedy(str(model_dir))[0]
    engine = DataParallelAsyncLLM.from_engine_args(
        EngineArgs(model=str(model_dir), tensor_parallel_size=2, data_parallel_size=2, **ENGINE_ARGS))
    engine.start()
    engine.wait_until_ready(600)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)

    async def one(i: int, prompt: list[int]) -> list[int]:
        final = None
        async for out in engine.generate(prompt, params, f"req-{i}"):
            final = out
        return final.outputs[0].token_ids

    async def run_all() -> list[list[int]]:
        results = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts() * 2)))
        await engine.shutdown()
        return results

    outputs = asyncio.run(run_all())
    devices = [sorted(d.id for d in r.llm_engine.runner.mesh.devices.flat) for r in engine.replicas]
    return {"single": single, "dp": outputs, "served": engine.requests_per_replica, "replica_devices": devices}


def check_quantized_tensor_parallel(workdir: Path) -> dict:
    """int8 (W8A8 on CPU) logits of one prefill step at TP 2 (the test compares them with its own TP 1 run) of the
    model in WORKDIR/llama (made when missing), and where TP 2 put the scales."""
    from flax import nnx

    from tests.helpers.quantized_models import make_quant_checkpoint, prompt_logits, quant_runner

    model_dir = workdir / "llama"
    if not model_dir.is_dir():
        make_quant_checkpoint(model_dir)
    runner = quant_runner(model_dir, "int8", tensor_parallel_size=2)
    result: dict = {"tp2": prompt_logits(runner).tolist()}
    layers = nnx.to_pure_dict(runner.params)["layers"]
    result["specs"] = {name: _spec_list(layers[name]) for name in
                       ("q_proj", "q_proj_scale", "k_proj_scale", "gate_proj_scale", "o_proj", "o_proj_scale",
                        "down_proj_scale")}
    state = nnx.to_pure_dict(runner.params)
    result["specs"].update({name: _spec_list(state[name]) for name in ("embed_tokens", "embed_tokens_scale")})
    result["dtypes"] = {name: str(layers[name][0].dtype) for name in ("q_proj", "q_proj_scale")}
    return result


def check_gguf_kept_tensor_parallel(workdir: Path) -> dict:
    """--quantization gguf logits of one prefill step at TP 2 of WORKDIR/q4_1.gguf (the test writes it and
    compares with its own TP 1 run), and where TP 2 put the values, scales and mins."""
    from flax import nnx

    from tests.helpers.quantized_models import prompt_logits, quant_runner

    runner = quant_runner(workdir / "q4_1.gguf", "gguf", tensor_parallel_size=2)
    state = nnx.to_pure_dict(runner.params)
    layers = state["layers"]
    names = ("q_proj", "q_proj_scale", "q_proj_min", "o_proj", "o_proj_scale", "down_proj_min")
    specs = {name: _spec_list(layers[name]) for name in names}
    specs.update({name: _spec_list(state[name]) for name in ("embed_tokens", "embed_tokens_scale")})
    return {"tp2": prompt_logits(runner).tolist(), "specs": specs}


def check_prequantized_tensor_parallel(workdir: Path) -> dict:
    """Logits of one prefill step at TP 2 of the block-fp8 checkpoint WORKDIR/fp8_block (written by the test), and
    where TP 2 put its values and grouped scales."""
    from flax import nnx

    from tests.helpers.quantized_models import prompt_logits, quant_runner

    runner = quant_runner(workdir / "fp8_block", None, tensor_parallel_size=2)
    layers = nnx.to_pure_dict(runner.params)["layers"]
    names = ("q_proj", "q_proj_scale", "k_proj_scale", "o_proj", "o_proj_scale", "down_proj", "down_proj_scale")
    return {"tp2": prompt_logits(runner).tolist(), "specs": {name: _spec_list(layers[name]) for name in names},
            "dtypes": {name: str(layers[name][0].dtype) for name in ("q_proj", "down_proj_scale")}}


def check_gemma_tensor_parallel(workdir: Path) -> dict:
    """Greedy tokens at TP 2 (xla backend: 2 KV heads split) of the tiny Gemma 2 and Gemma 3 checkpoints the test
    wrote to WORKDIR/gemma2 and WORKDIR/gemma3 (it compares them with transformers' tokens, which are TP 1's), and
    where TP 2 put q_proj and a feed-forward norm."""
    from flax import nnx

    result: dict = {}
    for arch in ("gemma2", "gemma3"):
        tokens, engine = _greedy(str(workdir / arch), tensor_parallel_size=2)
        result[f"{arch}_tp2"] = tokens
        layers = nnx.to_pure_dict(engine.runner.params)["layers"]
        result[f"{arch}_specs"] = {name: _layer_spec(layers, name) for name in ("q_proj", "pre_feedforward_norm")}
        result[f"{arch}_fused"] = _fused(layers)
    return result


def check_gemma4_tensor_parallel(workdir: Path) -> dict:
    """Greedy tokens at TP 2 of the tiny Gemma 4 checkpoint the test wrote to WORKDIR/gemma4 (compared with
    transformers' tokens, which are TP 1's: tests/engine/test_gemma4.py), and where TP 2 put the KV cache (its rows
    split: the layers' cache views are reshapes GSPMD partitions)."""
    from flax import nnx

    tokens, engine = _greedy(str(workdir / "gemma4"), tensor_parallel_size=2)
    params = nnx.to_pure_dict(engine.runner.params)
    specs = {name: _spec_list(params["layers"][name]) for name in ("sliding_q_proj", "full_down_proj",
                                                                   "sliding_per_layer_input_gate", "full_k_proj")}
    specs["embed_tokens_per_layer"] = _spec_list(params["embed_tokens_per_layer"])
    return {"tp2": tokens, "cache_spec": _spec_list(engine.runner.kv_cache), "specs": specs}


def check_gemma4_moe_parallel(workdir: Path) -> dict:
    """Greedy tokens of the tiny MoE Gemma 4 the test wrote to WORKDIR/gemma4_moe at TP 2 (experts split on their
    width) and TP 2 with expert parallelism (split on the expert axis), and where each put the experts."""
    from flax import nnx

    result: dict = {}
    for key, args in (("tp2", {}), ("tp2_ep", {"enable_expert_parallel": True})):
        tokens, engine = _greedy(str(workdir / "gemma4_moe"), tensor_parallel_size=2, **args)
        layers = nnx.to_pure_dict(engine.runner.params)["layers"]
        result[key] = tokens
        result["tp2_specs" if key == "tp2" else "ep_specs"] = {
            name: _spec_list(layers[name]) for name in ("sliding_experts_gate", "full_shared_experts_down",
                                                        "sliding_router")}
    return result


def check_family_tensor_parallel(family: str, workdir: Path) -> dict:
    """Logits of one prefill step of a tiny `family` model (tests/helpers/family_models.py) at TP 1 and 2, and
    where TP 2 put its linears (Phi-3's q/k/v and gate/up, split from fused tensors at load, shard like Llama's)."""
    from flax import nnx

    from tests.helpers.family_models import make_family_checkpoint
    from tests.helpers.quantized_models import prompt_logits, quant_runner
    from vllm_jax.model_loader import safetensors_checkpoint as checkpoint

    make_family_checkpoint(family, workdir / family, seed=1)
    result: dict = {"tp1": prompt_logits(quant_runner(workdir / family, None)).tolist()}
    rows: set[tuple[int, int]] = set()  # rows of layer 0's fused qkv_proj (Phi-3) each read asked for at TP 2
    original_read = checkpoint.SafetensorsCheckpoint.read

    def recording_read(self, name, index):
        if name == "model.layers.0.self_attn.qkv_proj.weight":
            rows.add((index[0].start, index[0].stop))
        return original_read(self, name, index)

    checkpoint.SafetensorsCheckpoint.read = recording_read
    try:
        runner = quant_runner(workdir / family, None, tensor_parallel_size=2)
    finally:
        checkpoint.SafetensorsCheckpoint.read = original_read
    result["tp2"] = prompt_logits(runner).tolist()
    result["tp2_qkv_rows"] = sorted(rows)
    layers = nnx.to_pure_dict(runner.params)["layers"]
    result["specs"] = {name: _layer_spec(layers, name) for name in ("q_proj", "k_proj", "v_proj", "gate_proj",
                                                                    "up_proj", "o_proj", "down_proj")}
    result["fused"] = _fused(layers)
    return result


CHECKS = {"gemma_tensor_parallel": check_gemma_tensor_parallel, "tensor_parallel": check_tensor_parallel,
          "quantized_tensor_parallel": check_quantized_tensor_parallel,
          "prequantized_tensor_parallel": check_prequantized_tensor_parallel,
          "gguf_kept_tensor_parallel": check_gguf_kept_tensor_parallel, "data_parallel": check_data_parallel,
          "orbax": check_orbax_restore_into_another_mesh, "expert_parallel": check_expert_parallel,
          "pallas_tensor_parallel": check_pallas_tensor_parallel, "gpt_oss_parallel": check_gpt_oss_parallel,
          "gpt_oss_mxfp4_parallel": check_gpt_oss_mxfp4_parallel,
          "mla_tensor_parallel": check_mla_tensor_parallel, "gemma4_tensor_parallel": check_gemma4_tensor_parallel,
          "gemma4_moe_parallel": check_gemma4_moe_parallel}

CHECKS |= {f"{family}_tensor_parallel": partial(check_family_tensor_parallel, family)
           for family in ("granite", "olmo2", "phi3")}


def run_check(name: str, workdir: Path) -> dict:
    """CHECKS[name] on `workdir`, its result round-tripped through JSON: the tests compare lists and strings
    (tuples become lists, specs plain lists), and nothing the check made (engines, arrays) outlives the call."""
    return json.loads(json.dumps(CHECKS[name](Path(workdir))))
