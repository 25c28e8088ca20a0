"""Reasoning parsers (vllm_jax/reasoning/): the split of finished outputs, the same outputs streamed in every
chunking, and `--reasoning-parser` from the command line into the engine config."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.cli import build_parser
from vllm_jax.config import EngineArgs, engine_args_from_namespace
from vllm_jax.reasoning import REASONING_PARSERS, get_reasoning_parser

THINK_TAG_PARSERS = sorted(name for name, parser in REASONING_PARSERS.items() if parser.start_token == "<think>")
# (output, reasoning, content) for the think-tag parsers with thinking on (harmony's: tests/unit/test_harmony.py)
SPLITS = [
    ("<think>The user greets.</think>Hello!", "The user greets.", "Hello!"),
    ("\n<think>\nplan\n</think>\n\nanswer", "\nplan\n", "\n\nanswer"),  # a leading start tag, after whitespace
    ("The template opened the block.</think>answer", "The template opened the block.", "answer"),  # no start tag
    ("<think>cut off while thinking", "cut off while thinking", None),  # no end tag: all reasoning
    ("no tags at all", "no tags at all", None),
    ("<think>done</think>", "done", None),
    ("", None, None),
    ("a</think>b</think>c", "a", "b</think>c"),  # the first end tag ends the reasoning
    ("x<think>y</think>z", "x<think>y", "z"),  # only a leading start tag is dropped
    ("<thin", "<thin", None),
]


def _streamed(name: str, text: str, sizes: list[int], thinking: bool = True) -> tuple[str | None, str | None]:
    streamer, reasoning, content, pos, i = get_reasoning_parser(name).streamer(thinking), "", "", 0, 0
    while pos < len(text):
        size = sizes[i % len(sizes)]
        r, c = streamer.push(text[pos:pos + size])
        reasoning, content, pos, i = reasoning + r, content + c, pos + size, i + 1
    r, c = streamer.finish()
    return (reasoning + r) or None, (content + c) or None


@pytest.mark.parametrize("name", THINK_TAG_PARSERS)
@pytest.mark.parametrize("text,reasoning,content", SPLITS)
def test_a_finished_output_splits_into_reasoning_and_content(name: str, text: str, reasoning: str | None,
                                                             content: str | None):
    assert get_reasoning_parser(name).split(text) == (reasoning, content)


@pytest.mark.parametrize("name", THINK_TAG_PARSERS)
@pytest.mark.parametrize("text,reasoning,content", SPLITS)
def test_a_streamed_output_adds_up_to_the_split_in_any_chunking(name: str, text: str, reasoning: str | None,
                                                                content: str | None):
    rng = random.Random(len(text))
    for sizes in [[1], [2], [3], [max(len(text), 1)]] + [[rng.randint(1, 5) for _ in range(7)] for _ in range(5)]:
        assert _streamed(name, text, sizes) == (reasoning, content), sizes


def test_reasoning_streams_at_once_and_only_a_possible_end_tag_waits():
    streamer = get_reasoning_parser("deepseek_r1").streamer()
    assert streamer.push(" <th") == ("", "")  # may still be the start tag
    assert streamer.push("ink>Let me") == ("Let me", "")
    assert streamer.push(" see</th") == (" see", "")
    assert streamer.push("ink>Yes") == ("", "Yes")
    assert streamer.push(" </think>") == ("", " </think>")  # after the reasoning, tags are plain text


def test_only_qwen3_turns_thinking_off_with_enable_thinking_false():
    qwen3, r1 = get_reasoning_parser("qwen3"), get_reasoning_parser("deepseek_r1")
    assert not qwen3.thinking({"enable_thinking": False})
    assert qwen3.thinking(None) and qwen3.thinking({"enable_thinking": True}) and qwen3.thinking({"x": 1})
    assert r1.thinking({"enable_thinking": False})
    assert qwen3.split("Hello</think>there", thinking=False) == (None, "Hello</think>there")
    assert _streamed("qwen3", "Hello</think>there", [2], thinking=False) == (None, "Hello</think>there")


CONSTRAINED = [  # structured outputs: without an end tag the output is the answer
    ('{"city": "Paris"}', None, '{"city": "Paris"}'),  # the constraint started at the first token
    ('Paris it is.</think>{"city": "Paris"}', "Paris it is.", '{"city": "Paris"}'),  # it started after </think>
    ("", None, None),
]


@pytest.mark.parametrize("text,reasoning,content", CONSTRAINED)
def test_a_constrained_output_is_reasoning_only_up_to_an_end_tag(text: str, reasoning: str | None,
                                                                 content: str | None):
    parser = get_reasoning_parser("qwen3")
    assert parser.split(text, constrained=True) == (reasoning, content)
    for size in (1, 2, 5, max(len(text), 1)):
        streamer, got_reasoning, got_content = parser.streamer(constrained=True), "", ""
        for pos in range(0, len(text), size):
            r, c = streamer.push(text[pos:pos + size])
            got_reasoning, got_content = got_reasoning + r, got_content + c
        r, c = streamer.finish()
        assert ((got_reasoning + r) or None, (got_content + c) or None) == (reasoning, content)


def test_every_parser_names_its_tags_for_the_engine():
    assert THINK_TAG_PARSERS == ["deepseek_r1", "qwen3"]
    for parser in REASONING_PARSERS.values():
        assert (parser.start_token, parser.end_token) in (("<think>", "</think>"),
                                                          ("<|channel|>analysis<|message|>", "<|end|>"))
    with pytest.raises(ValueError,
                       match="reasoning_parser must be one of deepseek_r1, openai_gptoss, qwen3; got 'granite'"):
        get_reasoning_parser("granite")


def test_reasoning_parser_flag_reaches_the_engine_config_and_a_bad_name_is_one_error(tmp_path: Path):
    ns = build_parser().parse_args(["serve", "--reasoning-parser", "qwen3"])
    assert engine_args_from_namespace(ns, None).reasoning_parser == "qwen3"
    with pytest.raises(ValueError, match="reasoning_parser must be one of deepseek_r1, openai_gptoss, qwen3; got 'r1'"):
        EngineArgs(model=str(tmp_path / "never-read"), reasoning_parser="r1").create_config(platform="cpu")
    make_tiny_checkpoint("qwen3", tmp_path / "qwen3")
    config = EngineArgs(model=str(tmp_path / "qwen3"), reasoning_parser="qwen3").create_config(platform="cpu")
    assert config.reasoning_parser == "qwen3"
    assert EngineArgs(model=str(tmp_path / "qwen3")).create_config(platform="cpu").reasoning_parser is None
