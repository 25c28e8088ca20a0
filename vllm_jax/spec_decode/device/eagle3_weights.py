"""The EAGLE-3 head's params by the tensor names it is published under (yuhuili/EAGLE3-*, and what vLLM's
llama_eagle3.py loads):

    fc.weight                                   [H, 3 * target_hidden]  -> fc           [3 * target_hidden, H]
    midlayer.input_layernorm.weight             [H]                     -> midlayer/input_norm
    midlayer.hidden_norm.weight                 [H]                     -> midlayer/hidden_norm
    midlayer.self_attn.{q,k,v}_proj.weight      [out, 2H]               -> midlayer/{q,k,v}_proj [2H, out]
    midlayer.self_attn.o_proj.weight            [H, q_size]             -> midlayer/o_proj
    midlayer.post_attention_layernorm.weight    [H]                     -> midlayer/post_attention_norm
    midlayer.mlp.{gate,up,down}_proj.weight                             -> midlayer/{gate,up,down}_proj
    norm.weight                                 [H]                     -> final_norm
    lm_head.weight                              [draft_vocab, H]        -> lm_head      [H, draft_vocab]
    embed_tokens.weight (optional)              [vocab, H]              -> embed_tokens
    d2t                                         [draft_vocab] int64     -> d2t (int32 offsets: target = draft + d2t)
    t2d                                         [vocab] bool            (the inverse mask; not read)

Checkpoints written by other trainers name the layer `layers.0.` instead of `midlayer.` (vLLM renames one to
the other); both are read.
"""

from __future__ import annotations

from vllm_jax.model_loader.param_source import ParamSource, single

LAYER_PREFIXES = ("midlayer.", "layers.0.")

# our midlayer param -> (published suffix under the layer prefix, transpose)
MIDLAYER_TENSORS: dict[str, tuple[str, bool]] = {
    "input_norm": ("input_layernorm.weight", False),
    "hidden_norm": ("hidden_norm.weight", False),
    "post_attention_norm": ("post_attention_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
}
D2T, T2D = "d2t", "t2d"


def layer_prefix(names: set[str]) -> str:
    """The checkpoint's name for the head's layer: `midlayer.` (as published) or `layers.0.`."""
    for prefix in LAYER_PREFIXES:
        if any(name.startswith(prefix) for name in names):
            return prefix
    return LAYER_PREFIXES[0]


def eagle3_param_sources(prefix: str = LAYER_PREFIXES[0]) -> dict[tuple[str, ...], ParamSource]:
    """Every param the head may have (embed_tokens only when the checkpoint carries one)."""
    sources = {
        ("fc",): single("fc.weight", transpose=True),
        ("final_norm",): single("norm.weight"),
        ("lm_head",): single("lm_head.weight", transpose=True),
        ("embed_tokens",): single("embed_tokens.weight"),
        ("d2t",): single(D2T),
    }
    for name, (suffix, transpose) in MIDLAYER_TENSORS.items():
        sources[("midlayer", name)] = single(prefix + suffix, transpose)
    return sources
