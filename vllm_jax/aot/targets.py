"""Compile targets without the chips: public spec figures, TPU topologies and GPU target configs.

`CHIPS` holds each chip's public figures (what the kernels size their blocks from and what a roofline needs);
every entry names where its numbers come from. `get_target("v5e:2x2")` / `get_target("h100")` returns compile-only
devices for that chip: jax compiles for them on a host that has none (real XLA:TPU + Mosaic through libtpu,
real XLA:GPU + Triton through the CUDA plugin) and enforces the chip's VMEM / SMEM / shared-memory limits.
Nothing here runs a program.

Needs, for TPU targets, libtpu (`pip install 'jax[tpu]'`, the same jax version) and, for GPU targets,
`jax-cuda12-plugin` + `jax-cuda12-pjrt` at jax's version; `available(platform)` says whether they are there.
libtpu prints warnings about the accelerator type and worker hostnames on a host without a TPU: harmless.
"""

from __future__ import annotations

import dataclasses
import functools
import os

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

TARGETS = ("v5e:1x1", "v5e:2x2", "v5e:2x4", "v6e:1x1", "v6e:2x2", "v6e:2x4", "h100", "a100", "h200")


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


def available(platform: str) -> str | None:
    """None when compile-only targets of `platform` ("tpu" / "gpu") can be built here, else the reason."""
    try:
        if platform == "tpu":
            import libtpu  # noqa: F401
        else:
            import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError as exc:
        need = "jax[tpu] (libtpu)" if platform == "tpu" else "jax-cuda12-plugin and jax-cuda12-pjrt"
        return f"{need} not installed ({exc})"
    return None


def gpu_target_config(spec: ChipSpec) -> str:
    """XLA's GpuTargetConfigProto (text format) for a GPU spec: the device description XLA:GPU and Triton
    compile against (the format of XLA's xla/tools/hlo_opt/gpu_specs/*.txtpb)."""
    major, minor = spec.compute_capability
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: {48 * KiB}
  shared_memory_per_core: {spec.shared_memory_per_sm}
  threads_per_core_limit: 2048
  core_count: {spec.num_sms}
  fpus_per_core: {128 if major >= 9 else 64}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(spec.hbm_bytes_per_s)}
  l2_cache_size: {spec.l2_bytes}
  clock_rate_ghz: {spec.clock_ghz}
  device_memory_size: {spec.hbm_bytes}
  shared_memory_per_block_optin: {spec.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: {spec.registers_per_sm}
  registers_per_block_limit: {spec.registers_per_sm}
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 3 patch: 0 }}
device_description_str: "{spec.device_kinds[0]}"
"""


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # e.g. "v5e:2x2"
    spec: ChipSpec
    devices: tuple  # compile-only jax devices

    @property
    def platform(self) -> str:
        return self.spec.platform

    def mesh(self, shape: tuple[int, ...] | None = None, axis_names: tuple[str, ...] = ("data", "model")):
        """A mesh over the target's devices (default: [1, n] as ("data", "model"), the engine's layout)."""
        import jax
        import numpy as np

        shape = shape or (1, len(self.devices))
        return jax.sharding.Mesh(np.array(self.devices, dtype=object).reshape(shape), axis_names)


@functools.cache
def get_target(name: str) -> Target:
    """Compile-only devices for "v5e:1x1" / "v5e:2x2" / "v5e:2x4" / "v6e:..." / "h100" / "a100" / "h200".
    Raises RuntimeError saying what to install when the plugin for the platform is missing."""
    chip, _, shape = name.partition(":")
    if chip not in CHIPS:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    spec = CHIPS[chip]
    missing = available(spec.platform)
    if missing:
        raise RuntimeError(f"cannot build target {name!r}: {missing}")
    from jax.experimental import topologies

    if spec.platform == "tpu":
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata-server query on a non-TPU host
        # Compile-only use touches no chip: let several processes (tests, a benchmark) load libtpu at once
        # instead of failing on its /tmp/libtpu_lockfile.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        x, y = (int(v) for v in (shape or "1x1").split("x"))
        topo = topologies.get_topology_desc(
            topology_name=f"{spec.topology_prefix}:{x}x{y}", platform="tpu", chip_config_name="default",
            chips_per_host_bounds=(x, y, 1), num_slices=1, wrap=(False, False, False))
    else:
        if shape not in ("", "1", "1x1x1"):
            raise ValueError(f"GPU targets are one device; got {name!r}")
        topo = topologies.get_topology_desc(chip, "cuda", target_config=gpu_target_config(spec), topology="1x1x1")
    return Target(name=name if shape or spec.platform == "gpu" else f"{name}:1x1", spec=spec,
                  devices=tuple(topo.devices))
