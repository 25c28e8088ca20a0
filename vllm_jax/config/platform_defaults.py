"""What a flag left unset becomes on each platform (cpu, tpu, gpu): `EngineArgs.create_config` reads these, nothing
else does."""

from __future__ import annotations

# CPU is for development and CI: small defaults keep warm-up (one compile per bucket pair) short.
CPU_DEFAULT_MAX_NUM_SEQS = 32
CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
ACCEL_DEFAULT_MAX_NUM_SEQS = 256
ACCEL_DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
CPU_MIN_BUCKET = 2
CPU_BUCKET_GROWTH = 4
ACCEL_MIN_TOKEN_BUCKET, ACCEL_MIN_SEQ_BUCKET = 16, 8
ACCEL_BUCKET_GROWTH = 2
# Async scheduling per platform when --async-scheduling is not given (docs/performance.md, "Host overhead per step").
ASYNC_SCHEDULING_DEFAULT = {"cpu": True, "tpu": True, "gpu": True}
# The layer loop per platform when --scan-layers / --no-scan-layers is not given. On GPU, XLA copies each layer's
# weights out of the stacked params before its dots (a dot cannot read a dynamic slice in place; measured on an H200:
# 8 of a Llama-3-8B batch-1 step's 18 ms were those copies), so the GPU runs the unrolled loop over per-layer arrays
# (7.5 ms) at ~3x the compile time per program (docs/decisions.md, "Departures from the first design"). CPU: the
# switched scan over per-layer arrays (model/weight_forms/layer_switch.py: LayerSwitch); TPU: the scan (compiled
# once whatever the depth).
SCAN_LAYERS_DEFAULT = {"cpu": True, "tpu": True, "gpu": False}
# Speculative decoding's disable_by_batch_size when not given: on CPU verifying k more tokens per request costs
# compute it does not have spare beyond a few requests (docs/speculative-decoding.md, "Measurements"); TPU/GPU: vLLM's
# (none).
SPEC_DISABLE_BY_BATCH_SIZE_DEFAULT = {"cpu": 4, "tpu": None, "gpu": None}
CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30  # 1 GiB: never a silent huge allocation on a laptop
