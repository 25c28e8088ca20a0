"""Eagle3Spec: the facts an EAGLE-3 head needs, read once from its config.json (`LlamaForCausalLMEagle3`, as
published with the heads, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, and as vLLM's llama_eagle3.py reads it).

The head's one decoder layer is a Llama layer whose q/k/v take 2 * hidden inputs; its shapes, rope and norm eps
are read the way the target decoder's are (`spec.common_spec_fields`), into a one-layer DecoderSpec, so the
head's attention is the decoder's own code. Its own facts: the draft vocabulary (`draft_vocab_size`, default
the target's), the target's hidden size (`target_hidden_size`, default the head's: `fc` takes 3 of them) and
`norm_before_residual` (the residual is the normed feature instead of the raw one).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from vllm_jax.model.spec import DecoderSpec, common_spec_fields

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class Eagle3Spec:
    layer: DecoderSpec  # the midlayer: hidden_size, heads, head_dim, intermediate_size, rope, rms_norm_eps
    vocab_size: int  # the target's vocabulary (what draft ids map into)
    draft_vocab_size: int  # rows of lm_head and d2t
    target_hidden_size: int  # fc's input is 3 * this
    norm_before_residual: bool = False

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def num_aux_layers(self) -> int:
        """How many target layers' states `fc` combines (EAGLE-3: always 3)."""
        return 3


def eagle3_spec_from_config(config: Any) -> Eagle3Spec:
    """From the head's config (any object with its config.json keys as attributes); a ValueError names any
    key this head cannot run with."""
    architectures = list(getattr(config, "architectures", None) or [])
    if EAGLE3_ARCHITECTURE not in architectures:
        raise ValueError(f"not an EAGLE-3 head config: architectures {architectures or '(none given)'}, "
                         f"expected {EAGLE3_ARCHITECTURE}")
    if getattr(config, "transformer_layer_config", None) is not None:
        raise ValueError("speculators-format EAGLE-3 configs (transformer_layer_config) are not supported yet; "
                         "use the LlamaForCausalLMEagle3 config.json the head was published with")
    num_layers = getattr(config, "num_hidden_layers", None) or 1
    if num_layers != 1:
        raise ValueError(f"num_hidden_layers {num_layers}: only one-layer EAGLE-3 heads (midlayer) are supported")
    eagle = getattr(config, "eagle_config", None) or {}
    if eagle.get("use_aux_hidden_state", True) is False:
        raise ValueError("eagle_config.use_aux_hidden_state false (a head without fc) is not supported")
    for key in ("attention_bias", "mlp_bias"):
        if getattr(config, key, False):
            raise ValueError(f"{key} true is not supported for EAGLE-3 heads")
    common = common_spec_fields(SimpleNamespace(**(vars(config) | {"num_hidden_layers": 1})), EAGLE3_ARCHITECTURE)
    vocab_size = int(config.vocab_size)
    draft_vocab = int(getattr(config, "draft_vocab_size", None) or vocab_size)
    if draft_vocab > vocab_size:
        raise ValueError(f"draft_vocab_size ({draft_vocab}) exceeds vocab_size ({vocab_size})")
    layer = DecoderSpec(**(common | dict(vocab_size=draft_vocab, sliding_windows=(0,))),
                        intermediate_size=int(config.intermediate_size), qkv_bias=False, o_bias=False,
                        mlp_bias=False, qk_norm=False)
    return Eagle3Spec(layer=layer, vocab_size=vocab_size, draft_vocab_size=draft_vocab,
                      target_hidden_size=int(getattr(config, "target_hidden_size", None) or layer.hidden_size),
                      norm_before_residual=bool(getattr(config, "norm_before_residual", False)))

