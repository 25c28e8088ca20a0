"""HF config.json files of well-known shapes, written locally (nothing is downloaded), for compile checks of real
sizes: `python -m vllm_jax.aot.model_configs OUT_DIR [--model NAME] [--layers N]` writes one of `MODELS` (default
Llama-3.1-8B), optionally with fewer layers (a two-layer model has every per-layer shape of the full one and
compiles in a fraction of the time). Each family declares its configs in its entry (models/<family>/
configs.py): the fields the engine reads from the public model card's config.json.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_jax.models.registry import family_of, real_configs

MODELS = real_configs()  # name -> HF config dict, every family's (models/<family>/configs.py)
DEFAULT_MODEL = "llama-3.1-8b"


def cut_fields(config: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """What a config cut to `layers` layers changes besides num_hidden_layers (its family's `cut_config`: Gemma's
    layer kinds)."""
    family = family_of(config["architectures"][0])
    return {} if family.cut_config is None else family.cut_config(config, layers)


def write_config(directory: str | Path, config: Mapping[str, Any] | None = None, **overrides) -> Path:
    """`config` (default: Llama-3.1-8B's) with `overrides` as directory/config.json; -> the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = {**(config or MODELS[DEFAULT_MODEL]), **overrides}
    (directory / "config.json").write_text(json.dumps(written, indent=1) + "\n")
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULT_MODEL)
    parser.add_argument("--layers", type=int, default=None, help="default: the model's own")
    ns = parser.parse_args(argv)
    config = MODELS[ns.model]
    layers = ns.layers or config["num_hidden_layers"]
    extra = cut_fields(config, layers)
    print(write_config(ns.out_dir, config, num_hidden_layers=layers, **extra) / "config.json")


if __name__ == "__main__":
    main()
