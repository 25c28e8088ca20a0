"""The runner's forward lowered (not compiled) for an accelerator on this CPU host, as StableHLO text: what a test
reads to see which kernels and loops a chip's program would hold."""

from __future__ import annotations

import jax

from vllm_jax.model.decoder import forward
from vllm_jax.worker.batch import pack_step_inputs


def lowered_forward_text(runner, num_tokens: int, num_seqs: int, platform: str) -> str:
    """The forward of an empty (tokens, sequences) bucket of `runner` lowered for `platform` ("tpu", "cuda")."""
    inputs = pack_step_inputs([], block_size=runner.block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                              num_tokens_padded=num_tokens, num_seqs_padded=num_seqs)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (runner.params, runner.kv_cache, inputs))
    graphdef = runner.device.graphdef
    lowered = jax.jit(lambda p, c, i: forward(graphdef, p, c, i)).trace(*abstract).lower(
        lowering_platforms=(platform,))
    return lowered.as_text()
