"""The prompts a benchmark sends, as vLLM's `--dataset-name` makes them: `random` (exact token lengths),
`prefix_repetition` (a few shared prefixes, each prompt one of them and its own suffix: prefix caching's load)
and `sharegpt` (the first human turn of each conversation in a local `--dataset-path` JSON file).

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


def _token_windows(tokenize: Tokenize, rng: random.Random, longest: int) -> Callable[[int], list[int]]:
    """A function giving a random window of n token ids from one tokenized stream of random words."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(longest * 2 + 256)]
    tokens = tokenize(" ".join(words))
    if len(tokens) < longest:
        raise ValueError(f"the random text tokenized to only {len(tokens)} tokens; ask for shorter prompts")

    def window(n: int) -> list[int]:
        start = rng.randrange(0, len(tokens) - n + 1)
        return tokens[start:start + n]

    return window


def random_requests(tokenize: Tokenize, *, num: int, input_len: int, output_len: int, range_ratio: float,
                    seed: int) -> list[SampleRequest]:
    """`num` prompts of random token windows (see the module's docstring)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1); got {range_ratio}")
    rng = random.Random(seed)
    inputs = _lengths(rng, input_len, range_ratio, num)
    outputs = _lengths(rng, output_len, range_ratio, num)
    window = _token_windows(tokenize, rng, max(inputs))
    return [SampleRequest(window(n_in), n_in, n_out) for n_in, n_out in zip(inputs, outputs)]


def prefix_repetition_requests(tokenize: Tokenize, *, num: int, prefix_len: int, suffix_len: int,
                               num_prefixes: int, output_len: int, seed: int) -> list[SampleRequest]:
    """`num` prompts, each one of `num_prefixes` shared prefixes and its own suffix, in a shuffled order."""
    rng = random.Random(seed)
    window = _token_windows(tokenize, rng, max(prefix_len, suffix_len))
    prefixes = [window(prefix_len) for _ in range(num_prefixes)]
    requests = [SampleRequest(prefixes[i % num_prefixes] + window(suffix_len), prefix_len + suffix_len, output_len)
                for i in range(num)]
    rng.shuffle(requests)
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
    if ns.dataset_name == "prefix_repetition":
        return prefix_repetition_requests(tokenize, num=ns.num_prompts, prefix_len=ns.prefix_repetition_prefix_len,
                                          suffix_len=ns.prefix_repetition_suffix_len,
                                          num_prefixes=ns.prefix_repetition_num_prefixes,
                                          output_len=ns.prefix_repetition_output_len, seed=ns.seed)
    if ns.dataset_path is None:
        raise ValueError("--dataset-name sharegpt needs --dataset-path (a local ShareGPT JSON file)")
    return sharegpt_requests(tokenize, path=ns.dataset_path, num=ns.num_prompts, output_len=ns.sharegpt_output_len,
                             seed=ns.seed)


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset-name", default="random", choices=["random", "prefix_repetition", "sharegpt"],
                        help="where the prompts come from")
    parser.add_argument("--dataset-path", default=None, help="the local ShareGPT JSON file (sharegpt)")
    parser.add_argument("--num-prompts", type=int, default=1000, help="requests to send")
    parser.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens per random request")
    parser.add_argument("--random-output-len", type=int, default=128, help="output tokens per random request")
    parser.add_argument("--random-range-ratio", type=float, default=0.0,
                        help="lengths drawn from [len * (1 - r), len * (1 + r)]")
    parser.add_argument("--prefix-repetition-prefix-len", type=int, default=256, help="tokens of each shared prefix")
    parser.add_argument("--prefix-repetition-suffix-len", type=int, default=256, help="tokens after the prefix")
    parser.add_argument("--prefix-repetition-num-prefixes", type=int, default=10, help="distinct prefixes")
    parser.add_argument("--prefix-repetition-output-len", type=int, default=128, help="output tokens per request")
    parser.add_argument("--sharegpt-output-len", type=int, default=None,
                        help="output tokens per ShareGPT request (default: its reference answer's length)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the dataset and the arrival times")
