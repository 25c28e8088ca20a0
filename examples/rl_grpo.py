"""A tiny GRPO loop beside the engine: rollouts with LLM.generate, a policy-gradient step in JAX with optax on the
same weights, then update_weights (nothing recompiles) with the engine asleep during the update.

    python examples/rl_grpo.py                        # the default model (SmolLM2-135M GGUF), a few iterations
    python examples/rl_grpo.py --model path/to/hf_dir --iterations 10

The reward is verifiable and deliberately simple: the share of completion tokens whose id is even. Each
iteration prints the mean reward and the time split (rollout / update / weight sync). The trainer's forward is a
plain Llama in JAX over the HF-named tensors (Llama-shaped models without rope scaling: SmolLM2, the tests' tiny
Llama); the engine takes the same HF names back (docs/rl.md).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vllm_jax import LLM, SamplingParams
from vllm_jax.worker.weight_update import as_checkpoint


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    eps: float
    tied: bool


def shape_of(hf_config: Any) -> Shape:
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    rope = getattr(hf_config, "rope_parameters", None) or {}  # transformers 5; older configs: rope_theta
    theta = rope.get("rope_theta") or getattr(hf_config, "rope_theta", None) or 10000.0
    return Shape(hf_config.num_hidden_layers, heads, hf_config.num_key_value_heads, head_dim, float(theta),
                 float(hf_config.rms_norm_eps), bool(getattr(hf_config, "tie_word_embeddings", False)))


def initial_weights(llm: LLM) -> dict[str, jax.Array]:
    """The model's HF-named tensors in float32 (the GGUF's dequantized), read as the engine's loader reads them."""
    source = llm.llm_engine.config.model_config.source
    checkpoint = as_checkpoint(source.path)
    return {name: jnp.asarray(checkpoint.read(name, tuple(slice(None) for _ in checkpoint.shape(name))),
                              jnp.float32) for name in sorted(checkpoint.names()) if "rotary_emb" not in name}


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """HF Llama's rotary embedding (rotate_half): x [T, heads, head_dim]."""
    half = x.shape[-1] // 2
    freqs = positions[:, None] / theta ** (jnp.arange(half) / half)
    cos, sin = jnp.cos(freqs)[:, None, :], jnp.sin(freqs)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def token_logprobs(w: dict[str, jax.Array], s: Shape, tokens: jax.Array) -> jax.Array:
    """log p(tokens[t + 1] | tokens[:t + 1]) for one sequence [T] -> [T - 1]."""
    n = tokens.shape[0]
    positions = jnp.arange(n, dtype=jnp.float32)
    mask = jnp.tril(jnp.ones((n, n), bool))
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(s.layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], s.eps)
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, s.heads, s.head_dim), positions, s.rope_theta)
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, s.kv_heads, s.head_dim), positions,
                 s.rope_theta)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, s.kv_heads, s.head_dim)
        k, v = (jnp.repeat(a, s.heads // s.kv_heads, axis=1) for a in (k, v))
        scores = jnp.einsum("qhd,khd->hqk", q, k) / np.sqrt(s.head_dim)
        attn = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
        x = x + jnp.einsum("hqk,khd->qhd", attn, v).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], s.eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (jax.nn.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if s.tied else w["lm_head.weight"]
    logits = rms_norm(x, w["model.norm.weight"], s.eps) @ head.T
    return jnp.take_along_axis(jax.nn.log_softmax(logits[:-1], axis=-1), tokens[1:, None], axis=-1)[:, 0]


def reward(token_ids: list[int]) -> float:
    return float(np.mean([t % 2 == 0 for t in token_ids])) if token_ids else 0.0


@dataclass
class Batch:
    """Rollouts padded to one length, so the trainer's step compiles once: tokens [B, L], the engine's sampled
    logprobs and a completion mask [B, L - 1] (position t scores token t + 1), advantages [B]."""

    tokens: np.ndarray
    old: np.ndarray
    mask: np.ndarray
    advantages: np.ndarray


def make_batch(rows: list[tuple[list[int], list[int], list[float], float]], length: int) -> Batch:
    """rows: (prompt, completion, its logprobs, advantage)."""
    tokens = np.zeros((len(rows), length), np.int32)
    old = np.zeros((len(rows), length - 1), np.float32)
    mask = np.zeros((len(rows), length - 1), np.float32)
    for i, (prompt, completion, logprobs, _) in enumerate(rows):
        seq = prompt + completion
        tokens[i, :len(seq)] = seq
        old[i, len(prompt) - 1:len(seq) - 1] = logprobs
        mask[i, len(prompt) - 1:len(seq) - 1] = 1.0
    return Batch(tokens, old, mask, np.array([r[3] for r in rows], np.float32))


def grpo_loss(w: dict[str, jax.Array], s: Shape, batch: Batch, clip: float) -> jax.Array:
    """GRPO's clipped surrogate, each completion's mean over its tokens, then over completions."""
    new = jax.vmap(lambda t: token_logprobs(w, s, t))(batch.tokens)
    ratio = jnp.exp(new - batch.old)
    adv = batch.advantages[:, None]
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip, 1 + clip) * adv)
    return -jnp.mean(jnp.sum(surrogate * batch.mask, axis=1) / jnp.sum(batch.mask, axis=1))


def run(llm: LLM, *, iterations: int, prompts: list[list[int]], group: int, max_tokens: int, lr: float,
        clip: float = 0.2, seed: int = 0, log=print) -> list[dict]:
    """The loop; returns per iteration its reward, time split, the probe's greedy logprobs after the update and
    the engine's compilation count."""
    engine = llm.llm_engine
    shape = shape_of(engine.config.model_config.hf_config)
    weights = initial_weights(llm)
    optimizer = optax.adam(lr)
    opt_state = optimizer.init(weights)
    grad_fn = jax.jit(jax.grad(lambda w, tokens, old, mask, adv: grpo_loss(w, shape, Batch(tokens, old, mask, adv),
                                                                          clip)))
    length = max(len(p) for p in prompts) + max_tokens
    probe = SamplingParams(temperature=0.0, max_tokens=4, logprobs=0)
    history, gap = [], float("nan")
    for it in range(iterations):
        t0 = time.perf_counter()
        params = SamplingParams(n=group, temperature=1.0, max_tokens=max_tokens, logprobs=0, ignore_eos=True,
                                seed=seed + it)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        rows, rewards = [], []
        for prompt, out in zip(prompts, outputs):
            scores = np.array([reward(list(c.token_ids)) for c in out.outputs])
            advantages = (scores - scores.mean()) / (scores.std() + 1e-4)
            rewards.append(scores.mean())
            for c, adv in zip(out.outputs, advantages):
                logprobs = [d[t].logprob for d, t in zip(c.logprobs, c.token_ids)]
                rows.append((prompt, list(c.token_ids), logprobs, float(adv)))
        batch = make_batch(rows, length)
        if it == 0:  # the trainer's forward must score the rollouts as the engine did
            new = jax.vmap(lambda t, w=weights: token_logprobs(w, shape, t))(batch.tokens)
            gap = float(np.max(np.abs(np.asarray(new) - batch.old) * batch.mask))
            log(f"trainer vs engine logprobs of the first rollouts: max difference {gap:.2e}")
        t1 = time.perf_counter()
        llm.sleep(level=2)  # the engine's weights and KV cache leave the devices while the trainer works
        grads = grad_fn(weights, batch.tokens, batch.old, batch.mask, batch.advantages)
        updates, opt_state = optimizer.update(grads, opt_state, weights)
        weights = optax.apply_updates(weights, updates)
        jax.block_until_ready(weights)
        t2 = time.perf_counter()
        llm.update_weights(weights.items())  # HF names: the engine's loader rules place them
        llm.wake_up()
        t3 = time.perf_counter()
        probed = llm.generate([{"prompt_token_ids": prompts[0]}], probe, use_tqdm=False)[0].outputs[0]
        row = dict(iteration=it, reward=float(np.mean(rewards)), logprob_gap=gap, rollout_s=t1 - t0, update_s=t2 - t1,
                   sync_s=t3 - t2, probe=[d[t].logprob for d, t in zip(probed.logprobs, probed.token_ids)],
                   compilations=engine.runner.num_compilations)
        log(f"iteration {it}: reward {row['reward']:.3f}  rollout {row['rollout_s']:.2f} s  update "
            f"{row['update_s']:.2f} s  weight sync (sleep, update_weights, wake_up) {row['sync_s']:.2f} s")
        history.append(row)
    return history


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF directory or GGUF file (default: the embedded model)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (GRPO's G)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)
    llm = LLM(args.model, max_model_len=128, max_num_seqs=8, enable_sleep_mode=True)
    prompts = [list(llm.get_tokenizer().encode(text)) for text in ("Count: 2, 4,", "Even numbers:")]
    return run(llm, iterations=args.iterations, prompts=prompts, group=args.group, max_tokens=args.max_tokens,
               lr=args.lr)


if __name__ == "__main__":
    main()
