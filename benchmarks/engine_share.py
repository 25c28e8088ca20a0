"""Several engines alive in one benchmark process, each with its share of an accelerator.

`--gpu-memory-utilization` is one engine's share of a device, as in vLLM (worker/kv_budget.py), and an engine
refuses to start when what others hold leaves less than its share free. A benchmark that keeps N engines alive
to interleave their runs gives each 1/N of the fraction; on CPU the KV budget is explicit and this changes
nothing.
"""

from __future__ import annotations


def device_share(num_engines: int, utilization: float = 0.9) -> dict[str, float]:
    """LLM(...) keyword arguments for one of `num_engines` engines sharing a device."""
    return {"gpu_memory_utilization": utilization / num_engines}
