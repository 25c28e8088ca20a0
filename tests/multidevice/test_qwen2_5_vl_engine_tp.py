"""The multi-device tests of tests/engine/test_qwen2_5_vl_engine.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import jax

from tests.engine.test_qwen2_5_vl_engine import (
    ARGS,
    _run,
    checkpoint,  # noqa: F401  (a fixture)
    engine,  # noqa: F401  (a fixture)
    llm,  # noqa: F401  (a fixture)
)
from tests.helpers.vl_models import (
    PLACEHOLDER,
    random_image,
)
from vllm_jax import EngineArgs
from vllm_jax.engine.llm_engine import LLMEngine


def test_tp2_equals_tp1(checkpoint, engine):  # noqa: F811
    prompts = [{"prompt": "ab" + PLACEHOLDER + "cd", "multi_modal_data": {"image": random_image(100, 80, 5)}}]
    tp1 = [o.outputs[0].token_ids for o in _run(engine, prompts)]
    tp2 = LLMEngine(EngineArgs(model=str(checkpoint[0]), tensor_parallel_size=2, **ARGS).create_config(),
                    warmup=False)
    assert [o.outputs[0].token_ids for o in _run(tp2, prompts)] == tp1
    qkv = jax.tree.leaves(tp2.runner.params["layers"]["qkv_proj"])[0]  # fused q/k/v (per-layer arrays on CPU)
    assert len(qkv.sharding.device_set) == 2  # the decoder is sharded as Qwen2's
