"""--compilation-cache-dir: the first engine fills the persistent XLA cache, a restart compiles from it.

Run in subprocesses: jax's cache directory is process-wide configuration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.tiny_models import make_tiny_checkpoint

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """
import json, sys
from vllm_jax.llm import LLM
llm = LLM(sys.argv[1], compilation_cache_dir=sys.argv[2], max_model_len=64, block_size=8,
          num_gpu_blocks_override=32, max_num_seqs=8, max_num_batched_tokens=32)
print(json.dumps({"warmup_s": llm.llm_engine.warmup_seconds}))
"""


def _start(model: Path, cache: Path) -> float:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(cache)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
                                                      "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["warmup_s"]


def test_second_start_reads_programs_from_the_persistent_cache(tmp_path):
    make_tiny_checkpoint("llama", tmp_path / "model")
    cache = tmp_path / "xla_cache"
    cold = _start(tmp_path / "model", cache)
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) >= 5  # forwards and sampler variants were written
    warm = _start(tmp_path / "model", cache)
    assert sorted(p.name for p in cache.iterdir()) == entries  # nothing new to compile
    assert warm < cold
