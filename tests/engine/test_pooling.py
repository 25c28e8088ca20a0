"""The pooling runner end to end on tiny random checkpoints (one engine per model, one bucket each):
embeddings equal sentence-transformers' on the same weights (LAST, normalized, Matryoshka), a Llama converted to
embed with MEAN pooling equals transformers' mean hidden state, a LlamaForSequenceClassification's probabilities
equal transformers'; chunked prefill, batching and prefix caching leave the vectors unchanged; the wrong kind of
call names the runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel

from tests.helpers.pooling_models import make_sentence_transformer, make_sequence_classifier
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax import LLM, PoolingParams, SamplingParams

# one (T=16, S=4) bucket: a forward and a pooler to compile; prompts over 16 tokens run in chunks
SMALL = dict(max_model_len=128, block_size=8, max_num_seqs=4, max_num_batched_tokens=16, min_token_bucket=16,
             num_gpu_blocks_override=64)
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a", "pooling models embed sentences"]


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def st_model(tmp_path_factory):
    path = make_sentence_transformer(tmp_path_factory.mktemp("st") / "qwen3", pooling="LAST", normalize=True)
    return path, LLM(str(path), **SMALL)


def test_embeddings_equal_sentence_transformers(st_model):
    from sentence_transformers import SentenceTransformer

    path, llm = st_model
    config = llm.llm_engine.config
    assert (config.pooler_config.task, config.pooler_config.pooling_type) == ("embed", "LAST")
    reference = SentenceTransformer(str(path), device="cpu")
    outs = llm.embed(TEXTS, use_tqdm=False)
    for out, ref in zip(outs, reference.encode(TEXTS, batch_size=1)):
        assert len(out.outputs.embedding) == 64
        assert _cosine(out.outputs.embedding, ref) >= 0.99999
        assert abs(np.linalg.norm(out.outputs.embedding) - 1.0) < 1e-5
    short = llm.embed(TEXTS, PoolingParams(dimensions=16), use_tqdm=False)
    for out, ref in zip(short, reference.encode(TEXTS, batch_size=1, truncate_dim=16, normalize_embeddings=True)):
        assert len(out.outputs.embedding) == 16 and _cosine(out.outputs.embedding, ref) >= 0.99999
    assert llm.llm_engine.runner.num_compilations == len(llm.llm_engine.runner.warmup_plan())


def test_chunking_batching_and_prefix_cache_leave_the_vectors_unchanged(st_model):
    _, llm = st_model
    long = "instruction: represent this sentence for retrieval; " + TEXTS[1]  # 4 chunks of 16 tokens
    alone = [llm.embed(t, use_tqdm=False)[0].outputs.embedding for t in (long, TEXTS[0])]
    batched = [o.outputs.embedding for o in llm.embed([long, TEXTS[0], TEXTS[2]], use_tqdm=False)][:2]
    again = llm.embed(long, use_tqdm=False)[0].outputs.embedding  # its prefix blocks now cached
    assert llm.llm_engine.config.cache_config.enable_prefix_caching
    for a, b in zip(alone + [alone[0]], batched + [again]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    truncated = llm.embed(long, truncate_prompt_tokens=5, use_tqdm=False)[0]
    assert len(truncated.prompt_token_ids) == 5


def test_score_is_the_cosine_and_generation_names_the_runner(st_model):
    _, llm = st_model
    scores = llm.score(TEXTS[0], TEXTS[1:3], use_tqdm=False)
    vectors = [o.outputs.embedding for o in llm.embed(TEXTS[:3], use_tqdm=False)]
    for out, other in zip(scores, vectors[1:]):
        assert abs(out.outputs.score - _cosine(vectors[0], other)) < 1e-5
    with pytest.raises(ValueError, match="runner pooling .convert 'embed'.: it generates no text"):
        llm.generate("hi", SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="classify is not supported by this model"):
        llm.classify("hi", use_tqdm=False)
    with pytest.raises(ValueError, match="input: the prompt has 200 tokens"):
        llm.embed({"prompt_token_ids": [5] * 200}, use_tqdm=False)


def test_llama_converted_to_embed_with_mean_pooling(tmp_path):
    torch_model = make_tiny_checkpoint("llama", tmp_path / "llama")
    llm = LLM(str(tmp_path / "llama"), runner="pooling", convert="embed", pooler_config={"pooling_type": "MEAN"},
              **SMALL)
    assert not llm.llm_engine.config.cache_config.enable_prefix_caching  # MEAN needs every token's state
    base = AutoModel.from_pretrained(str(tmp_path / "llama")).eval()
    tokenizer = llm.get_tokenizer()
    outs = llm.embed(TEXTS[:2], use_tqdm=False)  # the second runs in 3 chunks
    for text, out in zip(TEXTS[:2], outs):
        with torch.no_grad():
            hidden = base(torch.tensor([tokenizer.encode(text)])).last_hidden_state[0].mean(0).numpy()
        assert _cosine(out.outputs.embedding, hidden) >= 0.99999
    del torch_model


def test_sequence_classifier_probabilities_equal_transformers(tmp_path):
    model = make_sequence_classifier(tmp_path / "cls", num_labels=3)
    llm = LLM(str(tmp_path / "cls"), **SMALL)  # runner auto: a *ForSequenceClassification pools
    tokenizer = llm.get_tokenizer()
    outs = llm.classify(TEXTS, use_tqdm=False)
    for text, out in zip(TEXTS, outs):
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([tokenizer.encode(text)])).logits, -1)[0].numpy()
        np.testing.assert_allclose(out.outputs.probs, probs, atol=1e-5)
    with pytest.raises(ValueError, match="3 labels"):
        llm.score("a", "b", use_tqdm=False)


def test_causal_lm_converted_to_a_reranker_through_hf_overrides(tmp_path):
    """Qwen3-Reranker's conversion (vLLM's hf_overrides): the LM head's "yes" minus "no" logit is a one-label
    classifier, so a pair's score is sigmoid(logit_yes - logit_no) of transformers' causal LM. The byte tokenizer
    has no "yes" / "no" tokens: "y" and "n" stand in."""
    model = make_tiny_checkpoint("qwen3", tmp_path / "reranker")
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["n", "y"],
                 "is_original_qwen3_reranker": True}
    llm = LLM(str(tmp_path / "reranker"), runner="pooling", hf_overrides=overrides, **SMALL)
    tokenizer = llm.get_tokenizer()
    query, documents = "query: fox", ["document: a quick brown fox", "document: lazy dog"]
    scores = llm.score(query, documents, use_tqdm=False)
    yes, no = tokenizer.convert_tokens_to_ids("y"), tokenizer.convert_tokens_to_ids("n")
    for document, out in zip(documents, scores):
        ids = tokenizer(query, text_pair=document)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        assert abs(out.outputs.score - torch.sigmoid(logits[yes] - logits[no]).item()) < 1e-5
