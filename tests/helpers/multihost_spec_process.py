"""One process of a two-process engine with speculative decoding on 127.0.0.1 (CPU, gloo):
`python -m tests.helpers.multihost_spec_process RANK PORT MODEL_DIR SPECS_JSON`. Both processes build one engine per
entry of SPECS_JSON ({name: speculative_config}) in turn, tp 2 across them (rank 1 a worker of each); rank 0
prints {name: greedy tokens} as JSON."""

from __future__ import annotations

import os

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import sys

from tests.helpers.parallel_workload import ENGINE_ARGS, prompts


def main(rank: int, port: int, model_dir: str, specs: dict[str, dict]) -> None:
    from vllm_jax import LLM, EngineArgs, SamplingParams
    from vllm_jax.worker.follower import run_worker

    dist = dict(tensor_parallel_size=2, distributed_coordinator=f"127.0.0.1:{port}", num_processes=2,
                process_id=rank)
    tokens = {}
    for name, spec in specs.items():
        if rank:
            run_worker(EngineArgs(model=model_dir, speculative_config=spec, **ENGINE_ARGS, **dist))
            continue
        llm = LLM(model_dir, speculative_config=spec, **ENGINE_ARGS, **dist)
        outs = llm.generate(prompts(), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
                            use_tqdm=False)
        counts = llm.llm_engine.scheduler.spec_decode_counts
        tokens[name] = dict(tokens=[o.outputs[0].token_ids for o in outs], drafted=counts.num_draft_tokens,
                            accepted=counts.num_accepted_tokens)
        llm.llm_engine.shutdown()
    if not rank:
        print(json.dumps(tokens))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))
