"""The live servers' tiny engine config (tests/helpers/live_server.py, `tiny_engine_args`) as command-line flags,
for the commands that build their own engine (run-batch, bench latency / throughput): with the same config they
load the servers' warm-up programs from the session's compilation cache instead of compiling them again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.live_server import tiny_engine_args

_SIZE_FIELDS = ("max_model_len", "block_size", "num_gpu_blocks_override", "max_num_seqs", "max_num_batched_tokens",
                "min_token_bucket", "min_seq_bucket")


def tiny_engine_flags(checkpoint: Path, **overrides: Any) -> list[str]:
    """`--model CHECKPOINT` and one flag per size field of tiny_engine_args(checkpoint, **overrides)."""
    args = tiny_engine_args(checkpoint, **overrides)
    flags = [f for name in _SIZE_FIELDS for f in ("--" + name.replace("_", "-"), str(getattr(args, name)))]
    return ["--model", str(checkpoint), *flags]
