"""The pooling runner's configuration: vLLM's `--runner` / `--convert` / `--pooler-config`, resolved once.

`runner="auto"` picks pooling for a `*ForSequenceClassification` checkpoint or a sentence-transformers directory
(`modules.json` with a Pooling module); `convert` names the task (embed, classify, reward). The pooler's settings
come from the checkpoint (sentence-transformers' `1_Pooling/config.json` and Normalize module), then
`--pooler-config` (vLLM's keys) overrides them (docs/architecture/14-pooling.md, "Pooler config").
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from typing import Any

from vllm_jax.utils import json_object_flag

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify", "reward")
POOLING_TYPES = ("LAST", "MEAN", "CLS")
_SEQ_CLS = "ForSequenceClassification"
# sentence-transformers' pooling modes -> vLLM's pooling types (the ones this engine runs)
_ST_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS"}
_POOLER_KEYS = {"pooling_type", "normalize", "dimensions", "activation", "use_activation", "softmax"}


@dataclass(frozen=True)
class PoolerConfig:
    """What the pooling program computes per finished prompt (docs/architecture/14-pooling.md, "Pooler config")."""

    task: str  # embed | classify | reward
    pooling_type: str  # LAST | MEAN | CLS
    normalize: bool  # L2-normalize the (Matryoshka-truncated) vector: embed
    activation: bool  # softmax over the labels (sigmoid for one label): classify
    num_labels: int = 0  # the score head's rows (`score.weight` [num_labels, hidden]); 0: no head
    dimensions: int | None = None  # the default Matryoshka dimensions (vLLM's pooler_config.dimensions)
    is_matryoshka: bool = False  # a request may ask for `dimensions`

    def check_dimensions(self, dimensions: int | None, hidden_size: int) -> None:
        """A request's `dimensions`: a ValueError naming it unless the model is Matryoshka and it fits."""
        if dimensions is None:
            return
        if not self.is_matryoshka:
            raise ValueError("dimensions: this model does not support Matryoshka representation (set "
                             "is_matryoshka or matryoshka_dimensions in its config.json)")
        if self.task != "embed" or not 1 <= dimensions <= hidden_size:
            raise ValueError(f"dimensions must be in [1, {hidden_size}] for an embedding model; got {dimensions}")


def resolve_pooling(runner: str, convert: str, pooler_config: str | dict | None, hf_config: Any,
                    model_dir: str | None) -> tuple[PoolerConfig | None, Any]:
    """(the PoolerConfig or None for the generate runner, the hf_config the model is built from). A
    `*ForSequenceClassification` checkpoint is built as its causal-LM twin with a tied (unused) head: the score
    head is the pooler's, read apart (pooling/device/pooling_step.py, `load_score_head`)."""
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}; got {runner!r}")
    if convert not in CONVERTS:
        raise ValueError(f"convert must be one of {', '.join(CONVERTS)}; got {convert!r}")
    architectures = list(getattr(hf_config, "architectures", None) or [])
    seq_cls = any(a.endswith(_SEQ_CLS) for a in architectures)
    st = sentence_transformers_pooling(model_dir)
    if runner == "auto":
        runner = "pooling" if seq_cls or st is not None or convert not in ("auto", "none") else "generate"
    if runner == "generate":
        if seq_cls:
            raise ValueError(f"runner 'generate': {architectures[0]} is a classifier with no LM head; serve it "
                             "with runner 'pooling'")
        if pooler_config is not None or convert not in ("auto", "none"):
            raise ValueError("pooler_config and convert need runner 'pooling'")
        return None, hf_config
    task = ("classify" if seq_cls else "embed") if convert in ("auto", "none") else convert
    if task == "classify" and not seq_cls:
        raise ValueError(f"convert 'classify' needs a *{_SEQ_CLS} checkpoint (its score.weight head); "
                         f"{architectures or 'this model'} has none")
    overrides = json_object_flag("pooler_config", pooler_config, _POOLER_KEYS) if pooler_config is not None else {}
    pooling_type = str(overrides.get("pooling_type", (st or {}).get("pooling_type", "LAST"))).upper()
    if pooling_type not in POOLING_TYPES:
        raise ValueError(f"pooler_config.pooling_type must be one of {', '.join(POOLING_TYPES)}; got "
                         f"{overrides.get('pooling_type')!r}")
    normalize = overrides.get("normalize", (st or {}).get("normalize", task == "embed"))
    activation = overrides.get("activation", overrides.get("use_activation", overrides.get("softmax",
                                                                                            task == "classify")))
    for key, value in (("normalize", normalize), ("activation", activation)):
        if not isinstance(value, bool):
            raise ValueError(f"pooler_config.{key} must be true or false; got {value!r}")
    dims = overrides.get("dimensions")
    hidden = int(getattr(hf_config, "hidden_size", 0))
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= hidden):
        raise ValueError(f"pooler_config.dimensions must be an integer in [1, {hidden}]; got {dims!r}")
    matryoshka = bool(getattr(hf_config, "is_matryoshka", False) or getattr(hf_config, "matryoshka_dimensions", None))
    num_labels = 0
    if seq_cls and task != "embed":
        num_labels = int(getattr(hf_config, "num_labels", 0) or len(getattr(hf_config, "id2label", None) or {}))
        tokens = getattr(hf_config, "classifier_from_token", None)
        if tokens:  # vLLM's conversion of a causal LM: those tokens' LM-head rows are the labels
            num_labels = 1 if getattr(hf_config, "is_original_qwen3_reranker", False) else len(tokens)
    config = PoolerConfig(task=task, pooling_type=pooling_type, normalize=normalize, activation=activation,
                          num_labels=num_labels, dimensions=dims, is_matryoshka=matryoshka or dims is not None)
    return config, causal_twin(hf_config) if seq_cls else hf_config


def apply_hf_overrides(hf_config: Any, overrides: str | dict | None) -> Any:
    """vLLM's --hf-overrides: a copy of the config with those keys set (e.g. Qwen3-Reranker's conversion:
    architectures, classifier_from_token, is_original_qwen3_reranker)."""
    if overrides is None:
        return hf_config
    overrides = json_object_flag("hf_overrides", overrides)
    config = copy.deepcopy(hf_config)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def causal_twin(hf_config: Any) -> Any:
    """The classifier's config as its causal LM's (`XForSequenceClassification` -> `XForCausalLM`), head tied so
    the model holds no LM head the checkpoint lacks."""
    twin = copy.deepcopy(hf_config)
    twin.architectures = [a.replace(_SEQ_CLS, "ForCausalLM") for a in hf_config.architectures]
    twin.tie_word_embeddings = True
    return twin


def sentence_transformers_pooling(model_dir: str | None) -> dict | None:
    """The pooling a sentence-transformers directory declares (pooling_type, normalize), or None when it is not
    one (no modules.json, or no Pooling module in it)."""
    if not model_dir or not os.path.isfile(os.path.join(model_dir, "modules.json")):
        return None
    with open(os.path.join(model_dir, "modules.json")) as f:
        modules = json.load(f)
    pooling = next((m for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
    if pooling is None:
        return None
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    path = os.path.join(model_dir, pooling.get("path", ""), "config.json")
    settings = {}
    if os.path.isfile(path):
        with open(path) as f:
            settings = json.load(f)
    mode = next((kind for key, kind in _ST_MODES.items() if settings.get(key)), None)
    if mode is None and settings.get("pooling_mode") is not None:
        mode = {"lasttoken": "LAST", "mean": "MEAN", "cls": "CLS"}.get(settings["pooling_mode"])
    if mode is None:
        raise ValueError(f"{path}: the pooling mode is none of last-token, mean or cls, the ones this engine runs")
    return {"pooling_type": mode, "normalize": normalize}


def prefix_caching_allowed(pooler: PoolerConfig | None) -> bool:
    """A cached prefix's tokens are not computed again, so their hidden states never reach the pooler: MEAN and
    CLS need them, so prefix caching is off for those (as in vLLM); LAST reads only the prompt's last token, which
    is always computed (docs/architecture/14-pooling.md, "Prefix caching")."""
    return pooler is None or pooler.pooling_type == "LAST"


def check_pooling_runner(pooler: PoolerConfig | None, args: Any, speculative: Any) -> PoolerConfig | None:
    """What the pooling runner does not combine with: a ValueError naming the flag."""
    if pooler is None:
        return None
    if speculative is not None:
        raise ValueError("speculative_config needs runner 'generate': a pooling model generates no tokens")
    if args.enable_lora:
        raise ValueError("enable_lora is not supported with runner 'pooling' yet")
    if args.async_scheduling:
        raise ValueError("async_scheduling is not used by runner 'pooling' (a prompt's last chunk ends its "
                         "request, so nothing is scheduled ahead); leave it unset")
    return pooler
