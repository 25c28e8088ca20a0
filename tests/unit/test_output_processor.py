"""OutputProcessor: stop strings, n > 1 aggregation, output kinds, logprobs, aborts.

Core outputs are built by hand (one token per step, as the scheduler sends them); the tokenizer is a
byte-level BPE trained here, so nothing is downloaded.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from vllm_jax.engine.output_processor import OutputProcessor, child_request_ids
from vllm_jax.outputs import Logprob
from vllm_jax.sampling_params import RequestOutputKind, SamplingParams
from vllm_jax.scheduler.output import EngineCoreOutput

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
WORDS = ["hello", "world", "héllo", "wörld", "你好", "🙂", "the", "stop", "here", "END", "fox", ",", ".", "\n"]


def _build_tokenizer() -> PreTrainedTokenizerFast:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))) for _ in range(300)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   clean_up_tokenization_spaces=False)


TOK = _build_tokenizer()
EOS = TOK.eos_token_id
PROMPT = TOK.encode("the fox", add_special_tokens=False)


def enc(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def make(params: SamplingParams, request_id: str = "r", prompt_ids: list[int] = PROMPT) -> OutputProcessor:
    proc = OutputProcessor(TOK)
    proc.add_request(request_id, "the fox", prompt_ids, params, arrival_time=0.0)
    return proc


def run(proc: OutputProcessor, req_id: str, ids: list[int], finish: str | None = None, stop_reason=None):
    """Feed `ids` one per step; the last step carries `finish`. Returns (request outputs, aborts)."""
    outputs, aborts = [], []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        processed = proc.process_outputs([EngineCoreOutput(
            req_id, [token], finish_reason=finish if last else None, stop_reason=stop_reason if last else None)])
        outputs += processed.request_outputs
        aborts += processed.reqs_to_abort
    return outputs, aborts


def test_stop_string_truncates_text_finishes_and_asks_the_engine_to_stop_the_request():
    proc = make(SamplingParams(stop=["stop"], max_tokens=100))
    outs, aborts = run(proc, "r", enc("hello world stop here"))
    final = outs[-1]
    assert final.finished and final.outputs[0].text == "hello world "
    assert final.outputs[0].finish_reason == "stop" and final.outputs[0].stop_reason == "stop"
    assert aborts == ["r"] and not proc.has_unfinished_requests()


def test_include_stop_str_in_output_keeps_the_stop_string():
    proc = make(SamplingParams(stop=["stop"], include_stop_str_in_output=True))
    outs, _ = run(proc, "r", enc("hello world stop here"))
    assert outs[-1].outputs[0].text == "hello world stop"


def test_stop_string_spanning_two_tokens_is_found():
    ids = enc("hello world here")
    pieces = [TOK.decode([i]) for i in ids]
    assert not any("o w" in p for p in pieces)  # the stop string lies across a token boundary
    proc = make(SamplingParams(stop=["o w"]))
    outs, aborts = run(proc, "r", ids)
    assert outs[-1].outputs[0].text == "hell" and outs[-1].outputs[0].stop_reason == "o w" and aborts == ["r"]


def test_earliest_of_several_stop_strings_wins():
    proc = make(SamplingParams(stop=["here", "world"]))
    outs, _ = run(proc, "r", enc("hello world here"))
    assert outs[-1].outputs[0].text == "hello " and outs[-1].outputs[0].stop_reason == "world"


@settings(max_examples=80, deadline=None)
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=15), data=st.data(),
       kind=st.sampled_from([DELTA, CUMULATIVE]))
def test_streamed_text_never_shows_what_a_stop_string_later_removes(words, data, kind):
    text = " ".join(words)
    start = data.draw(st.integers(0, len(text) - 1))
    stop = text[start:start + data.draw(st.integers(1, 6))]
    proc = make(SamplingParams(stop=[stop], output_kind=kind, max_tokens=1000))
    ids = enc(text)
    outs, _ = run(proc, "r", ids, finish="length")
    expected = text[:text.find(stop)]
    seen = ""
    for out in outs:
        chunk = out.outputs[0].text
        seen = seen + chunk if kind == DELTA else chunk
        assert expected.startswith(seen), (seen, expected)  # never ahead of the final text
    assert seen == expected and outs[-1].finished


def test_hold_back_keeps_only_text_that_could_start_a_stop_string():
    proc = make(SamplingParams(stop=["world!"], output_kind=DELTA))
    outs, _ = run(proc, "r", enc("hello wor"))
    assert "".join(o.outputs[0].text for o in outs) == "hello "  # "wor" could still become "world!"
    proc = make(SamplingParams(stop=["\n\n"], output_kind=DELTA))
    outs, _ = run(proc, "r", enc("hello world"))
    assert "".join(o.outputs[0].text for o in outs) == "hello world"  # nothing here can start "\n\n"


def test_stop_token_finish_passes_through_and_its_text_is_excluded_unless_asked():
    ids = enc("hello") + [EOS]
    for include, text in [(False, "hello"), (True, "hello</s>")]:
        proc = make(SamplingParams(skip_special_tokens=False, include_stop_str_in_output=include))
        outs, aborts = run(proc, "r", ids, finish="stop", stop_reason=EOS)
        out = outs[-1].outputs[0]
        assert (out.text, out.finish_reason, out.stop_reason, out.token_ids) == (text, "stop", EOS, ids)
        assert aborts == []


@pytest.mark.parametrize("reason", ["length", "abort"])
def test_length_and_abort_finish_reasons_pass_through(reason):
    proc = make(SamplingParams(stop=["zzz"]))
    outs, aborts = run(proc, "r", enc("hello world"), finish=reason)
    out = outs[-1].outputs[0]
    assert outs[-1].finished and out.finish_reason == reason and out.stop_reason is None
    assert out.text == "hello world" and aborts == [] and not proc.has_unfinished_requests()


def test_n2_aggregates_children_and_finishes_only_when_both_finished():
    params = SamplingParams(n=2, output_kind=CUMULATIVE)
    proc = make(params)
    c0, c1 = child_request_ids("r", 2)
    assert (c0, c1) == ("0_r", "1_r") and child_request_ids("r", 1) == ["r"]
    a, b = enc("hello"), enc("world")
    out = proc.process_outputs([EngineCoreOutput(c0, a, "length"), EngineCoreOutput(c1, b[:1])]).request_outputs
    assert len(out) == 1 and not out[0].finished
    assert [(c.index, c.finish_reason) for c in out[0].outputs] == [(0, "length"), (1, None)]
    out = proc.process_outputs([EngineCoreOutput(c1, b[1:], "length")]).request_outputs
    assert out[0].finished and [c.text for c in out[0].outputs] == ["hello", "world"]
    assert not proc.has_unfinished_requests()


def test_n2_delta_sends_only_the_completions_that_changed():
    proc = make(SamplingParams(n=2, output_kind=DELTA))
    a, b = enc("hello world"), enc("the fox")
    first = proc.process_outputs([EngineCoreOutput("0_r", a[:1]), EngineCoreOutput("1_r", b[:1])]).request_outputs
    assert [c.index for c in first[0].outputs] == [0, 1]
    second = proc.process_outputs([EngineCoreOutput("1_r", b[1:])]).request_outputs
    assert [c.index for c in second[0].outputs] == [1]
    assert second[0].outputs[0].token_ids == b[1:] and first[0].outputs[1].text + second[0].outputs[0].text == "the fox"


def test_n2_stop_string_in_one_child_stops_only_that_child():
    proc = make(SamplingParams(n=2, stop=["world"], output_kind=FINAL_ONLY))
    res = proc.process_outputs([EngineCoreOutput("0_r", enc("hello world")), EngineCoreOutput("1_r", enc("hi"))])
    assert res.reqs_to_abort == ["0_r"] and res.request_outputs == []
    res = proc.process_outputs([EngineCoreOutput("0_r", enc(" late")), EngineCoreOutput("1_r", enc("!"), "length")])
    (final,) = res.request_outputs
    assert [c.text for c in final.outputs] == ["hello ", "hi!"] and final.finished


def test_output_kinds_cumulative_delta_and_final_only():
    ids = enc("hello world, the fox")
    cum, _ = run(make(SamplingParams(output_kind=CUMULATIVE)), "r", ids, finish="length")
    delta, _ = run(make(SamplingParams(output_kind=DELTA)), "r", ids, finish="length")
    final, _ = run(make(SamplingParams(output_kind=FINAL_ONLY)), "r", ids, finish="length")
    assert len(cum) == len(delta) == len(ids) and len(final) == 1
    assert [len(o.outputs[0].token_ids) for o in cum] == list(range(1, len(ids) + 1))
    assert all(len(o.outputs[0].token_ids) == 1 for o in delta)
    assert "".join(o.outputs[0].text for o in delta) == cum[-1].outputs[0].text == final[0].outputs[0].text
    assert final[0].outputs[0].token_ids == ids and [o.finished for o in delta][-2:] == [False, True]


def test_logprobs_dicts_keep_sampled_plus_top_n_and_sum_cumulative_logprob():
    proc = make(SamplingParams(logprobs=2))
    steps = [  # (token_ids, logprobs, ranks): sampled first, then the top-N (plus one extra to drop)
        ([7, 9, 11, 13], [-2.0, -0.1, -0.5, -3.0], [3, 1, 2, 4]),  # sampled not in top-2: 3 entries
        ([9, 9, 11, 13], [-0.2, -0.2, -0.9, -3.0], [1, 1, 2, 3]),  # sampled is the top-1: 2 entries
    ]
    out = None
    for i, entry in enumerate(steps):
        out = proc.process_outputs([EngineCoreOutput("r", [entry[0][0]], "length" if i else None,
                                                     new_logprobs=[entry])]).request_outputs[-1]
    comp = out.outputs[0]
    assert comp.logprobs[0] == {7: Logprob(-2.0, 3, TOK.decode([7])), 9: Logprob(-0.1, 1, TOK.decode([9])),
                                11: Logprob(-0.5, 2, TOK.decode([11]))}
    assert list(comp.logprobs[1]) == [9, 11] and comp.logprobs[1][9].rank == 1
    assert comp.cumulative_logprob == pytest.approx(-2.2)


def test_cumulative_logprob_is_none_without_logprobs():
    outs, _ = run(make(SamplingParams()), "r", enc("hello"), finish="length")
    assert outs[-1].outputs[0].cumulative_logprob is None and outs[-1].outputs[0].logprobs is None


def test_prompt_logprobs_concatenate_chunks_after_a_leading_none():
    prompt = enc("hello world the fox")
    proc = make(SamplingParams(prompt_logprobs=1, output_kind=FINAL_ONLY), prompt_ids=prompt)
    entries = [([t, 5], [-1.0 - i, -0.5], [2, 1]) for i, t in enumerate(prompt[1:])]
    half = len(entries) // 2
    assert proc.process_outputs([EngineCoreOutput("r", [], new_prompt_logprobs=entries[:half])]).request_outputs == []
    proc.process_outputs([EngineCoreOutput("r", [], new_prompt_logprobs=entries[half:])])
    (final,) = proc.process_outputs([EngineCoreOutput("r", enc("!"), "length")]).request_outputs
    pl = final.prompt_logprobs
    assert len(pl) == len(prompt) and pl[0] is None
    assert [next(iter(d)) for d in pl[1:]] == prompt[1:]
    assert pl[2][prompt[2]].logprob == -2.0 and pl[1][5] == Logprob(-0.5, 1, TOK.decode([5]))


def test_abort_drops_parent_and_children_and_returns_unfinished_child_ids():
    proc = make(SamplingParams(n=3))
    proc.process_outputs([EngineCoreOutput("2_r", enc("hi"), "length")])
    assert proc.get_num_unfinished_requests() == 1
    assert sorted(proc.abort_requests(["r"])) == ["0_r", "1_r"]
    assert not proc.has_unfinished_requests() and proc.get_num_unfinished_requests() == 0
    assert proc.process_outputs([EngineCoreOutput("0_r", enc("late"))]).request_outputs == []
    assert proc.abort_requests(["r", "unknown"]) == []


def _abort_after_steps(kind: RequestOutputKind, **params) -> tuple[list, object]:
    """n=2 with stop string "END": child 0 finishes by length, child 1 is mid-stream (its "E" held back as a
    possible start of "END") when the request is aborted."""
    proc = make(SamplingParams(n=2, stop=["END"], output_kind=kind, **params))
    sent = [o for o in (proc.process_outputs([EngineCoreOutput("0_r", enc("the fox"), "length"),
                                              EngineCoreOutput("1_r", enc("hello world"))]).request_outputs +
                        proc.process_outputs([EngineCoreOutput("1_r", enc(" E"))]).request_outputs)]
    final = proc.aborted_output("r")
    assert proc.abort_requests(["r"]) == ["1_r"] and proc.aborted_output("r") is None
    return sent, final


def test_aborted_cumulative_output_repeats_what_was_sent_and_ends_the_rest_with_abort():
    sent, final = _abort_after_steps(CUMULATIVE, logprobs=0)
    assert final.finished and final.request_id == "r" and final.prompt_token_ids == PROMPT
    assert [(c.index, c.finish_reason) for c in final.outputs] == [(0, "length"), (1, "abort")]
    last = sent[-1].outputs[1]
    assert final.outputs[1].text == last.text and last.text.startswith("hello world") and "E" not in last.text
    assert final.outputs[1].token_ids == last.token_ids
    assert final.outputs[1].logprobs == last.logprobs and final.outputs[0].text == "the fox"


def test_aborted_delta_output_ends_only_the_unfinished_completions_with_nothing_new():
    sent, final = _abort_after_steps(DELTA)
    assert [(c.index, c.text, c.token_ids, c.finish_reason) for c in final.outputs] == [(1, "", [], "abort")]
    streamed = "".join(c.text for o in sent for c in o.outputs if c.index == 1)
    assert streamed.startswith("hello world") and "E" not in streamed


def test_aborted_final_only_output_is_the_first_and_ends_every_completion_with_abort():
    sent, final = _abort_after_steps(FINAL_ONLY)
    assert sent == [] and [(c.index, c.text, c.finish_reason) for c in final.outputs] == [(0, "", "abort"),
                                                                                           (1, "", "abort")]


def test_aborted_cumulative_output_before_any_output_has_empty_completions():
    proc = make(SamplingParams(n=2, output_kind=CUMULATIVE))
    final = proc.aborted_output("r")
    assert [(c.text, c.token_ids, c.logprobs, c.finish_reason) for c in final.outputs] == [("", [], None, "abort")] * 2
    assert proc.aborted_output("0_r") is None  # only a parent id names a request


def test_outputs_for_unknown_ids_are_ignored():
    proc = make(SamplingParams())
    res = proc.process_outputs([EngineCoreOutput("ghost", enc("boo"), "length"), EngineCoreOutput("r", enc("hi"))])
    assert [o.request_id for o in res.request_outputs] == ["r"] and res.reqs_to_abort == []


def test_num_cached_tokens_comes_from_the_first_core_output():
    proc = make(SamplingParams())
    proc.process_outputs([EngineCoreOutput("r", enc("a"), num_cached_tokens=16)])
    (out,) = proc.process_outputs([EngineCoreOutput("r", enc("b"), "length", num_cached_tokens=0)]).request_outputs
    assert out.num_cached_tokens == 16


def test_detokenize_false_returns_tokens_without_text():
    proc = make(SamplingParams(detokenize=False, logprobs=0))
    ids = enc("hello")
    (out,) = proc.process_outputs([EngineCoreOutput("r", ids, "length", new_logprobs=[([ids[0]], [-1.0], [1])])]
                                  ).request_outputs
    comp = out.outputs[0]
    assert comp.text == "" and comp.token_ids == ids and comp.logprobs == [{ids[0]: Logprob(-1.0, 1, None)}]


def test_stop_strings_are_ignored_until_min_tokens():
    ids = enc("stop hello stop")
    proc = make(SamplingParams(stop=["stop"], min_tokens=2, include_stop_str_in_output=True))
    outs, _ = run(proc, "r", ids)
    assert outs[-1].outputs[0].text == "stop hello stop" and outs[-1].outputs[0].finish_reason == "stop"


def test_final_text_matches_decode_when_generation_ends_inside_a_character():
    emoji_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str("🙂")[0][0]
    ids = enc("hello") + [TOK.convert_tokens_to_ids(c) for c in emoji_bytes[:2]]  # max_tokens cut the emoji
    outs, _ = run(make(SamplingParams(output_kind=DELTA)), "r", ids, finish="length")
    assert all("\ufffd" not in o.outputs[0].text for o in outs[:-1])
    assert "".join(o.outputs[0].text for o in outs) == TOK.decode(ids) and TOK.decode(ids).endswith("\ufffd")


@settings(max_examples=60, deadline=None)
@given(data=st.data(), include=st.booleans(), skip=st.booleans(), finish=st.sampled_from(["length", "stop"]))
def test_final_only_text_made_at_the_end_equals_the_streamed_text(data, include, skip, finish):
    """FINAL_ONLY without stop strings makes each completion's text once, when it ends; that text is the one
    DELTA streams (random ids: split characters, special tokens; steps of 1-3 tokens; two children ending at
    different steps; the stop token excluded unless asked)."""
    seqs = [data.draw(st.lists(st.integers(0, len(TOK) - 1), min_size=1, max_size=25)) for _ in range(2)]
    if finish == "stop":
        seqs = [s + [EOS] for s in seqs]
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    texts = {}
    for kind in (DELTA, FINAL_ONLY):
        proc = make(SamplingParams(n=2, output_kind=kind, skip_special_tokens=skip,
                                   include_stop_str_in_output=include))
        outputs, pos, step = [], [0, 0], 0
        while pos != [len(s) for s in seqs]:
            core = []
            for child, seq in enumerate(seqs):
                if pos[child] == len(seq):
                    continue
                size = sizes[(step + child) % len(sizes)]
                chunk, pos[child] = seq[pos[child]:pos[child] + size], min(pos[child] + size, len(seq))
                end = pos[child] >= len(seq)
                core.append(EngineCoreOutput(f"{child}_r", chunk, finish if end else None,
                                             EOS if end and finish == "stop" else None))
            if kind == FINAL_ONLY and step:  # the text waits for the end
                assert all(c.text == "" for c in proc._requests["r"].children if c.finish_reason is None)
            outputs += proc.process_outputs(core).request_outputs
            step += 1
        texts[kind] = ["".join(o.text for out in outputs for o in out.outputs if o.index == i) for i in range(2)]
        if kind == FINAL_ONLY:
            assert len(outputs) == 1 and [o.token_ids for o in outputs[0].outputs] == seqs
    assert texts[FINAL_ONLY] == texts[DELTA]
