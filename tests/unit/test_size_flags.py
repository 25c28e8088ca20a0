"""The size flags read vLLM's human-readable integers: lower-case suffixes count in 1000s, upper-case in 1024s,
a fraction only with a decimal suffix."""

from __future__ import annotations

import argparse

import pytest

from vllm_jax.cli import build_parser
from vllm_jax.config import engine_args_from_namespace, human_readable_int


@pytest.mark.parametrize(("text", "value"), [
    ("512", 512), ("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600), ("4G", 4 * 2**30), ("2m", 2_000_000),
    ("1T", 2**40), (" 8K ", 8192)])
def test_human_readable_int(text, value):
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "abc", "4 G", "4GB"])
def test_human_readable_int_refuses_what_vllm_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int(text)


def test_size_flags_reach_engine_args_and_a_bad_one_is_a_usage_error(capsys):
    ns = build_parser().parse_args(["serve", "--max-model-len", "32k", "--max-num-batched-tokens", "8K",
                                    "--kv-cache-memory-bytes", "4G", "--max-num-seqs", "7"])
    args = engine_args_from_namespace(ns, None)
    assert (args.max_model_len, args.max_num_batched_tokens, args.kv_cache_memory_bytes) == (32_000, 8192, 2**32)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-model-len", "1.5K"])
    assert "did you mean 1.5k?" in capsys.readouterr().err
