"""Every `vllm-jax` command, bench's included, documents every flag it takes (--help is the reference a vLLM user
reads), and cli.py stays a dispatcher: each command's parser comes from its own module."""

from __future__ import annotations

import argparse

from vllm_jax.cli import COMMANDS, build_parser

VLLM_COMMANDS = {"serve", "generate", "convert", "compile-check", "run-batch", "chat", "complete", "collect-env",
                 "bench"}
BENCHMARKS = {"serve", "latency", "throughput", "startup", "sweep"}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_and_benchmark_documents_every_flag():
    commands = _subcommands(build_parser())
    assert set(commands) == VLLM_COMMANDS and len(COMMANDS) == len(VLLM_COMMANDS) - 1  # chat registers complete
    benchmarks = _subcommands(commands["bench"])
    assert set(benchmarks) == BENCHMARKS
    parsers = {**commands, **{f"bench {k}": v for k, v in benchmarks.items()}}
    undocumented = {name: [a.option_strings or a.dest for a in p._actions if not a.help and a.dest != "help"]
                    for name, p in parsers.items()}
    assert all(not flags for flags in undocumented.values()), undocumented


def test_bench_takes_vllms_flag_names():
    ns = build_parser().parse_args(["bench", "serve", "--backend", "openai-chat", "--dataset-name", "sharegpt",
                                    "--dataset-path", "sg.json", "--request-rate", "4", "--max-concurrency", "8",
                                    "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99",
                                    "--goodput", "ttft:500", "--save-result", "--result-dir", "out"])
    assert (ns.backend, ns.dataset_name, ns.request_rate, ns.max_concurrency) == ("openai-chat", "sharegpt", 4.0, 8)
    assert ns.save_result and ns.result_dir == "out" and ns.goodput == ["ttft:500"]
    ns = build_parser().parse_args(["bench", "latency", "--input-len", "32", "--batch-size", "4", "--max-model-len",
                                    "8k"])
    assert (ns.input_len, ns.batch_size, ns.max_model_len) == (32, 4, 8000)
