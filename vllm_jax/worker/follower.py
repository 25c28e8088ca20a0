"""A non-leader process of a multi-host engine: the same model and KV shards, no scheduler, no server.

It warms up exactly like process 0 (same calls in the same order) and then runs every step process 0
broadcasts, until process 0 stops it. Started by `vllm-jax serve ... --process-id N` for N > 0.
"""

from __future__ import annotations

import logging

import jax

from vllm_jax.config import EngineArgs, initialize_distributed
from vllm_jax.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def run_worker(args: EngineArgs) -> None:
    initialize_distributed(args)
    config = args.create_config()
    if jax.process_index() == 0:
        raise ValueError("process 0 runs the engine (LLM / serve), not a worker")
    runner = ModelRunner(config)
    runner.warmup(show_progress=False)
    logger.info("worker process %d ready", jax.process_index())
    runner.serve_worker()
    logger.info("worker process %d stopped", jax.process_index())
