"""A data-URL image through the served engine with the openai SDK (docs/serving.md, "Images"): a tiny random
Qwen2.5-VL behind the real server answers chat (plain and streamed) and /v1/responses with the greedy tokens
transformers generates for the same image; a bad image and the limit are 400s naming the part."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch

from tests.helpers.live_server import Served, serve
from tests.helpers.tiny_models import EOS_ID
from tests.helpers.vl_models import (
    CHAT_TEMPLATE,
    IMAGE_PAD,
    expand_placeholders,
    image_processor,
    make_vl_checkpoint,
    random_image,
)
from vllm_jax.config import EngineArgs
from vllm_jax.engine.async_llm import AsyncLLM

MODEL = "tiny-vl"
MAX_TOKENS = 8
MAX_MODEL_LEN = 128


def _data_url(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Any]]:
    path = tmp_path_factory.mktemp("vision_server")
    hf = make_vl_checkpoint(path, seed=3)
    args = EngineArgs(model=str(path), max_model_len=MAX_MODEL_LEN, block_size=8, num_gpu_blocks_override=48,
                      max_num_seqs=2, max_num_batched_tokens=32, limit_mm_per_prompt={"image": 1})
    s = serve(AsyncLLM.from_engine_args(args), model_names=(MODEL,), chat_template=CHAT_TEMPLATE)
    yield s, hf
    s.stop()


@pytest.fixture(scope="module")
def client(served: tuple[Served, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[0].url}/v1", api_key="EMPTY", max_retries=0, timeout=120)


def _hf_greedy(served: tuple[Served, Any], text: str, image: Any) -> list[int]:
    """transformers' greedy tokens for the rendered chat with `image`."""
    engine, hf = served[0].engine, served[1]
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}], chat_template=CHAT_TEMPLATE,
        tokenize=False, add_generation_prompt=True)
    processed = image_processor()(images=[image], return_tensors="pt")
    grids = [tuple(int(x) for x in g) for g in processed["image_grid_thw"]]
    ids = torch.tensor([expand_placeholders(engine.tokenizer.encode(prompt, add_special_tokens=False), grids)])
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=processed["pixel_values"],
                          image_grid_thw=processed["image_grid_thw"], mm_token_type_ids=(ids == IMAGE_PAD).int(),
                          max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def _messages(url: str, text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


@pytest.fixture
def engine_tokens(served: tuple[Served, Any], monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The token ids the engine generated for each request the server sent it (the text of random byte tokens
    does not round-trip, the ids do), and what it was sent."""
    engine = served[0].engine
    generate, seen = engine.generate, []

    def spy(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        tokens: list[int] = []
        seen.append(tokens)
        assert isinstance(prompt, dict) and len(prompt["multi_modal_data"]["image"]) == 1

        async def outputs() -> Any:
            async for out in generate(prompt, *args, **kwargs):
                tokens.extend(out.outputs[0].token_ids)  # stream: deltas; otherwise the one final output
                yield out
        return outputs()

    monkeypatch.setattr(engine, "generate", spy)
    return seen


def test_a_data_url_image_through_the_sdk_gives_transformers_greedy_tokens(
        served: tuple[Served, Any], client: openai.OpenAI, engine_tokens: list[list[int]]) -> None:
    image = random_image(100, 80, 5)
    expected = _hf_greedy(served, "what is it", image)
    out = client.chat.completions.create(model=MODEL, messages=_messages(_data_url(image), "what is it"),
                                         max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == MAX_TOKENS and out.usage.prompt_tokens > 20  # the image's tokens count
    stream = client.chat.completions.create(model=MODEL, messages=_messages(_data_url(image), "what is it"),
                                            max_tokens=MAX_TOKENS, temperature=0.0, stream=True,
                                            extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == out.choices[0].message.content
    assert engine_tokens == [expected, expected]
    rest = client.chat.completions.create(model=MODEL, messages=_messages(_data_url(image), "what is it"),
                                          temperature=0.0, extra_body={"ignore_eos": True})  # no max_tokens
    assert rest.usage.prompt_tokens == out.usage.prompt_tokens  # the image's tokens counted once, by the engine
    assert rest.usage.total_tokens == MAX_MODEL_LEN and rest.choices[0].finish_reason == "length"


def test_responses_input_image_and_the_refusals(served: tuple[Served, Any], client: openai.OpenAI,
                                                engine_tokens: list[list[int]]) -> None:
    image = random_image(60, 60, 6)
    expected = _hf_greedy(served, "and this", image)
    content = [{"type": "input_image", "image_url": _data_url(image)}, {"type": "input_text", "text": "and this"}]
    client.responses.create(model=MODEL, max_output_tokens=MAX_TOKENS, temperature=0.0,
                            input=[{"role": "user", "content": content}])
    tokens = engine_tokens[0]
    assert tokens == expected[:len(tokens)] and (len(tokens) == MAX_TOKENS or expected[len(tokens)] == EOS_ID)
    with pytest.raises(openai.BadRequestError) as info:  # --limit-mm-per-prompt '{"image": 1}'
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _data_url(image)}}] * 2}])
    assert info.value.body["param"] == "messages[0].content[1].image_url" and "at most 1 image" in str(info.value)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=_messages("data:image/png;base64,aGVsbG8=", "x"))
    assert "cannot be decoded as an image" in str(info.value)
    assert len(engine_tokens) == 1  # the refused requests never reached the engine
    served[0].assert_idle()
