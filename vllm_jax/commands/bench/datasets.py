"""The prompts a benchmark sends, as vLLM's `--dataset-name` makes them: `random` (exact token lengths) and
`sharegpt` (the first human turn of each conversation in a local `--dataset-path` JSON file).

`random`: a seeded stream of random words is tokenized once; each prompt is a window of that many token ids,
its length drawn uniformly from [input_len * (1 - ratio), input_len * (1 + ratio)] (vLLM's
`--random-range-ratio`), and so is its output length. `sharegpt`: prompts and reference answers are tokenized
to get their lengths; like vLLM, pairs with a prompt or answer under 4 tokens, a prompt over 1024 or a total
over 2048 are skipped. The tokenizer is whoever runs the model: the server's /tokenize for `bench serve`, the
engine's for the offline benchmarks.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

Tokenize = Callable[[str], list[int]]


@dataclass
class SampleRequest:
    prompt: str | list[int]  # token ids for a random prompt (exact length), text for a ShareGPT one
    prompt_len: int
    expected_output_len: int


def _lengths(rng: random.Random, mean: int, ratio: float, count: int) -> list[int]:
    low, high = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return [rng.randint(low, high) for _ in range(count)]


def random_requests(tokenize: Tokenize, *, num: int, input_len: int, output_len: int, range_ratio: float,
                    seed: int) -> list[SampleRequest]:
    """`num` prompts of random token windows (see the module's docstring)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1); got {range_ratio}")
    rng = random.Random(seed)
    inputs = _lengths(rng, input_len, range_ratio, num)
    outputs = _lengths(rng, output_len, range_ratio, num)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(max(inputs) * 2 + 256)]
    tokens = tokenize(" ".join(words))
    if len(tokens) < max(inputs):
        raise ValueError(f"the random text tokenized to only {len(tokens)} tokens; lower --random-input-len")
    requests = []
    for n_in, n_out in zip(inputs, outputs):
        start = rng.randrange(0, len(tokens) - n_in + 1)
        requests.append(SampleRequest(tokens[start:start + n_in], n_in, n_out))
    return requests


def sharegpt_requests(tokenize: Tokenize, *, path: str, num: int, output_len: int | None,
                      seed: int) -> list[SampleRequest]:
    """`num` first turns of the file's conversations, in a seeded random order."""
    with open(path, encoding="utf-8") as f:
        conversations = [c.get("conversations") or c.get("conversation") or [] for c in json.load(f)]
    pairs = [(c[0]["value"], c[1]["value"]) for c in conversations if len(c) >= 2]
    random.Random(seed).shuffle(pairs)
    requests = []
    for prompt, answer in pairs:
        if len(requests) == num:
            break
        n_in = len(tokenize(prompt))
        n_out = output_len or len(tokenize(answer))
        if n_in < 4 or n_out < 4 or n_in > 1024 or n_in + n_out > 2048:
            continue
        requests.append(SampleRequest(prompt, n_in, n_out))
    if len(requests) < num:
        raise ValueError(f"{path} has only {len(requests)} usable conversations for --num-prompts {num}")
    return requests


def sample_requests(ns: argparse.Namespace, tokenize: Tokenize) -> list[SampleRequest]:
    """The requests `--dataset-name` asks for, from the flags every benchmark shares."""
    if ns.dataset_name == "random":
        return random_requests(tokenize, num=ns.num_prompts, input_len=ns.random_input_len,
                               output_len=ns.random_output_len, range_ratio=ns.random_range_ratio, seed=ns.seed)
    if ns.dataset_path is None:
        raise ValueError("--dataset-name sharegpt needs --dataset-path (a local ShareGPT JSON file)")
    return sharegpt_requests(tokenize, path=ns.dataset_path, num=ns.num_prompts, output_len=ns.sharegpt_output_len,
                             seed=ns.seed)


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset-name", default="random", choices=["random", "sharegpt"],
                        help="where the prompts come from")
    parser.add_argument("--dataset-path", default=None, help="the local ShareGPT JSON file (sharegpt)")
    parser.add_argument("--num-prompts", type=int, default=1000, help="requests to send")
    parser.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens per random request")
    parser.add_argument("--random-output-len", type=int, default=128, help="output tokens per random request")
    parser.add_argument("--random-range-ratio", type=float, default=0.0,
                        help="lengths drawn from [len * (1 - r), len * (1 + r)]")
    parser.add_argument("--sharegpt-output-len", type=int, default=None,
                        help="output tokens per ShareGPT request (default: its reference answer's length)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the dataset and the arrival times")
