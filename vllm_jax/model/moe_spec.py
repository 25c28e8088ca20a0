"""MoeSpec: the facts the MoE decoder building blocks (model/moe.py) need, shared by every family with routed
experts (Mixtral / Qwen3-MoE: models/moe/, DeepSeek, gpt-oss, Gemma 4's block). It extends DecoderSpec, so the
dense decoder's attention code and the runner read the same fields; there `intermediate_size` is the FFN size of
one expert."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_jax.model.spec import DecoderSpec


@dataclass(frozen=True)
class MoeSpec(DecoderSpec):
    num_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool  # renormalize the top-k routing weights to sum 1
    round_router_weights: bool  # cast the top-k weights to the model dtype before use (Qwen3-MoE)
    moe_layers: tuple[bool, ...]  # per layer: True = sparse MoE block, False = dense MLP
    dense_intermediate_size: int  # FFN size of the dense layers (0 when every layer is MoE)

    @property
    def moe_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, moe in enumerate(self.moe_layers) if moe)

    @property
    def dense_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, moe in enumerate(self.moe_layers) if not moe)
