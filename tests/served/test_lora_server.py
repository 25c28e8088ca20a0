"""LoRA over HTTP (docs/architecture/11-lora.md, "LoRA adapters"): `model` names an adapter, /v1/models lists adapters
with their base as `parent`, and with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True adapters load and unload at run time
(400 for a bad one, 404 for an unknown name). The reference is transformers + peft with the adapter alone."""

from __future__ import annotations

import asyncio
import copy

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model

from tests.helpers.live_server import MODEL, serve, tiny_checkpoint, tiny_engine_args
from tests.helpers.tiny_models import hf_greedy
from vllm_jax import LoRARequest, SamplingParams
from vllm_jax.engine.async_llm import AsyncLLM

PROMPT = [259 + i for i in (7, 4, 11, 11, 14, 3, 22)]
MAX_TOKENS = 16


def make_adapter(base, path, seed: int, r: int, targets: list[str]):
    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets,
                                                           init_lora_weights=False)).eval()
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_server")
    checkpoint = tiny_checkpoint(root)
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(checkpoint).eval()
    refs = {MODEL: base, "A": make_adapter(base, root / "A", 1, 4, ["q_proj", "v_proj", "down_proj"]),
            "B": make_adapter(base, root / "B", 2, 8, ["k_proj", "o_proj", "up_proj"]),
            "big": make_adapter(base, root / "big", 3, 16, ["q_proj"])}
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    engine = AsyncLLM.from_engine_args(tiny_engine_args(checkpoint, enable_lora=True, max_lora_rank=8,
                                                        lora_modules=[f"A={root / 'A'}"]))
    server = serve(engine)
    yield server, root, refs
    server.stop()
    mp.undo()


def complete(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True})


def engine_output(engine: AsyncLLM, lora: LoRARequest | None, request_id: str):
    """The engine's own final output (token ids and text) for the prompt, without HTTP."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    async def run():
        async for out in engine.generate(PROMPT, params, request_id, lora_request=lora):
            if out.finished:
                return out.outputs[0]

    return asyncio.run(run())


def expected_text(server, refs, model: str, lora: LoRARequest | None) -> str:
    """The text HTTP must answer: the engine's, whose tokens are peft's greedy tokens with that adapter alone."""
    out = engine_output(server.engine, lora, f"direct-{model}")
    assert list(out.token_ids) == hf_greedy(refs[model], PROMPT, MAX_TOKENS), model
    return out.text


def test_models_lists_adapters_with_their_parent(served):
    server, root, _ = served
    cards = {c["id"]: c for c in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert set(cards) == {MODEL, "A"}
    assert cards["A"]["parent"] == MODEL and cards["A"]["root"] == str(root / "A")
    assert cards[MODEL]["parent"] is None


def test_model_field_picks_the_adapter(served):
    server, root, refs = served
    compiles = server.engine.num_compilations
    texts = {}
    for model in (MODEL, "A"):
        resp = complete(server.url, model)
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == model
        texts[model] = resp.json()["choices"][0]["text"]
        lora = None if model == MODEL else LoRARequest(model, 1, str(root / model))
        assert texts[model] == expected_text(server, refs, model, lora), model
    assert texts[MODEL] != texts["A"]
    assert server.engine.num_compilations == compiles
    server.assert_idle()


def test_runtime_load_and_unload(served):
    server, root, refs = served
    url = server.url
    assert complete(url, "B").status_code == 404
    resp = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "B", "lora_path": str(root / "B")})
    assert resp.status_code == 200, resp.text
    resp = complete(url, "B")
    assert resp.status_code == 200
    loaded = server.app.state.serving.lora_adapters["B"]  # the id the server gave it
    assert resp.json()["choices"][0]["text"] == expected_text(server, refs, "B", loaded)
    assert "B" in {c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]}
    bad = {"duplicate": {"lora_name": "A", "lora_path": str(root / "B")},
           "rank": {"lora_name": "big", "lora_path": str(root / "big")},
           "missing": {"lora_name": "gone", "lora_path": str(root / "nowhere")},
           "no path": {"lora_name": "x"}}
    for case, body in bad.items():
        resp = httpx.post(f"{url}/v1/load_lora_adapter", json=body)
        assert resp.status_code == 400, (case, resp.text)
        assert resp.json()["error"]["message"], case
    assert {c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]} == {MODEL, "A", "B"}
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "B"}).status_code == 200
    assert complete(url, "B").status_code == 404
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "B"}).status_code == 404
    server.assert_idle()
