"""The package's front door: vLLM's import line works, `import vllm_jax` stays light, start-up logging is quiet
about other libraries and says how much warm-up is left."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

import vllm_jax


def test_vllm_import_line_works_and_import_vllm_jax_loads_no_jax():
    code = ("import sys, vllm_jax\n"
            "heavy = sorted(m for m in ('jax', 'flax', 'transformers', 'torch') if m in sys.modules)\n"
            "assert not heavy, heavy\n"
            "from vllm_jax import LLM, SamplingParams, EngineArgs, RequestOutput, CompletionOutput, AsyncLLM\n"
            "assert LLM.__module__ == 'vllm_jax.llm' and 'jax' in sys.modules\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'NotAThing'"):
        vllm_jax.NotAThing  # noqa: B018
    with pytest.raises(ImportError):
        exec("from vllm_jax import NotAThing")
    assert "LLM" in dir(vllm_jax) and "SamplingParams" in vllm_jax.__all__


def _jax_start_log(setup: str) -> str:
    """stderr of a process that sets up logging, then starts jax with its platform probe (no JAX_PLATFORMS)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = f"import logging\n{setup}\nimport jax\njax.devices()\nlogging.getLogger('vllm_jax.x').info('ours')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_cli_logging_shows_our_info_lines_but_not_jax_backend_probe():
    loud = _jax_start_log("logging.basicConfig(level=logging.INFO)")  # how the CLI used to set it up
    if "Unable to initialize backend" not in loud:
        pytest.skip("jax logs no backend probe on this machine")
    quiet = _jax_start_log("from vllm_jax.logger import configure_logging; configure_logging(root=True)")
    assert "Unable to initialize backend" not in quiet and "ours" in quiet, quiet


def test_warmup_progress_lines_say_how_many_programs_remain(caplog):
    from vllm_jax.worker.compilation import WarmupProgress

    caplog.set_level(logging.INFO, logger="vllm_jax")
    report = WarmupProgress(3, bar=False)
    report.INTERVAL_S = 0.0
    for _ in range(3):
        report.start("forward T=2 S=2")
        report.done()
    lines = [r.getMessage() for r in caplog.records]
    assert any("1/3 programs ready, 2 to go" in line for line in lines), lines
    assert any("2/3 programs ready, 1 to go" in line for line in lines), lines
