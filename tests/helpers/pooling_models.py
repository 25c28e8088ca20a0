"""Tiny pooling checkpoints (tests/test_pooling*.py): a Qwen3 saved as a sentence-transformers model, and a
LlamaForSequenceClassification, both random and built from transformers configs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from tests.helpers.tiny_models import EOS_ID, VOCAB_SIZE, byte_tokenizer, make_tiny_checkpoint

_ST_MODES = {"LAST": "pooling_mode_lasttoken", "MEAN": "pooling_mode_mean_tokens", "CLS": "pooling_mode_cls_token"}


def _save_tokenizer(path: Path) -> None:
    tokenizer = byte_tokenizer()
    tokenizer.pad_token = "<unk>"  # sentence-transformers pads its batches
    tokenizer.save_pretrained(path)


def make_sentence_transformer(path: Path, pooling: str = "LAST", normalize: bool = True, seed: int = 0,
                              **overrides) -> Path:
    """A Qwen3 checkpoint with sentence-transformers' modules.json, 1_Pooling and (optionally) Normalize."""
    make_tiny_checkpoint("qwen3", path, seed=seed, is_matryoshka=True, **overrides)
    _save_tokenizer(path)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    settings = {"word_embedding_dimension": 64, **{mode: False for mode in _ST_MODES.values()},
                _ST_MODES[pooling]: True}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(settings))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    return path


def make_sequence_classifier(path: Path, num_labels: int = 3, seed: int = 0) -> LlamaForSequenceClassification:
    """A random LlamaForSequenceClassification (score head [num_labels, 64]) with the byte tokenizer."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                         eos_token_id=EOS_ID, pad_token_id=0, initializer_range=0.1, rms_norm_eps=1e-6,
                         num_labels=num_labels)
    model = LlamaForSequenceClassification(config).eval()
    model.save_pretrained(path)
    _save_tokenizer(path)
    return model
