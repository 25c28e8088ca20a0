"""Images in prompts, side by side with transformers on the same tiny random Qwen2.5-VL (float32, CPU), one run.

    python benchmarks/vision.py [--requests 32] [--max-tokens 32] [--image-size 448] [--output-json F]

Workload: `--requests` prompts, each a short text and one random `--image-size` square image (448: 1024 patches,
256 image tokens), greedy, EOS ignored. This engine: every request added at once (LLM's engine, warm-up excluded),
requests/s over the whole run and each request's time to first token (mean, p50, max). transformers: one
`generate` over the whole batch (the images are one size, so no padding), its requests/s, and its time to first
token as the same batch's `generate` of one token. The model is tiny, so both sides measure overheads (image
processing, the vision tower's attention, scheduling), not matmul throughput; say so when quoting the ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers.vl_models import (
    IMAGE_PAD,
    PLACEHOLDER,
    expand_placeholders,
    image_processor,
    make_vl_checkpoint,
    random_image,
)


def run_engine(path: str, prompts: list[dict], max_tokens: int) -> dict:
    from vllm_jax import LLM, SamplingParams

    llm = LLM(path, max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=2048)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    first: dict[str, float] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id not in first and out.outputs[0].token_ids:
                first[out.request_id] = time.perf_counter() - start
    seconds = time.perf_counter() - start
    ttft = np.array(list(first.values()))
    return {"seconds": seconds, "requests_per_s": len(prompts) / seconds, "ttft_mean_s": float(ttft.mean()),
            "ttft_p50_s": float(np.median(ttft)), "ttft_max_s": float(ttft.max()),
            "warmup_s": engine.warmup_seconds}


def run_transformers(model, token_ids: list[int], images: list, max_tokens: int, max_pixels: int) -> dict:
    def generate(new_tokens: int) -> float:
        start = time.perf_counter()
        processed = image_processor(max_pixels)(images=images, return_tensors="pt")
        grids = [tuple(int(x) for x in g) for g in processed["image_grid_thw"]]
        ids = torch.tensor([expand_placeholders(token_ids, grids[:1])] * len(images))
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=processed["pixel_values"],
                           image_grid_thw=processed["image_grid_thw"], mm_token_type_ids=(ids == IMAGE_PAD).int(),
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
        return time.perf_counter() - start

    ttft = generate(1)
    seconds = generate(max_tokens)
    return {"seconds": seconds, "requests_per_s": len(images) / seconds, "ttft_s": ttft}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--output-json")
    args = parser.parse_args()
    max_pixels = max(args.image_size ** 2, 28 * 28 * 4)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_vl_checkpoint(Path(tmp), seed=0, max_pixels=max_pixels)
        images = [random_image(args.image_size, args.image_size, seed=i) for i in range(args.requests)]
        text = "describe" + PLACEHOLDER + "briefly"
        prompts = [{"prompt": text, "multi_modal_data": {"image": image}} for image in images]
        ours = run_engine(tmp, prompts, args.max_tokens)
        from transformers import PreTrainedTokenizerFast

        token_ids = PreTrainedTokenizerFast.from_pretrained(tmp).encode(text)
        theirs = run_transformers(model, token_ids, images, args.max_tokens, max_pixels)
    result = {"workload": vars(args), "vllm_jax": ours, "transformers": theirs,
              "requests_per_s_ratio": ours["requests_per_s"] / theirs["requests_per_s"],
              "ttft_ratio": theirs["ttft_s"] / ours["ttft_mean_s"]}
    print(f"vllm_jax:     {ours['requests_per_s']:.2f} req/s, TTFT mean {ours['ttft_mean_s']:.3f} s "
          f"(p50 {ours['ttft_p50_s']:.3f}, max {ours['ttft_max_s']:.3f}); warm-up {ours['warmup_s']:.1f} s")
    print(f"transformers: {theirs['requests_per_s']:.2f} req/s, TTFT {theirs['ttft_s']:.3f} s (the whole batch)")
    print(f"ratio: {result['requests_per_s_ratio']:.2f}x requests/s, {result['ttft_ratio']:.2f}x TTFT "
          "(transformers' over ours)")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
