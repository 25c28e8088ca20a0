"""The values each engine flag may take, and the checks that refuse the others by the flag's name."""

from __future__ import annotations

DTYPES = ("auto", "float32", "bfloat16", "float16")
# --kv-cache-dtype: the model dtypes, or vLLM's fp8 names for a float8_e4m3fn cache with per-tensor scales
# (pallas_kernels/kv_quant.py). fp8_e5m2 is refused: nothing here is tested with it.
KV_CACHE_DTYPES = (*DTYPES, "fp8", "fp8_e4m3")
KV_CACHE_DTYPE_NAMES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn"}
# int8 / fp8: online weight quantization at load (model/quantization.py), or a pre-quantized checkpoint's scheme;
# compressed-tensors: a pre-quantized checkpoint's own (model_loader/prequantized.py; so is fp8's block format);
# gguf: a GGUF's Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K blocks kept as they are (model/grouped_quant.py)
QUANTIZATIONS = ("int8", "fp8", "compressed-tensors", "gguf")
SCHEDULING_POLICIES = ("fcfs", "priority")
PLATFORMS = ("cpu", "tpu", "gpu")
PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu"}  # lowering names of the gpu platform
BLOCK_SIZES = (8, 16, 32, 64, 128)
NUM_SCHEDULER_STEPS = (1, 2, 4, 8, 16, 32)  # the values --num-scheduler-steps takes (one program per bucket each)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def check_positive(values: dict[str, int | None]) -> None:
    """Each flag given (not None) is a positive integer."""
    for name, value in values.items():
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ValueError(f"{name} must be a positive integer; got {value!r}")


def check_at_least(minimum: int, values: dict[str, int | None]) -> None:
    """Each flag given (not None) is at least `minimum`."""
    for name, value in values.items():
        if value is not None and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}; got {value}")


def resolve_platform(platform: str | None) -> str:
    """The platform the programs are built for: the one asked for (its lowering alias allowed), else jax's."""
    if platform is None:
        import jax

        return jax.default_backend()
    platform = PLATFORM_ALIASES.get(platform, platform)
    check_choice("platform", platform, PLATFORMS)
    return platform
