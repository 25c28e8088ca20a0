"""TP 2 for every registered family from its entry alone (models/registry.py; docs/architecture/16-family-unit.md,
"Testing a family"): the first tiny config of each family, its random checkpoint run through the runner's own forward
at tensor parallelism 1 and 2 on the session's fake CPU devices (tests/conftest.py). The logits agree and TP 2 really
split the weights (each device holds well under all of them), so a registered family's partition rules are checked
without a test module of its own."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tests.helpers.quantized_models import prompt_logits, quant_runner
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.models.registry import FAMILIES

FIRST_TINY = sorted(next(iter(family.tiny_configs)) for family in FAMILIES if family.tiny_configs)


def _bytes_per_device(params) -> tuple[int, int]:
    """(bytes of the params on one device, bytes of all params)."""
    leaves = jax.tree.leaves(params)
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in leaves), sum(leaf.nbytes for leaf in leaves)


@pytest.mark.parametrize("name", FIRST_TINY)
def test_tp2_logits_equal_tp1_and_tp2_splits_the_weights(name, tmp_path):
    make_tiny_checkpoint(name, tmp_path, seed=1, randomize_norms=True)
    tp1 = prompt_logits(quant_runner(tmp_path, None))
    runner = quant_runner(tmp_path, None, tensor_parallel_size=2)
    np.testing.assert_allclose(prompt_logits(runner), tp1, atol=1e-4, rtol=0)
    per_device, total = _bytes_per_device(runner.params)
    assert per_device <= 0.75 * total, per_device / total
