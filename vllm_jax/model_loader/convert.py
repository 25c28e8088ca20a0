"""`vllm-jax convert MODEL OUT_DIR`: load (dequantize, re-layout, cast) once, save with orbax for fast restarts."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from flax import nnx

from vllm_jax.config import EngineArgs
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.orbax_io import save_converted
from vllm_jax.model_loader.tokenizer import load_tokenizer
from vllm_jax.models.registry import resolve_architecture


def convert(model: str | None, out_dir: str, dtype: str = "auto") -> tuple[Path, float]:
    """Returns the output directory and the seconds spent loading + converting (what a restore saves)."""
    config = EngineArgs(model=model, dtype=dtype).create_config()
    mc = config.model_config
    entry, spec = resolve_architecture(mc.hf_config)
    t0 = time.perf_counter()
    loaded = build_model(entry, spec, mc.dtype, mc.source)
    params = nnx.to_pure_dict(nnx.state(loaded))
    seconds = time.perf_counter() - t0
    out = save_converted(out_dir, params, mc.hf_config, load_tokenizer(mc), mc.dtype)
    generation_config = Path(mc.source.path) / "generation_config.json"
    if mc.source.kind != "gguf" and generation_config.is_file():
        shutil.copy(generation_config, out / "generation_config.json")
    return out, seconds
