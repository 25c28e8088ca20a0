"""The `vllm-jax` command line: vLLM's flag names (and short forms) reach EngineArgs; convert writes a restorable
orbax checkpoint."""

from __future__ import annotations

import pytest

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.cli import build_parser, main
from vllm_jax.config import engine_args_from_namespace
from vllm_jax.model_loader.source import resolve_model_source


def test_parallelism_short_flags_and_optional_bools_reach_engine_args():
    ns = build_parser().parse_args(["serve", "some/model", "-tp", "2", "-dp", "3", "-ep", "--no-scan-layers",
                                    "--no-enable-prefix-caching", "--max-num-seqs", "7"])
    args = engine_args_from_namespace(ns, ns.model)
    assert (args.tensor_parallel_size, args.data_parallel_size, args.enable_expert_parallel) == (2, 3, True)
    assert args.scan_layers is False and args.enable_prefix_caching is False and args.max_num_seqs == 7
    assert engine_args_from_namespace(build_parser().parse_args(["serve"]), None).scan_layers is None  # per platform


def test_convert_writes_an_orbax_checkpoint_that_loads_as_a_model(tmp_path, capsys):
    make_tiny_checkpoint("qwen3", tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "out")]) == 0
    assert "converted in" in capsys.readouterr().out
    assert resolve_model_source(str(tmp_path / "out")).kind == "orbax"
    with pytest.raises(FileExistsError, match="not empty"):
        main(["convert", str(tmp_path / "hf"), str(tmp_path / "out")])


def test_speculative_config_flag_reaches_the_engine_and_a_bad_one_is_one_error_line(tmp_path, capsys):
    make_tiny_checkpoint("llama", tmp_path / "hf")
    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    ns = build_parser().parse_args(["generate", str(tmp_path / "hf"), "--speculative-config", spec])
    config = engine_args_from_namespace(ns, ns.model).create_config()
    assert config.speculative_config.num_speculative_tokens == 3 and not config.async_scheduling
    bad = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}'
    assert main(["generate", str(tmp_path / "hf"), "--speculative-config", bad]) == 2
    assert "ERROR: speculative_config.prompt_lookup_min must be a positive integer" in capsys.readouterr().err


def test_generate_without_a_chat_template_runs_plain_prompts_or_says_why_not(tmp_path, capsys):
    """The tiny checkpoints' tokenizer has no chat template: by default generate sends the prompts as they are
    (a note says so); an explicit --chat is one error line, not a traceback."""
    make_tiny_checkpoint("llama", tmp_path / "hf")
    flags = [str(tmp_path / "hf"), "--max-model-len", "64", "--max-tokens", "4", "--prompt", "hello",
             "--max-num-batched-tokens", "32", "--max-num-seqs", "4", "--min-token-bucket", "32",
             "--min-seq-bucket", "4"]  # one bucket: one forward to compile, not six
    assert main(["generate", *flags]) == 0
    captured = capsys.readouterr()
    assert "no chat template" in captured.err and ">>> hello" in captured.out
    assert main(["generate", *flags, "--chat"]) == 2
    assert "ERROR: --chat needs a chat template" in capsys.readouterr().err
