"""Image inputs without an engine (docs/serving.md, "Images"): loading images from data: URLs, allowed local files
and allowed hosts (a local http.server; nothing leaves the machine), the multimodal flags, chat messages with image
parts -> the template's conversation and the images in order, and the request the server and LLM.chat build from
them. The served refusals (400s naming the part, nothing reaching the engine) are in test_bad_input.py."""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image

import vllm_jax.multimodal.media as media
from tests.helpers.tiny_models import byte_tokenizer
from vllm_jax.cli import build_parser
from vllm_jax.config import EngineArgs, engine_args_from_namespace
from vllm_jax.multimodal.config import DEFAULT_LIMIT_PER_PROMPT, MultiModalConfig
from vllm_jax.multimodal.media import ImageSource, load_image
from vllm_jax.server.chat_messages import ChatMessage, chat_conversation_and_images
from vllm_jax.server.errors import APIError
from vllm_jax.server.protocol import ChatCompletionRequest
from vllm_jax.server.protocol_responses import ResponsesInputError, items_to_messages
from vllm_jax.server.serving import ServingContext
from vllm_jax.server.serving_chat import prepare_chat

WHERE = "messages[1].content[0].image_url"
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
# Qwen2.5-VL's template, in the parts this checks: content as a string or a list of text / image items
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}" + PLACEHOLDER +
            "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def encoded(fmt: str = "PNG", size: tuple[int, int] = (6, 4), color: tuple[int, ...] = (200, 10, 30),
            mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, fmt)
    return buf.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


OFF = MultiModalConfig()


# ---- loading ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_data_urls_decode_to_rgb_images_of_their_size(fmt: str) -> None:
    img = load_image(ImageSource(WHERE, url=data_url(encoded(fmt, (7, 5)), fmt.lower())), OFF)
    assert img.mode == "RGB" and img.size == (7, 5)
    if fmt == "PNG":  # lossless: the pixels themselves
        assert img.getpixel((3, 2)) == (200, 10, 30)


def test_transparency_is_composited_on_white_as_vllm_does() -> None:
    img = load_image(ImageSource(WHERE, url=data_url(encoded("PNG", mode="RGBA", color=(0, 0, 0, 0)))), OFF)
    assert img.mode == "RGB" and img.getpixel((0, 0)) == (255, 255, 255)


@pytest.mark.parametrize("url, says", [
    (data_url(b"not an image at all"), "cannot be decoded as an image"),
    (data_url(encoded("PNG")[:40]), "cannot be decoded as an image"),  # a truncated PNG
    ("data:image/png;base64,@@@", "not valid base64"),
    ("data:image/png,rawbytes", "only base64"),
    ("data:image/png;base64", "needs a ','"),
    (f"data:text/plain;base64,{base64.b64encode(b'hi').decode()}", "not an image"),
    ("ftp://example.com/a.png", "unsupported URL scheme 'ftp'"),
    ("just-a-name.png", "unsupported URL scheme"),
    ("http://example.com/a.png", "fetching http(s) URLs is off"),
    ("file:///etc/hostname", "file:// URLs are off"),
])
def test_bad_image_urls_are_value_errors_naming_the_part(url: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        load_image(ImageSource(WHERE, url=url), OFF)
    assert str(info.value).startswith(f"{WHERE}: ") and says in str(info.value), info.value


def test_too_many_pixels_is_refused_from_the_header_and_too_many_bytes_before_decoding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(media, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ValueError, match=r"11x10 pixels; at most 100"):
        load_image(ImageSource(WHERE, url=data_url(encoded(size=(11, 10)))), OFF)
    monkeypatch.setattr(media, "MAX_IMAGE_PIXELS", 10**9)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # PIL's own bomb check (an error past twice this)
    with pytest.raises(ValueError, match="too many pixels"):
        load_image(ImageSource(WHERE, url=data_url(encoded(size=(11, 10)))), OFF)
    monkeypatch.setattr(media, "MAX_IMAGE_BYTES", 50)
    with pytest.raises(ValueError, match="(larger than|at most) 50 bytes"):
        load_image(ImageSource(WHERE, url=data_url(encoded(size=(8, 8)) + b"\0" * 60)), OFF)


def test_file_urls_are_read_only_under_the_allowed_directory(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "media", tmp_path / "private"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "cat.png").write_bytes(encoded(size=(3, 2)))
    (outside / "secret.png").write_bytes(encoded())
    (allowed / "link.png").symlink_to(outside / "secret.png")
    config = MultiModalConfig.create(allowed_local_media_path=str(allowed))
    assert load_image(ImageSource(WHERE, url=(allowed / "cat.png").as_uri()), config).size == (3, 2)
    for url in [f"file://{allowed}/../private/secret.png", (allowed / "link.png").as_uri(),
                (outside / "secret.png").as_uri()]:
        with pytest.raises(ValueError, match="is outside --allowed-local-media-path"):
            load_image(ImageSource(WHERE, url=url), config)
    with pytest.raises(ValueError, match="no such file"):
        load_image(ImageSource(WHERE, url=(allowed / "missing.png").as_uri()), config)
    with pytest.raises(ValueError, match="must name a local path"):
        load_image(ImageSource(WHERE, url="file://otherhost/x.png"), config)


class _ImageHandler(http.server.BaseHTTPRequestHandler):
    body = encoded(size=(9, 9))

    def do_GET(self) -> None:
        if self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.end_headers()
            return
        found = self.path == "/cat.png"
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(self.body) if found else 0))
        self.end_headers()
        if found:
            self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ImageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_urls_are_fetched_only_from_allowed_hosts_without_following_redirects(
        image_host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    allowed = MultiModalConfig.create(allowed_media_domains=["127.0.0.1"])
    assert load_image(ImageSource(WHERE, url=f"{image_host}/cat.png"), allowed).size == (9, 9)
    with pytest.raises(ValueError, match="HTTP 404"):
        load_image(ImageSource(WHERE, url=f"{image_host}/missing.png"), allowed)
    with pytest.raises(ValueError, match="redirect to .* refused"):
        load_image(ImageSource(WHERE, url=f"{image_host}/moved.png"), allowed)
    other = MultiModalConfig.create(allowed_media_domains=["images.example.com"])
    with pytest.raises(ValueError, match="host '127.0.0.1' is not in --allowed-media-domains"):
        load_image(ImageSource(WHERE, url=f"{image_host}/cat.png"), other)
    monkeypatch.setattr(media, "MAX_IMAGE_BYTES", 20)
    with pytest.raises(ValueError, match="(larger than|at most) 20 bytes"):
        load_image(ImageSource(WHERE, url=f"{image_host}/cat.png"), allowed)


def test_image_pil_parts_are_taken_as_they_are_in_rgb() -> None:
    img = load_image(ImageSource("messages[0].content[0].image_pil", image=Image.new("L", (4, 4), 7)), OFF)
    assert img.mode == "RGB" and img.getpixel((0, 0)) == (7, 7, 7)
    with pytest.raises(ValueError, match="needs a PIL.Image.Image; got str"):
        load_image(ImageSource("messages[0].content[0].image_pil", image="cat.png"), OFF)


# ---- flags ------------------------------------------------------------------------------------------------------

def test_limit_mm_per_prompt_takes_json_or_a_dict_with_vllms_default() -> None:
    assert MultiModalConfig().limit("image") == DEFAULT_LIMIT_PER_PROMPT == 999
    assert MultiModalConfig.create('{"image": 2}').limit("image") == 2
    assert MultiModalConfig.create({"image": {"count": 3, "width": 512, "height": 512}}).limit("image") == 3
    assert MultiModalConfig.create({"image": 1, "video": 0}).limit("image") == 1  # turning off what we lack is fine


@pytest.mark.parametrize("value, says", [
    ('{"imagez": 2}', "unknown modality 'imagez'"),
    ({"video": 1}, "modality 'video' is not supported"),
    ({"image": -1}, "non-negative integer"),
    ({"image": True}, "non-negative integer"),
    ("[1]", "must be a JSON object"),
])
def test_bad_limits_name_the_flag_and_the_modality(value: Any, says: str) -> None:
    with pytest.raises(ValueError, match="limit_mm_per_prompt") as info:
        MultiModalConfig.create(value)
    assert says in str(info.value)


def test_media_path_must_exist_and_domains_are_bare_host_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowed_local_media_path .* is not an existing directory"):
        MultiModalConfig.create(allowed_local_media_path=str(tmp_path / "nope"))
    assert MultiModalConfig.create(allowed_media_domains=["Images.Example.COM."]).allowed_media_domains == (
        "images.example.com",)
    with pytest.raises(ValueError, match="host names"):
        MultiModalConfig.create(allowed_media_domains=["https://example.com"])


def test_the_cli_flags_carry_vllms_names_into_engine_args(tmp_path: Path) -> None:
    ns = build_parser().parse_args(["serve", "--limit-mm-per-prompt", '{"image": 2}', "--allowed-local-media-path",
                                    str(tmp_path), "--allowed-media-domains", "a.example", "b.example"])
    args = engine_args_from_namespace(ns, None)
    assert (args.limit_mm_per_prompt, args.allowed_local_media_path, args.allowed_media_domains) == (
        '{"image": 2}', str(tmp_path), ["a.example", "b.example"])
    assert EngineArgs().allowed_media_domains is None  # fetching is off unless asked for
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for flag in ("--limit-mm-per-prompt", "--allowed-local-media-path", "--allowed-media-domains"):
        assert flag in help_text


# ---- chat messages ----------------------------------------------------------------------------------------------

def test_text_only_messages_stay_strings_and_image_messages_become_template_items_in_order() -> None:
    first, second = data_url(encoded(size=(2, 2))), data_url(encoded(size=(3, 3)))
    messages = [ChatMessage(role="system", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
                ChatMessage(role="user", content=[{"type": "text", "text": "look"}, image_part(first)]),
                ChatMessage(role="assistant", content="ok"),
                ChatMessage(role="user", content=[{"type": "image_url", "image_url": second}])]  # a bare URL
    conversation, sources = chat_conversation_and_images(messages)
    assert conversation == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image"}]}]
    assert [(s.where, s.url) for s in sources] == [("messages[1].content[1].image_url", first),
                                                   ("messages[3].content[0].image_url", second)]


@pytest.mark.parametrize("part, says", [
    ({"type": "input_audio", "input_audio": {"data": "x"}}, "content parts of type 'input_audio' are not supported"),
    ({"type": "image_pil", "image_pil": "x"}, "image_pil parts are for the offline API"),
    ({"type": "image_url", "image_url": {"url": ""}}, "needs `image_url.url`"),
    ({"type": "text"}, "needs a `text` field"),
])
def test_bad_content_parts_name_their_place(part: dict[str, Any], says: str) -> None:
    messages = [ChatMessage(role="user", content="hi"), ChatMessage(role="user", content=[part])]
    with pytest.raises(ValueError) as info:
        chat_conversation_and_images(messages)
    assert str(info.value).startswith("messages[1].content[0]") and says in str(info.value)
    assert info.value.param.startswith("messages[1].content[0]")


def test_responses_input_image_items_become_image_url_parts() -> None:
    url = data_url(encoded())
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what is it"},
                                                             {"type": "input_image", "image_url": url}]}]
    assert items_to_messages(items) == [{"role": "user", "content": [
        {"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": url}}]}]
    with pytest.raises(ResponsesInputError, match=r"input\[0\].content\[0\]: an input_image part file_id is not"):
        items_to_messages([{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])


# ---- the request the server builds ------------------------------------------------------------------------------

VL = SimpleNamespace(architectures=["Qwen2_5_VLForConditionalGeneration"])  # a config that reads images
TEXT = SimpleNamespace(architectures=["LlamaForCausalLM"])


def _context(limit: dict[str, int] | None = None, hf_config: Any = VL) -> ServingContext:
    tokenizer = byte_tokenizer()
    model_config = SimpleNamespace(max_model_len=256, max_logprobs=20, hf_config=hf_config)
    engine = SimpleNamespace(dead=False, shutting_down=False, ready=True, tokenizer=tokenizer, grammar_compiler=None,
                             vocab_size=len(tokenizer),
                             config=SimpleNamespace(model_config=model_config,
                                                    multimodal_config=MultiModalConfig.create(limit)))
    return ServingContext(engine=engine, served_model_names=["tiny-vl"], chat_template=TEMPLATE)


def _chat_body(*contents: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": c} for c in contents], "max_tokens": 4})


def test_prepare_chat_renders_one_placeholder_per_image_and_hands_the_images_over_in_order() -> None:
    ctx = _context()
    body = _chat_body([{"type": "text", "text": "compare"}, image_part(data_url(encoded(size=(2, 2)))),
                       image_part(data_url(encoded("JPEG", size=(5, 3)), "jpeg"))], "and this one?")
    chat = asyncio.run(prepare_chat(ctx, body))
    text = ctx.engine.tokenizer.decode(chat.prompt_ids)
    assert text.count(PLACEHOLDER) == 2 and text.index("compare") < text.index(PLACEHOLDER)
    prompt = chat.engine_prompt
    assert prompt["prompt_token_ids"] == chat.prompt_ids
    assert [img.size for img in prompt["multi_modal_data"]["image"]] == [(2, 2), (5, 3)]
    assert all(img.mode == "RGB" for img in prompt["multi_modal_data"]["image"])
    assert chat.params.max_tokens == 4
    no_limit = asyncio.run(prepare_chat(ctx, ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": [image_part(data_url(encoded()))]}]})))
    assert no_limit.params.max_tokens is None  # the rest of the context: the engine counts the image's tokens
    text_only = asyncio.run(prepare_chat(ctx, _chat_body("plain")))
    assert text_only.engine_prompt == text_only.prompt_ids  # no images: token ids, as before


def test_prepare_chat_refuses_images_past_the_limit_and_for_a_model_without_a_vision_tower() -> None:
    three = [image_part(data_url(encoded())) for _ in range(3)]
    with pytest.raises(APIError) as info:
        asyncio.run(prepare_chat(_context(hf_config=TEXT), _chat_body(three)))
    assert info.value.status == 400 and info.value.param == "messages[0].content[0].image_url"
    assert "model tiny-vl does not accept image inputs" in info.value.message
    with pytest.raises(APIError) as info:
        asyncio.run(prepare_chat(_context({"image": 2}), _chat_body(three)))
    assert info.value.param == "messages[0].content[2].image_url"
    assert "at most 2 image(s)" in info.value.message and "--limit-mm-per-prompt" in info.value.message


# ---- the offline API --------------------------------------------------------------------------------------------

def _offline_llm(monkeypatch: pytest.MonkeyPatch, accepts: bool) -> tuple[Any, list]:
    """An LLM whose engine is only what chat() reads; generate() records its prompts."""
    from vllm_jax.llm import LLM

    tokenizer = byte_tokenizer()
    tokenizer.chat_template = TEMPLATE
    llm = LLM.__new__(LLM)
    model_config = SimpleNamespace(served_model_name="tiny-vl", hf_config=VL if accepts else TEXT)
    llm.llm_engine = SimpleNamespace(tokenizer=tokenizer, config=SimpleNamespace(
        model_config=model_config, multimodal_config=MultiModalConfig.create({"image": 2})))
    seen: list = []
    monkeypatch.setattr(llm, "_run", lambda prompts, params, *a: seen.extend(prompts) or [])
    return llm, seen


def test_llm_chat_takes_image_url_and_image_pil_parts_as_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    llm, seen = _offline_llm(monkeypatch, accepts=True)
    pil = Image.new("RGBA", (4, 6), (0, 0, 255, 255))
    llm.chat([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(encoded(size=(3, 3)))}},
        {"type": "image_pil", "image_pil": pil}, {"type": "text", "text": "which is bigger?"}]}])
    images = seen[0]["multi_modal_data"]["image"]
    assert [(img.size, img.mode) for img in images] == [((3, 3), "RGB"), ((4, 6), "RGB")]
    assert llm.get_tokenizer().decode(seen[0]["prompt_token_ids"]).count(PLACEHOLDER) == 2
    llm.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])  # text only: as before, no images
    assert set(seen[1]) == {"prompt_token_ids"}
    with pytest.raises(ValueError, match=r"messages\[0\].content\[2\].image_pil: at most 2 image"):
        llm.chat([{"role": "user", "content": [{"type": "image_pil", "image_pil": pil}] * 3}])


def test_offline_images_for_a_text_model_are_refused_before_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    llm, seen = _offline_llm(monkeypatch, accepts=False)
    pil = Image.new("RGB", (4, 4))
    with pytest.raises(ValueError, match="model tiny-vl does not accept image inputs"):
        llm.chat([{"role": "user", "content": [{"type": "image_pil", "image_pil": pil}]}])
    with pytest.raises(ValueError, match=r"prompts\[0\].multi_modal_data\['image'\]\[0\]: model tiny-vl does not"):
        llm.generate({"prompt": "x", "multi_modal_data": {"image": pil}})
    with pytest.raises(ValueError, match="modalities \\['video'\\] are not supported"):
        llm.generate([{"prompt": "x", "multi_modal_data": {"video": [pil]}}])
    assert seen == []
