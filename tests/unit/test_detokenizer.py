"""IncrementalDetokenizer: streamed text equals a full decode, and never shows half a character.

Tokenizers are trained here (no downloads) on a small multilingual corpus: byte-level BPE (GPT-2 / Llama 3
style), a Llama-2 style BPE with byte fallback and a Metaspace pre-tokenizer whose decoder strips the first
leading space, and a Unigram with a Metaspace decoder.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from vllm_jax.engine.detokenizer import IncrementalDetokenizer

WORDS = ["héllo", "wörld", "你好", "🙂", "the", "quick", "brown", "fox", "Paris", "capital", "of", "France",
         "naïve", "café", "日本語", "テキスト", "😀", "👍", "straße", "Ελληνικά", "emoji", "and", "text", "—", ",", "."]
# Not in the training corpus: byte-level BPE splits them into byte tokens, byte fallback into <0x..> tokens.
RARE_WORDS = ["🦀", "🚀", "ñandú", "Ωμέγα", "한국어"]
SPECIALS = ["<s>", "</s>", "<pad>"]


def corpus(n_lines: int = 300) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n_lines)]


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   clean_up_tokenization_spaces=False)


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return _wrap(tok)


def llama_style_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-like BPE: Metaspace, byte fallback for characters outside the (limited) alphabet."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>"] + SPECIALS, limit_alphabet=40, show_progress=False))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # byte tokens live in the model vocab (not special), as in Llama 2
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return _wrap(tok)


def unigram_metaspace_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(corpus(), trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<unk>"] + SPECIALS, unk_token="<unk>", show_progress=False))
    return _wrap(tok)


BUILDERS = {"byte_level": byte_level_tokenizer, "llama_style": llama_style_tokenizer,
            "unigram_metaspace": unigram_metaspace_tokenizer}
_CACHE: dict[str, PreTrainedTokenizerFast] = {}


def get_tokenizer(name: str) -> PreTrainedTokenizerFast:
    if name not in _CACHE:
        _CACHE[name] = BUILDERS[name]()
    return _CACHE[name]


def stream(tokenizer, out_ids, prompt=(), skip=True, chunk_sizes=None, flush=True):
    """Push `out_ids` (one at a time, or in the given chunk sizes); return the pieces emitted."""
    detok = IncrementalDetokenizer(tokenizer, list(prompt), skip_special_tokens=skip)
    pieces, i, k = [], 0, 0
    while i < len(out_ids):
        size = chunk_sizes[k % len(chunk_sizes)] if chunk_sizes else 1
        pieces.append(detok.push(out_ids[i:i + size]))
        i, k = i + size, k + 1
    if flush:
        pieces.append(detok.flush())
    return pieces


def byte_level_ids_for_bytes(tokenizer, text: str) -> list[int]:
    """One single-byte token per UTF-8 byte of `text`: each character split over all its bytes."""
    # ByteLevel maps each byte to one printable character; that character alone is the byte's token.
    chars = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)[0][0]
    assert len(chars) == len(text.encode())
    return [tokenizer.convert_tokens_to_ids(c) for c in chars]


text_strategy = st.lists(st.sampled_from(WORDS + RARE_WORDS), min_size=1, max_size=12).map(" ".join)


@pytest.mark.parametrize("name", list(BUILDERS))
@settings(max_examples=60, deadline=None)
@given(text=text_strategy, skip=st.booleans(), bos=st.booleans(),
       chunks=st.one_of(st.none(), st.lists(st.integers(1, 4), min_size=1, max_size=4)))
def test_streamed_text_equals_full_decode_and_never_shows_replacement_char(name, text, skip, bos, chunks):
    tokenizer = get_tokenizer(name)
    out = tokenizer.encode(text, add_special_tokens=False)
    prompt = [tokenizer.bos_token_id] if bos else []
    pieces = stream(tokenizer, out, prompt, skip=skip, chunk_sizes=chunks)
    # The text continues the prompt's text; with nothing visible before it, that is decode(out) itself.
    before = tokenizer.decode(prompt, skip_special_tokens=skip)
    full = tokenizer.decode(prompt + out, skip_special_tokens=skip)
    assert full.startswith(before) and "".join(pieces) == full[len(before):]
    if before == "":
        assert "".join(pieces) == tokenizer.decode(out, skip_special_tokens=skip)
    assert not any("\ufffd" in piece for piece in pieces)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 599), min_size=1, max_size=40), skip=st.booleans())
def test_byte_level_random_ids_stream_plus_flush_equals_full_decode(ids, skip):
    tokenizer = get_tokenizer("byte_level")
    assert "".join(stream(tokenizer, ids, skip=skip)) == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("name", ["llama_style", "unigram_metaspace"])
@settings(max_examples=150, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_metaspace_random_non_byte_ids_stream_equals_full_decode(name, data, skip):
    # Byte-fallback runs are excluded: ByteFallback turns a whole invalid run into U+FFFD, even its ASCII
    # bytes, which no streaming decoder can know in advance (vLLM shares this limit).
    tokenizer = get_tokenizer(name)
    ids = [i for i in range(len(tokenizer)) if not tokenizer.convert_ids_to_tokens(i).startswith("<0x")]
    out = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=40))
    assert "".join(stream(tokenizer, out, skip=skip)) == tokenizer.decode(out, skip_special_tokens=skip)


@pytest.mark.parametrize("text", ["🙂", "你", "é"])
def test_byte_level_character_split_over_byte_tokens_is_emitted_once_complete(text):
    tokenizer = get_tokenizer("byte_level")
    ids = byte_level_ids_for_bytes(tokenizer, text)
    assert len(ids) == len(text.encode()) > 1
    pieces = stream(tokenizer, ids, prompt=tokenizer.encode("héllo", add_special_tokens=False), flush=False)
    assert pieces == [""] * (len(ids) - 1) + [text]


def test_byte_fallback_emoji_is_emitted_once_complete():
    tokenizer = get_tokenizer("llama_style")
    ids = tokenizer.encode("the 🦀 fox", add_special_tokens=False)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert ["<0xF0>", "<0x9F>", "<0xA6>", "<0x80>"] == [t for t in tokens if t.startswith("<0x")]
    pieces = stream(tokenizer, ids, flush=False)
    assert "".join(pieces) == "the 🦀 fox"
    assert "🦀" in pieces and not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("name", ["llama_style", "unigram_metaspace"])
def test_metaspace_first_output_token_keeps_its_space_after_a_prompt(name):
    tokenizer = get_tokenizer(name)
    prompt = tokenizer.encode("Paris is the", add_special_tokens=False)
    full = tokenizer.encode("Paris is the capital of France", add_special_tokens=False)
    assert full[:len(prompt)] == prompt
    out = full[len(prompt):]
    assert not tokenizer.decode(out).startswith(" ")  # decoded alone the space is lost...
    assert "".join(stream(tokenizer, out, prompt)) == " capital of France"  # ...in context it is kept


@pytest.mark.parametrize("name", list(BUILDERS))
def test_skip_special_tokens_drops_special_tokens_only_when_asked(name):
    tokenizer = get_tokenizer(name)
    out = tokenizer.encode("the fox", add_special_tokens=False) + [tokenizer.eos_token_id] + \
        tokenizer.encode(" and text", add_special_tokens=False)
    skipped = "".join(stream(tokenizer, out, skip=True))
    kept = "".join(stream(tokenizer, out, skip=False))
    assert "</s>" not in skipped and "</s>" in kept
    assert skipped == tokenizer.decode(out, skip_special_tokens=True)
    assert kept == tokenizer.decode(out, skip_special_tokens=False)


def test_flush_emits_an_incomplete_character_at_the_end_like_decode():
    tokenizer = get_tokenizer("byte_level")
    ids = tokenizer.encode("ok", add_special_tokens=False) + byte_level_ids_for_bytes(tokenizer, "🙂")[:2]
    pieces = stream(tokenizer, ids)
    assert pieces[-1] != "" and "\ufffd" in pieces[-1]
    assert "".join(pieces) == tokenizer.decode(ids)


def test_invalid_bytes_wait_for_a_valid_character_then_match_a_full_decode_exactly():
    # Splitting a run of invalid bytes early could change how many U+FFFD the full decode gives, so the run
    # is held until a valid character follows (or the request ends), then emitted exactly.
    tokenizer = get_tokenizer("byte_level")
    lead = byte_level_ids_for_bytes(tokenizer, "🙂")[0]  # 0xF0, a 4-byte lead byte
    ok = tokenizer.encode("ok", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    emitted = [detok.push([lead]) for _ in range(40)]
    assert not any(emitted)
    tail = detok.push(ok)
    assert "".join(emitted) + tail == tokenizer.decode([lead] * 40 + ok) and tail.endswith("ok")
    assert detok.flush() == ""


def test_invalid_prefix_from_decode_stream_falls_back_without_losing_later_text():
    # ByteFallback turns "A" into U+FFFD once an invalid byte follows it, so the text is not prefix-stable:
    # DecodeStream raises "Invalid prefix"; the detokenizer must switch decoders and keep going.
    tokenizer = get_tokenizer("llama_style")
    ids = tokenizer.convert_tokens_to_ids(["<0x41>", "<0x80>"]) + tokenizer.encode(" the fox", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    assert detok.uses_decode_stream
    text = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert not detok.uses_decode_stream and text.endswith(" the fox")


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(0, 399 + 256), min_size=1, max_size=30))
def test_random_byte_fallback_ids_never_raise_and_text_after_them_is_intact(ids):
    tokenizer = get_tokenizer("llama_style")
    ids = [i % len(tokenizer) for i in ids]
    tail = tokenizer.encode(" the fox", add_special_tokens=False)
    assert "".join(stream(tokenizer, ids + tail)).endswith("the fox")


class _SlowOnly:
    """A tokenizer without a Rust backend (like a Python tokenizer); counts decode sizes."""

    def __init__(self, inner):
        self.inner, self.decode_sizes = inner, []

    def decode(self, ids, skip_special_tokens=False, **kwargs):
        self.decode_sizes.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_fast_tokenizer_uses_decode_stream_and_others_the_offset_fallback():
    tokenizer = get_tokenizer("byte_level")
    assert IncrementalDetokenizer(tokenizer, []).uses_decode_stream
    assert not IncrementalDetokenizer(_SlowOnly(tokenizer), []).uses_decode_stream


@pytest.mark.parametrize("name", list(BUILDERS))
@settings(max_examples=40, deadline=None)
@given(text=text_strategy, prompt_text=text_strategy)
def test_offset_fallback_matches_decode_stream(name, text, prompt_text):
    tokenizer = get_tokenizer(name)
    prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
    out = tokenizer.encode(" " + text, add_special_tokens=False)
    fast = stream(tokenizer, out, prompt)
    slow = stream(_SlowOnly(tokenizer), out, prompt)
    assert "".join(slow) == "".join(fast)
    assert not any("\ufffd" in piece for piece in slow)


def test_push_cost_does_not_grow_with_generated_length():
    tokenizer = get_tokenizer("byte_level")
    slow = _SlowOnly(tokenizer)
    ids = tokenizer.encode(" ".join(corpus(150)), add_special_tokens=False)
    assert len(ids) > 500
    detok = IncrementalDetokenizer(slow, [])
    text = "".join(detok.push([i]) for i in ids)
    assert text == tokenizer.decode(ids)
    assert max(slow.decode_sizes) < 20  # a window of recent tokens, never the whole output


# ---- finish: the request's last tokens (FINAL_ONLY text made once, at the end) ----------------------------

def _wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    """A decoder that rewrites text across tokens ("##" joins, cleanup): finish must step through it."""
    tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=300, special_tokens=["<unk>"] + SPECIALS,
                                                                show_progress=False))
    return _wrap(tok)


@pytest.mark.parametrize("name", list(BUILDERS) + ["wordpiece"])
@settings(max_examples=80, deadline=None)
@given(data=st.data(), skip=st.booleans(), bos=st.booleans())
def test_finish_equals_push_then_flush_fresh_or_mid_stream(name, data, skip, bos):
    """Random ids (byte tokens, special tokens and invalid byte runs included), after 0..3 pushes."""
    tokenizer = _wordpiece_tokenizer() if name == "wordpiece" else get_tokenizer(name)
    vocab = len(tokenizer)
    ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=30))
    pushed = data.draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3), max_size=3))
    prompt = ([tokenizer.bos_token_id] if bos else []) + tokenizer.encode("the capital of", add_special_tokens=False)

    def run(last):
        detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip)
        return "".join(detok.push(chunk) for chunk in pushed) + last(detok)

    assert run(lambda d: d.finish(ids)) == run(lambda d: d.push(ids) + d.flush())


@pytest.mark.parametrize("name", list(BUILDERS))
def test_finish_is_one_decode_for_per_token_decoders_and_steps_otherwise(name, monkeypatch):
    """Per-token decoders (byte-level, Metaspace, SentencePiece's chain) finish in one decode, never stepping
    DecodeStream; a WordPiece decoder and text with U+FFFD step through the tokens."""
    from tokenizers.decoders import DecodeStream

    tokenizer = get_tokenizer(name)
    steps = []
    real_step = DecodeStream.step

    class Counting:
        def __init__(self, *args, **kwargs):
            self.inner = DecodeStream(*args, **kwargs)

        def step(self, backend, token_id):
            steps.append(token_id)
            return real_step(self.inner, backend, token_id)

    monkeypatch.setattr("vllm_jax.engine.detokenizer._DecodeStream", Counting)
    out = tokenizer.encode(" héllo wörld 你好 🙂 café", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Paris", add_special_tokens=False))
    assert detok.finish(out) == tokenizer.decode(tokenizer.encode("Paris", add_special_tokens=False) + out)[5:]
    assert steps == []
    steps.clear()
    wordpiece = _wordpiece_tokenizer()
    IncrementalDetokenizer(wordpiece, []).finish(wordpiece.encode("the fox", add_special_tokens=False))
    assert steps
    if name == "byte_level":  # half of "🙂": the one decode shows U+FFFD, so the bytes are stepped
        steps.clear()
        half = byte_level_ids_for_bytes(tokenizer, "🙂")[:2]
        assert IncrementalDetokenizer(tokenizer, []).finish(half) == tokenizer.decode(half)
        assert steps == half
