"""A checkpoint to serve on a machine the embedded default model cannot reach (a lent accelerator takes at most 64
MiB of files along; the default model's GGUF is 98 MB): SmolLM2-135M-Instruct's config and tokenizer, read from
that GGUF here, and random bfloat16 weights made there.

    python benchmarks/serving_checkpoint.py DIR             # here: config.json, tokenizer files (~3.5 MB)
    python benchmarks/serving_checkpoint.py DIR --weights   # there: random weights for DIR's config (transformers)

benchmarks/device_check.sh --serve-model DIR then serves it: the figures are the default model's shapes and
costs, not its answers (docs/accelerators.md, "On an NVIDIA H200").
"""

from __future__ import annotations

import argparse
from pathlib import Path


def write_config_and_tokenizer(out: Path) -> None:
    from transformers import AutoTokenizer

    from vllm_jax.model_loader.source import load_hf_config, resolve_model_source

    source = resolve_model_source(None)  # the embedded default model, as the engine reads it
    gguf = Path(source.path)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = load_hf_config(source)
    config.dtype = "bfloat16"
    tokenizer.save_pretrained(out)
    config.save_pretrained(out)


def write_random_weights(out: Path, seed: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=torch.bfloat16)
    model.save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--weights", action="store_true", help="add random bfloat16 weights to OUT's config")
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args()
    if ns.weights:
        write_random_weights(ns.out, ns.seed)
    else:
        write_config_and_tokenizer(ns.out)
    print(f"wrote {sorted(p.name for p in ns.out.iterdir())} to {ns.out}")


if __name__ == "__main__":
    main()
