"""The short causal depthwise convolution in front of a recurrent mixer (gated DeltaNet's q/k/v, Mamba2's x/B/C),
over a ragged batch: each sequence continues from its last K-1 inputs (its conv state) and leaves its new last K-1
inputs behind (docs/architecture/17-state-cache.md, "The step's states")."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vllm_jax.model.ssm.ragged import query_lens, token_sequences


def causal_conv1d(x: jax.Array, weight: jax.Array, bias: jax.Array | None, initial: jax.Array,
                  query_start_loc: jax.Array, num_seqs: jax.Array,
                  activation: str | None = "silu") -> tuple[jax.Array, jax.Array]:
    """x [T, C] -> (y [T, C], final states [S, K-1, C]). `weight` [C, K] (transformers' Conv1d weight without its
    middle axis: column K-1 multiplies the current input), `initial` [S, K-1, C] each sequence's previous K-1
    inputs, oldest first. y[t] = sum_i weight[:, i] * u[t - (K-1) + i] over the sequence's history u, then the
    activation; accumulated in float32."""
    num_tokens, k = x.shape[0], weight.shape[1]
    seq, index = token_sequences(query_start_loc, num_tokens)
    xf, init = x.astype(jnp.float32), initial.astype(jnp.float32)
    y = jnp.zeros(x.shape, jnp.float32)
    for lag in range(k):
        back = index - lag  # the input's index among the sequence's new tokens; < 0: from the conv state
        from_state = init[seq, jnp.clip(k - 1 + back, 0, k - 2)] if k > 1 else xf
        previous = jnp.where((back >= 0)[:, None], xf[jnp.maximum(jnp.arange(num_tokens) - lag, 0)], from_state)
        y = y + previous * weight[:, k - 1 - lag].astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    if activation == "silu":
        y = jax.nn.silu(y)
    elif activation is not None:
        raise ValueError(f"causal_conv1d: activation {activation!r} is not supported (silu or None)")
    return y.astype(x.dtype), final_conv_states(xf, init, query_start_loc, num_seqs).astype(initial.dtype)


def final_conv_states(x: jax.Array, initial: jax.Array, query_start_loc: jax.Array,
                      num_seqs: jax.Array) -> jax.Array:
    """[S, K-1, C]: the last K-1 inputs of each sequence's history (its conv state followed by its new tokens)."""
    width = initial.shape[1]
    lens = query_lens(query_start_loc, num_seqs)  # [S]
    row = jnp.arange(width, dtype=jnp.int32)
    back = lens[:, None] - width + row[None, :]  # [S, K-1]: index among the new tokens; < 0: from the old state
    token = jnp.clip(query_start_loc[:-1, None] + back, 0, x.shape[0] - 1)
    old = jnp.take_along_axis(initial, jnp.clip(lens[:, None] + row[None, :], 0, width - 1)[..., None], axis=1)
    return jnp.where((back >= 0)[..., None], x[token], old)
