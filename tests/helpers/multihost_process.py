"""One process of a two-process engine on 127.0.0.1 (CPU, gloo): `python -m tests.helpers.multihost_process RANK PORT
MODEL_DIR`. Rank 0 generates and prints the greedy tokens as JSON; rank 1 is a worker."""

from __future__ import annotations

import os

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import sys

from tests.helpers.parallel_workload import ENGINE_ARGS, prompts


def main(rank: int, port: int, model_dir: str) -> None:
    from vllm_jax import LLM, EngineArgs, SamplingParams
    from vllm_jax.worker.follower import run_worker

    dist = dict(tensor_parallel_size=2, distributed_coordinator=f"127.0.0.1:{port}", num_processes=2,
                process_id=rank)
    if rank:
        run_worker(EngineArgs(model=model_dir, **ENGINE_ARGS, **dist))
        return
    llm = LLM(model_dir, **ENGINE_ARGS, **dist)
    outs = llm.generate(prompts(), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    llm.llm_engine.shutdown()
    print(json.dumps([o.outputs[0].token_ids for o in outs]))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
