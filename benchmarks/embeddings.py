"""Embedding throughput: vllm_jax's pooling runner against sentence-transformers on torch, same weights.

    python benchmarks/embeddings.py [--num-sentences 256] [--min-len 16] [--max-len 256] [--tiny] [engine flags]

Builds a random checkpoint of the default model's architecture (SmolLM2-135M's Llama shape; `--tiny`: 2 layers of
64) saved as a sentence-transformers model (last-token pooling, normalized), and random sentences whose lengths are
uniform in [min-len, max-len] tokens (one letter = one token of its byte-level tokenizer). Times embedding them all
after warm-up with `LLM.embed`, then with `SentenceTransformer.encode` (torch, CPU), and prints sentences per
second for each, their ratio, and the smallest cosine between the two embeddings of a sentence (must be ~1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from vllm_jax.config import add_engine_args, engine_args_from_namespace

SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=2048, tie_word_embeddings=True)


def byte_tokenizer():
    """Special tokens, the 256 byte tokens and the letters: one letter is one token."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{i:02X}>": 3 + i for i in range(256)}}
    vocab.update({ch: 259 + i for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz")})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.decoder = decoders.ByteFallback()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<unk>")


def build_checkpoint(path: Path, shape: dict) -> None:
    """A random Llama of `shape` with sentence-transformers' files (last-token pooling, Normalize)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=320, bos_token_id=1, eos_token_id=2, **shape)).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "2_Normalize").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": shape["hidden_size"],
                                                                "pooling_mode_lasttoken": True}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-sentences", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' batch size")
    parser.add_argument("--tiny", action="store_true", help="2 layers of 64 instead of SmolLM2-135M's shape")
    parser.add_argument("--dataset-seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    add_engine_args(parser)
    ns = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    from vllm_jax import LLM

    rng = np.random.default_rng(ns.dataset_seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    sentences = ["".join(rng.choice(letters, int(n))) for n in rng.integers(ns.min_len, ns.max_len + 1,
                                                                             ns.num_sentences)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        build_checkpoint(path, TINY if ns.tiny else SMOLLM2_135M)
        args = engine_args_from_namespace(ns, str(path))
        if ns.max_model_len is None:
            args.max_model_len = max(ns.max_len + 1, 16)
        t0 = time.perf_counter()
        llm = LLM(**dataclasses.asdict(args))
        startup = time.perf_counter() - t0
        t1 = time.perf_counter()
        ours = np.asarray([o.outputs.embedding for o in llm.embed(sentences, use_tqdm=False)])
        ours_s = time.perf_counter() - t1
        print(f"vllm_jax: {ns.num_sentences / ours_s:.1f} sentences/s (warm-up {llm.llm_engine.warmup_seconds:.0f} s)",
              flush=True)
        reference = SentenceTransformer(str(path), device="cpu")
        t2 = time.perf_counter()
        theirs = reference.encode(sentences, batch_size=ns.batch_size)
        theirs_s = time.perf_counter() - t2
    cosines = np.sum(ours * theirs, axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    result = {"num_sentences": ns.num_sentences, "min_len": ns.min_len, "max_len": ns.max_len, "tiny": ns.tiny,
              "vllm_jax_sentences_per_s": ns.num_sentences / ours_s,
              "sentence_transformers_sentences_per_s": ns.num_sentences / theirs_s,
              "speedup": theirs_s / ours_s, "min_cosine": float(cosines.min()), "startup_s": startup,
              "warmup_s": llm.llm_engine.warmup_seconds}
    print(f"vllm_jax: {result['vllm_jax_sentences_per_s']:.1f} sentences/s; sentence-transformers: "
          f"{result['sentence_transformers_sentences_per_s']:.1f} sentences/s; speedup "
          f"{result['speedup']:.2f}x; min cosine {result['min_cosine']:.6f}")
    if ns.output_json:
        Path(ns.output_json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
