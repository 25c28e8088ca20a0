"""What must hold of a target's compiled programs; each miss is one line of `TargetResult.failures`.

- Every program compiled (a Mosaic / XLA:GPU error, or a kernel plan's refusal, is a failure with its message).
- With a Pallas backend, every forward contains its kernels as Mosaic / Triton custom calls (pallas_gpu: attention
  and the KV write; pallas_tpu: attention, its KV write being an XLA scatter into the lane-dense cache,
  pallas_kernels/kv_write.py): `auto` silently compiling the XLA attention for a TPU must not pass. An MLA model's
  forward must contain the MLA kernel (its latent row is written by an XLA scatter on every backend).
- Memory truth: every forward aliases exactly the KV cache's bytes (the donated cache is updated in place, per
  device under tensor parallelism), and a decode program's temporaries stay far below the cache (a copy of the
  cache would need at least its size).
- The budget holds with the final programs: weights + cache + the largest temporaries within
  --gpu-memory-utilization of the device (the cache was sized from the probe's temporaries).
"""

from __future__ import annotations

from vllm_jax.aot.results import TargetResult
from vllm_jax.attention import attention_backend_for

DECODE_TEMP_SHARE = 0.1  # a decode program's temporaries must stay under this share of the cache
MiB = 1 << 20


def check(result: TargetResult) -> TargetResult:
    """Fill `result.failures` (see the module docstring) and return the result."""
    failures = result.failures
    for program in result.programs:
        report = program.report
        if not report.ok:
            failures.append(f"{program.label}: {first_line(report.error)}")
            continue
        if program.kind != "forward":
            continue
        missing = [k for k in expected_kernels(result) if k not in report.kernel_names]
        if missing:
            failures.append(f"{program.label}: {', '.join(missing)} not in the compiled program "
                            f"(a fallback to XLA ops)")
        if result.budget is not None:
            target_bytes = result.budget.kv_bytes
            if result.target_kv_bytes_per_block:  # a draft model's cache holds the rest of each block
                target_bytes = result.budget.num_blocks * result.target_kv_bytes_per_block
            failures += _memory_truth(program, target_bytes)
    budget = result.budget
    if budget is not None and result.programs and all(p.report.ok for p in result.programs):
        temp = max(p.report.memory.get("temp_size_in_bytes", 0) for p in result.programs)
        if budget.weight_bytes + budget.kv_bytes + temp > budget.usable_bytes:
            failures.append(f"weights + KV cache + the largest temporaries ({temp / MiB:.0f} MiB) exceed "
                            f"{budget.usable_bytes / MiB:.0f} MiB: the probe's temporaries were "
                            f"{budget.temp_bytes / MiB:.0f} MiB")
    return result


def expected_kernels(result: TargetResult) -> tuple[str, ...]:
    """The custom calls every forward of `result` must contain: its backend's (AttentionBackend.kernel_names)."""
    return attention_backend_for(result.attention_backend, result.platform or None).kernel_names(result.mla)


def _memory_truth(program, kv_bytes: int) -> list[str]:
    memory = program.report.memory
    out = []
    alias = memory.get("alias_size_in_bytes", 0)
    if alias != kv_bytes:
        out.append(f"{program.label}: {alias / MiB:.1f} MiB aliased, the KV cache is {kv_bytes / MiB:.1f} MiB "
                   f"(the donated cache is not updated in place)")
    temp = memory.get("temp_size_in_bytes", 0)
    if program.decode and temp >= DECODE_TEMP_SHARE * kv_bytes:
        out.append(f"{program.label}: {temp / MiB:.1f} MiB of temporaries against a {kv_bytes / MiB:.1f} MiB "
                   f"cache (over {DECODE_TEMP_SHARE:.0%}: a copy of the cache?)")
    return out


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""
