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

from vllm_jax.pallas_kernels.chips import CHIPS, ChipSpec, KiB, current_chip, spec_for_device_kind  # noqa: F401

TARGETS = ("v5e:1x1", "v5e:2x2", "v5e:2x4", "v6e:1x1", "v6e:2x2", "v6e:2x4", "h100", "a100", "h200")  # and "h100:8"...
# "cpu" / "cpu:N": this host's own CPU devices, so the compile checks' plumbing is tested without any plugin. Its
# figures are nominal (no roofline meaning); the engine's CPU config sizes its KV cache explicitly anyway.
HOST_CPU = ChipSpec(name="cpu", platform="cpu", device_kinds=("cpu",), hbm_bytes=16 * 1024 ** 3,
                    hbm_bytes_per_s=50e9, peak_bf16_flops=1e12, sources=("nominal figures for this host's CPU",))
# jax's GPU client takes this share of device memory unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise
# (jax's "GPU memory allocation" docs); what the engine sizes its KV cache from is what the client gives it.
GPU_CLIENT_MEM_FRACTION = 0.75


def available(platform: str) -> str | None:
    """None when compile-only targets of `platform` ("tpu" / "gpu") can be built here, else the reason."""
    try:
        if platform == "tpu":
            import libtpu  # noqa: F401
        else:
            import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError as exc:
        import jax

        v = jax.__version__
        need = (f"jax[tpu] (libtpu) not installed: pip install 'jax[tpu]=={v}'" if platform == "tpu" else
                f"jax-cuda12-plugin and jax-cuda12-pjrt not installed: pip install jax-cuda12-plugin=={v} "
                f"jax-cuda12-pjrt=={v}")
        return f"{need} ({exc})"
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

    @property
    def engine_memory_bytes(self) -> int:
        """One device's memory as a process sees it (the engine's `bytes_limit`): a TPU's HBM; on a GPU the share
        jax's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75)."""
        if self.platform != "gpu":
            return self.spec.hbm_bytes
        fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", GPU_CLIENT_MEM_FRACTION))
        return int(self.spec.hbm_bytes * fraction)

    def mesh(self, shape: tuple[int, ...] | None = None, axis_names: tuple[str, ...] = ("data", "model")):
        """A mesh over the target's devices (default: [1, n] as ("data", "model"), the engine's layout)."""
        import jax
        import numpy as np

        shape = shape or (1, len(self.devices))
        return jax.sharding.Mesh(np.array(self.devices, dtype=object).reshape(shape), axis_names)


@functools.cache
def get_target(name: str) -> Target:
    """Compile-only devices for "v5e:1x1" / "v5e:2x2" / "v5e:2x4" / "v6e:..." / "h100" / "a100" / "h200", a GPU
    with a device count on one host ("h100:8"), or this host's "cpu" / "cpu:N". Raises RuntimeError saying what
    to install when the plugin for the platform is missing."""
    chip, _, shape = name.partition(":")
    if chip == "cpu":
        import jax

        count = int(shape or 1)
        devices = jax.devices("cpu")
        if count > len(devices):
            raise ValueError(f"target {name!r} needs {count} CPU devices; this process has {len(devices)} (set "
                             f"XLA_FLAGS=--xla_force_host_platform_device_count={count})")
        return Target(name=name, spec=HOST_CPU, devices=tuple(devices[:count]))
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
        if not (shape or "1").isdigit() or int(shape or 1) < 1:
            raise ValueError(f"a GPU target is a chip and a device count on one host (h100, h100:8); got {name!r}")
        topo = topologies.get_topology_desc(chip, "cuda", target_config=gpu_target_config(spec),
                                            topology=f"1x1x{int(shape or 1)}")  # slices x hosts x devices
    return Target(name=name if shape or spec.platform == "gpu" else f"{name}:1x1", spec=spec,
                  devices=tuple(topo.devices))
