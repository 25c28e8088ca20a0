"""HF config.json files of well-known shapes, written locally (nothing is downloaded), for compile checks of real
sizes: `python -m vllm_jax.aot.model_configs OUT_DIR [--layers N]` writes Llama-3.1-8B's config, optionally with
fewer layers (a two-layer model has every per-layer shape of the full one and compiles in a fraction of the time).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# meta-llama/Llama-3.1-8B's config.json (the public model card's file), the fields the engine reads.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}


def write_config(directory: str | Path, config: dict | None = None, **overrides) -> Path:
    """`config` (default: Llama-3.1-8B's) with `overrides` as directory/config.json; -> the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**(config or LLAMA3_8B), **overrides}, indent=1) + "\n")
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--layers", type=int, default=LLAMA3_8B["num_hidden_layers"])
    ns = parser.parse_args(argv)
    print(write_config(ns.out_dir, num_hidden_layers=ns.layers) / "config.json")


if __name__ == "__main__":
    main()
