"""Vision chat: requests/s and TTFT for chat requests with one image each, vllm_jax's server against transformers.

    python benchmarks/vision_serving.py [--num-requests 32] [--image-size 448] [--max-tokens 16] [--tiny]
                                        [--skip-transformers] [--output-json F] [engine flags]

Builds a random Qwen2.5-VL checkpoint from transformers' Qwen2_5_VLConfig (default: 4 layers of 256 with a 4-block
vision tower of 128; `--tiny`: 2 layers of 64, vision 2 blocks of 32) with a byte-level tokenizer carrying Qwen's
special tokens and chat template, and Qwen2-VL's PIL image processor (no torchvision). A 448x448 image is 32x32
patches of 14 pixels, 256 tokens after the 2x2 merge.

vllm_jax: the real server in this process (AsyncLLM + the app under uvicorn on 127.0.0.1), after warm-up; every
request is sent at once as an OpenAI chat request with the image as a PNG data: URL, streamed, greedy, EOS ignored
(so each generates exactly --max-tokens). TTFT: from sending to the first content chunk. requests/s: requests over
the time from the first send to the last response.
transformers: Qwen2_5_VLForConditionalGeneration.generate on the same weights, the same rendered prompts and images
(the image processor's pixel values, placeholders expanded to the image's tokens), in batches of --batch-size with
left padding; the image processor's time is counted. TTFT: from the batch's start to its first token (a logits
processor notes it); a batch runs to --max-tokens for all. The client side of vllm_jax (PNG-encoding the images)
is not timed; the server's decoding is. The engine side needs the Qwen2.5-VL model (docs/vision.md); an engine
without it refuses the checkpoint at start.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vllm_jax.config import add_engine_args, engine_args_from_namespace

MODEL_NAME = "tiny-qwen2.5-vl"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>"]
# Qwen2.5-VL's template, for text and image items (its tool and video branches left out)
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SHAPES = {
    "small": dict(text=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2),
                  vision=dict(depth=4, hidden_size=128, intermediate_size=256, num_heads=4,
                              fullatt_block_indexes=[1, 3])),
    "tiny": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2),
                 vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, fullatt_block_indexes=[1])),
}
QUESTION = "Describe this image."


def vision_tokenizer():
    """Byte-level BPE (one letter = one token) plus Qwen's special tokens and chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{i:02X}>": 1 + i for i in range(256)}}
    vocab.update({ch: 257 + i for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz")})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.decoder = decoders.ByteFallback()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = TEMPLATE
    return tok


def build_checkpoint(path: Path, shape: dict, seed: int = 0, max_pixels: int = 448 * 448) -> None:
    """A random Qwen2.5-VL of `shape`, its tokenizer and its PIL image processor, saved to `path`. `max_pixels`
    bounds an image's patches (and with them the vision encoder's largest bucket): 448x448 by default."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = vision_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    text = shape["text"]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    half = head_dim // 2  # M-RoPE's temporal / height / width sections, as Qwen2.5-VL splits them (16, 24, 24 of 64)
    mrope = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), max_position_embeddings=4096, rms_norm_eps=1e-6,
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope},
                         **text),
        vision_config=dict(out_hidden_size=text["hidden_size"], patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, window_size=112, **shape["vision"]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(config).eval().save_pretrained(path)
    tok.save_pretrained(path)
    Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56,
                             max_pixels=max_pixels).save_pretrained(path)


def random_images(n: int, size: int, seed: int) -> list[Any]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB") for _ in range(n)]


def data_url(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat_messages(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


# ---- vllm_jax: the server --------------------------------------------------------------------------------------

async def _one_chat(client: Any, url: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT s, end-to-end s, completion tokens) of one streamed chat request."""
    body = {"model": MODEL_NAME, "messages": chat_messages(url), "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:500]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if ttft is None and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return (ttft if ttft is not None else time.perf_counter() - start), time.perf_counter() - start, tokens


async def _send_all(base_url: str, urls: list[str], max_tokens: int) -> tuple[float, list[tuple[float, float, int]]]:
    import httpx

    async with httpx.AsyncClient(base_url=base_url, timeout=3600) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_one_chat(client, url, max_tokens) for url in urls))
        return time.perf_counter() - t0, list(results)


def run_vllm_jax(args: Any, images: list[Any], max_tokens: int) -> dict[str, Any]:
    import httpx

    from vllm_jax.engine.async_llm import AsyncLLM
    from vllm_jax.server.api_server import build_app
    from vllm_jax.server.launcher import HttpServer, bind_socket, serve_in_thread

    t0 = time.perf_counter()
    engine = AsyncLLM.from_engine_args(args)
    app = build_app(engine, served_model_names=[MODEL_NAME], api_key=None, chat_template=None)
    server = HttpServer(app, engine, log_level="warning", access_log=False)
    sock = bind_socket("127.0.0.1", 0)
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    thread = serve_in_thread(server, sock)
    try:
        while httpx.get(f"{base_url}/health", timeout=10).status_code != 200:
            if not thread.is_alive():
                raise RuntimeError("the server stopped while starting")
            time.sleep(0.2)
        ready_s = time.perf_counter() - t0
        urls = [data_url(img) for img in images]
        asyncio.run(_send_all(base_url, urls[:1], 2))  # one request first: any lazily built piece is built now
        seconds, results = asyncio.run(_send_all(base_url, urls, max_tokens))
    finally:
        server.request_exit()
        thread.join(timeout=60)
    ttfts = [r[0] for r in results]
    return {"requests_per_s": len(results) / seconds, "seconds": seconds, "ttft_mean_s": statistics.mean(ttfts),
            "ttft_median_s": statistics.median(ttfts), "completion_tokens": sum(r[2] for r in results),
            "ready_s": ready_s}


# ---- transformers ----------------------------------------------------------------------------------------------

class _FirstToken:
    """A logits processor that notes when the first token's logits exist (the end of prefill)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def run_transformers(path: Path, images: list[Any], max_tokens: int, batch_size: int) -> dict[str, Any]:
    import os

    import torch
    from transformers import AutoTokenizer, LogitsProcessorList, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    torch.set_num_threads(os.cpu_count() or 1)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    processor = Qwen2VLImageProcessorPil.from_pretrained(path)
    merge = processor.merge_size ** 2
    prompt = tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                                      "text": QUESTION}]}],
                                     tokenize=False, add_generation_prompt=True)

    def generate(batch: list[Any], new_tokens: int) -> tuple[float, float]:
        first = _FirstToken()
        t0 = time.perf_counter()
        pixels = processor(images=batch, return_tensors="pt")
        counts = (pixels["image_grid_thw"].prod(-1) // merge).tolist()
        texts = [prompt.replace("<|image_pad|>", "<|image_pad|>" * n) for n in counts]
        enc = tok(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            model.generate(**enc, pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           pad_token_id=tok.pad_token_id, logits_processor=LogitsProcessorList([first]))
        return first.at - t0, time.perf_counter() - t0

    generate(images[:1], 2)  # warm-up
    ttfts, seconds = [], 0.0
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        ttft, elapsed = generate(batch, max_tokens)
        ttfts += [seconds + ttft] * len(batch)  # a later batch waits for the earlier ones
        seconds += elapsed
    return {"requests_per_s": len(images) / seconds, "seconds": seconds, "ttft_mean_s": statistics.mean(ttfts),
            "ttft_median_s": statistics.median(ttfts), "completion_tokens": len(images) * max_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=448, help="square images of this many pixels a side")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--batch-size", type=int, default=32, help="transformers' batch size")
    parser.add_argument("--tiny", action="store_true", help="2 layers of 64 (vision 2 of 32) instead of 4 of 256")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--dataset-seed", type=int, default=0, help="seed of the images and of the random weights")
    parser.add_argument("--output-json", default=None)
    add_engine_args(parser)
    ns = parser.parse_args()
    images = random_images(ns.num_requests, ns.image_size, ns.dataset_seed)
    result: dict[str, Any] = {"num_requests": ns.num_requests, "image_size": ns.image_size,
                              "max_tokens": ns.max_tokens, "shape": "tiny" if ns.tiny else "small"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qwen2_5_vl"
        build_checkpoint(path, SHAPES["tiny" if ns.tiny else "small"], ns.dataset_seed, max_pixels=ns.image_size ** 2)
        args = engine_args_from_namespace(ns, str(path))
        if ns.max_model_len is None:
            args.max_model_len = 1024  # 256 image tokens + the text + the output, with room
        args = dataclasses.replace(args, served_model_name=MODEL_NAME)
        ours = run_vllm_jax(args, images, ns.max_tokens)
        result["vllm_jax"] = ours
        print(f"vllm_jax: {ours['requests_per_s']:.2f} requests/s, TTFT mean {ours['ttft_mean_s'] * 1e3:.0f} ms "
              f"(median {ours['ttft_median_s'] * 1e3:.0f} ms); ready in {ours['ready_s']:.0f} s", flush=True)
        if not ns.skip_transformers:
            theirs = run_transformers(path, images, ns.max_tokens, ns.batch_size)
            result["transformers"] = theirs
            result["requests_per_s_ratio"] = ours["requests_per_s"] / theirs["requests_per_s"]
            result["ttft_ratio"] = theirs["ttft_mean_s"] / ours["ttft_mean_s"]
            print(f"transformers: {theirs['requests_per_s']:.2f} requests/s, TTFT mean "
                  f"{theirs['ttft_mean_s'] * 1e3:.0f} ms; vllm_jax / transformers: "
                  f"{result['requests_per_s_ratio']:.2f}x requests/s, {result['ttft_ratio']:.2f}x faster TTFT")
    if ns.output_json:
        Path(ns.output_json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
