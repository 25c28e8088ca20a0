"""`--attention-backend` -> the backend object, once: the only place in the package that reads a backend's name.

`auto` picks the platform's kernel (pallas_tpu on TPU, pallas_gpu on GPU, xla on CPU). A Pallas backend named
explicitly on CPU runs in Pallas interpret mode, so the whole engine can be tested on CPU through a kernel (slow:
meant for tests with tiny models). Asking for the other accelerator's kernel is an error.

`platform` (default: jax's backend) is the chip the program is built for. A CPU host compiling ahead of time for a
TPU or GPU target (vllm_jax.aot) passes `platform="tpu"` / `"gpu"` to get the real kernel, not interpret mode.
"""

from __future__ import annotations

import jax

from vllm_jax.attention.base import AttentionBackend
from vllm_jax.attention.pallas_gpu import PallasGpuBackend
from vllm_jax.attention.pallas_tpu import PallasTpuBackend
from vllm_jax.attention.xla import XlaBackend

BACKENDS = ("xla", "pallas_tpu", "pallas_gpu")  # what --attention-backend accepts besides auto
_CLASSES: dict[str, type[AttentionBackend]] = {"xla": XlaBackend, "pallas_tpu": PallasTpuBackend,
                                               "pallas_gpu": PallasGpuBackend}
_AUTO = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu", "rocm": "pallas_gpu"}
_NATIVE = {"xla": None, "pallas_tpu": ("tpu",), "pallas_gpu": ("gpu", "cuda", "rocm")}  # None: any platform


def attention_backend_for(name: str = "auto", platform: str | None = None, *, interpret=False) -> AttentionBackend:
    """The backend `name` (auto, xla, pallas_tpu or pallas_gpu) runs on `platform` (default: jax's backend);
    a ValueError for an unknown name or the other accelerator's kernel. `interpret` (tests): force Pallas
    interpret mode (True, or a pltpu.InterpretParams for pallas_tpu)."""
    platform = platform or jax.default_backend()
    if name == "auto":
        name = _AUTO.get(platform, "xla")
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of auto, {', '.join(BACKENDS)}; got {name!r}")
    native = _NATIVE[name]
    if native is not None and platform != "cpu" and platform not in native:
        raise ValueError(f"attention_backend {name!r} does not run on {platform}; use 'auto', 'xla' or "
                         f"{_AUTO.get(platform, 'xla')!r}")
    return _CLASSES[name](platform, interpret)
