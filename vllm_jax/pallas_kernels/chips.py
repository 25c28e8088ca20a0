"""Each accelerator's public figures (memory sizes and speeds, VMEM / SMEM / shared memory, SM counts), with their
sources: what the kernels size their blocks from (`tpu_plan`, `gpu_plan`) and what a roofline needs. Pure data,
plus `current_chip()`, the chip a program being traced is built for (compile-only targets included: vllm_jax.aot).
"""

from __future__ import annotations

import dataclasses

KiB, MiB = 1024, 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """One chip's public figures. TPU: per TensorCore (v5e and v6e have one per chip). GPU: per device."""

    name: str
    platform: str  # "tpu" or "gpu"
    device_kinds: tuple[str, ...]  # jax's Device.device_kind strings that mean this chip
    hbm_bytes: int
    hbm_bytes_per_s: float
    peak_bf16_flops: float  # dense
    sources: tuple[str, ...]
    # TPU
    vmem_bytes: int = 0
    scoped_vmem_default_bytes: int = 0  # the compiler's scoped-VMEM limit when a kernel sets none
    smem_bytes: int = 0
    topology_prefix: str = ""
    # GPU
    num_sms: int = 0
    shared_memory_per_block_optin: int = 0  # the most one Triton program (CTA) may use
    shared_memory_per_sm: int = 0
    registers_per_sm: int = 0
    l2_bytes: int = 0
    clock_ghz: float = 0.0
    compute_capability: tuple[int, int] = (0, 0)
    memory_clock_khz: int = 0

    def roofline_seconds(self, flops: float, bytes_accessed: float) -> float:
        """Lower bound on run time: compute-bound or HBM-bound, whichever is slower."""
        return max(flops / self.peak_bf16_flops, bytes_accessed / self.hbm_bytes_per_s)


_JAX_TPU_INFO = "jax/_src/pallas/mosaic/tpu_info.py (jax 0.10.2): VMEM and SMEM per core"
_SCOPED = ("scoped VMEM default: the limit in XLA:TPU's RESOURCE_EXHAUSTED message when compiling a kernel "
           "without vmem_limit_bytes for this target (16M on v5e, 32M on v6e)")

CHIPS: dict[str, ChipSpec] = {
    "v5e": ChipSpec(
        name="v5e", platform="tpu", device_kinds=("TPU v5 lite", "TPU v5e"), topology_prefix="v5e",
        hbm_bytes=16 * 1024 ** 3, hbm_bytes_per_s=819e9, peak_bf16_flops=197e12,
        vmem_bytes=128 * MiB, scoped_vmem_default_bytes=16 * MiB, smem_bytes=1 * MiB,
        sources=("Google Cloud TPU docs, 'TPU v5e' system architecture page: 16 GiB HBM2, 819 GB/s, "
                 "197 TFLOP/s bf16", _JAX_TPU_INFO, _SCOPED)),
    "v6e": ChipSpec(
        name="v6e", platform="tpu", device_kinds=("TPU v6 lite", "TPU v6e"), topology_prefix="v6e",
        hbm_bytes=32 * 1024 ** 3, hbm_bytes_per_s=1640e9, peak_bf16_flops=918e12,
        vmem_bytes=128 * MiB, scoped_vmem_default_bytes=32 * MiB, smem_bytes=1 * MiB,
        sources=("Google Cloud TPU docs, 'TPU v6e' system architecture page: 32 GiB HBM, 1640 GB/s, "
                 "918 TFLOP/s bf16", _JAX_TPU_INFO, _SCOPED)),
    "h100": ChipSpec(
        name="h100", platform="gpu", device_kinds=("NVIDIA H100 80GB HBM3", "NVIDIA H100"),
        hbm_bytes=80 * 10 ** 9, hbm_bytes_per_s=3.35e12, peak_bf16_flops=989e12,
        num_sms=132, shared_memory_per_block_optin=227 * KiB, shared_memory_per_sm=228 * KiB,
        registers_per_sm=65536, l2_bytes=50 * MiB, clock_ghz=1.98, compute_capability=(9, 0),
        memory_clock_khz=2619000,
        sources=("NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s bf16 dense",
                 "NVIDIA Hopper tuning guide: 132 SMs, 228 KB shared memory per SM, 227 KB per thread block, "
                 "64K 32-bit registers per SM, 50 MB L2; compute capability 9.0")),
    "h200": ChipSpec(
        name="h200", platform="gpu", device_kinds=("NVIDIA H200",),
        hbm_bytes=141 * 10 ** 9, hbm_bytes_per_s=4.8e12, peak_bf16_flops=989e12,
        num_sms=132, shared_memory_per_block_optin=227 * KiB, shared_memory_per_sm=228 * KiB,
        registers_per_sm=65536, l2_bytes=50 * MiB, clock_ghz=1.98, compute_capability=(9, 0),
        memory_clock_khz=3201000,
        sources=("NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s bf16 dense",
                 "NVIDIA Hopper tuning guide (the H200 has the H100's SM): 132 SMs, 227 KB shared memory per "
                 "block, 64K registers per SM, 50 MB L2; compute capability 9.0")),
    "a100": ChipSpec(
        name="a100", platform="gpu", device_kinds=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100"),
        hbm_bytes=80 * 10 ** 9, hbm_bytes_per_s=2.039e12, peak_bf16_flops=312e12,
        num_sms=108, shared_memory_per_block_optin=163 * KiB, shared_memory_per_sm=164 * KiB,
        registers_per_sm=65536, l2_bytes=40 * MiB, clock_ghz=1.41, compute_capability=(8, 0),
        memory_clock_khz=1593000,
        sources=("NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): 80 GB HBM2e, 2039 GB/s, 312 TFLOP/s bf16 dense",
                 "NVIDIA Ampere tuning guide: 108 SMs, 164 KB shared memory per SM, 163 KB per thread block, "
                 "64K registers per SM, 40 MB L2; compute capability 8.0")),
}

def spec_for_device_kind(device_kind: str) -> ChipSpec | None:
    """The chip behind a jax device_kind string (None for CPU or an unknown chip)."""
    for spec in CHIPS.values():
        if device_kind in spec.device_kinds:
            return spec
    kind = device_kind.lower()
    for spec in CHIPS.values():  # e.g. "NVIDIA H100 PCIe": the SM figures are the family's
        if any(k.lower() in kind for k in spec.device_kinds if k.lower().startswith("nvidia")):
            return spec
    return None


def current_chip() -> ChipSpec | None:
    """The chip a program being traced now is built for: the device of the mesh in context (what
    `jax.set_mesh` / shard_map set, and what vllm_jax.aot sets for a compile-only target), else jax's default
    device. None on CPU."""
    import jax

    abstract = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    if abstract is not None:
        return spec_for_device_kind(abstract.device_kind)
    device = jax.config.jax_default_device
    if device is None or isinstance(device, str):
        device = jax.devices(device)[0] if isinstance(device, str) else jax.devices()[0]
    return spec_for_device_kind(device.device_kind)
