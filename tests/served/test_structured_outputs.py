"""Structured outputs: llguidance grammars, the sampler's token bitmask, and the server's request fields.

A tiny random model writes random tokens, so a constraint is the only reason its output parses: every check here
fails if the bitmask is not applied, applied to the wrong row, or the matcher is not advanced. Schemas are bounded
(maxLength, enums, integer ranges, no free whitespace) so that every output completes within max_tokens.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from tests.helpers.http_checks import openai_error
from tests.helpers.live_server import MODEL, Served, serve, tiny_checkpoint, tiny_engine_args
from tests.helpers.tiny_models import EOS_ID, VOCAB_SIZE, byte_tokenizer
from vllm_jax import LLM, AsyncLLM, SamplingParams, StructuredOutputsParams
from vllm_jax.config import StructuredOutputsConfig
from vllm_jax.sample.metadata import RowSamplingInput, build_sampling_tensors
from vllm_jax.sample.sampler import apply_token_bitmask, sample
from vllm_jax.structured_output import GrammarCompiler, ReasoningTokens, RequestGrammar
from vllm_jax.utils import bitmask_width

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
REGEX = r"[a-c]{2,4}-[0-9]{2}"
CHOICES = ["yes", "no", "maybe"]
# EBNF (GBNF): a sum of one-digit numbers
GRAMMAR = 'root ::= num (" + " num)*\nnum ::= [0-9]'
MAX_MODEL_LEN = 128


def _bits(row: np.ndarray, vocab: int) -> np.ndarray:
    return np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab].astype(bool)


# ---- the device side ---------------------------------------------------------------------------------------

def test_bitmask_masks_logits_and_logprobs_see_the_mask():
    rng = np.random.default_rng(0)
    vocab = 70  # not a multiple of 32: the last word's high bits are padding
    logits = rng.standard_normal((3, vocab)).astype(np.float32)
    mask = rng.integers(-2**31, 2**31 - 1, (3, bitmask_width(vocab)), dtype=np.int64).astype(np.int32)
    mask[2] = -1  # a free row
    out = np.asarray(apply_token_bitmask(logits, mask))
    for i in range(3):
        allowed = _bits(mask[i], vocab)
        np.testing.assert_array_equal(out[i, allowed], logits[i, allowed])
        assert np.all(np.isneginf(out[i, ~allowed]))
    rows = [RowSamplingInput(SamplingParams(temperature=0.0, logprobs=2), 0, [1], [], 1, token_bitmask=mask[i])
            for i in range(2)] + [RowSamplingInput(SamplingParams(temperature=0.0, logprobs=2), 0, [1], [], 1)]
    tensors, k = build_sampling_tensors(rows, 4, vocab)
    assert tensors.is_full and tensors.token_bitmask.shape == (4, bitmask_width(vocab))
    assert np.all(tensors.token_bitmask[2:] == -1)  # rows without a grammar stay free
    result = sample(logits_padded := np.concatenate([logits, logits[:1]]), tensors, k)
    for i in range(3):
        allowed = _bits(tensors.token_bitmask[i], vocab)
        masked = np.where(allowed, logits_padded[i], -np.inf)
        assert int(result.token_ids[i]) == int(np.argmax(masked))
        expected = masked[int(result.token_ids[i])] - np.log(np.sum(np.exp(masked[allowed])))
        np.testing.assert_allclose(float(result.logprobs[i, 0]), expected, rtol=1e-5, atol=1e-5)
        assert all(allowed[t] for t in np.asarray(result.logprob_token_ids[i]))  # top-K never lists a masked token


# ---- grammars and matchers (host) -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(byte_tokenizer(), VOCAB_SIZE, [EOS_ID])


def test_compiler_caches_by_constraint_and_names_the_field_of_a_bad_one(compiler):
    a = compiler.compile(StructuredOutputsParams(json=PERSON))
    assert compiler.compile(StructuredOutputsParams(json=json.dumps(PERSON))) is a  # the cache, not a rebuild
    for params, field in [(StructuredOutputsParams(json={"type": "objekt"}), "structured_outputs.json"),
                          (StructuredOutputsParams(json="{not json"), "structured_outputs.json"),
                          (StructuredOutputsParams(regex="[a-z"), "structured_outputs.regex"),
                          (StructuredOutputsParams(grammar="root ::= ("), "structured_outputs.grammar")]:
        with pytest.raises(ValueError, match=re.escape(field)):
            compiler.compile(params)



def _accepts(compiler: GrammarCompiler, grammar: str, value: object) -> bool:
    """Whether `grammar` takes `value` as compact JSON, whole (the byte tokenizer: token id = 3 + byte)."""
    matcher = compiler.new_matcher(grammar)
    tokens = [3 + byte for byte in json.dumps(value, separators=(",", ":")).encode()]
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


def test_the_required_tool_call_grammar_refuses_extra_keys_in_a_call_object(compiler):
    """Issue #37: tool_choice "required" compiles call objects that hold exactly `name` and `parameters`."""
    from tests.unit.test_tool_choice import REQUIRED_EXTRA_KEYS, REQUIRED_GOOD, required_schema

    grammar = compiler.compile(StructuredOutputsParams(json=required_schema()))
    assert _accepts(compiler, grammar, REQUIRED_GOOD) and not _accepts(compiler, grammar, REQUIRED_EXTRA_KEYS)


OPEN_PERSON = {"type": "object", "properties": {"name": {"enum": ["ada", "bob"]}}, "required": ["name"]}


@pytest.mark.parametrize("config, extra_keys", [("{}", False), ('{"backend": "auto"}', False),
                                                ('{"backend": "guidance"}', True),
                                                ('{"backend": "guidance", "disable_additional_properties": true}',
                                                 False)])
def test_the_backend_reads_listed_properties_as_vllms_backend_of_that_name(config, extra_keys):
    """"auto" (the default) reads a schema as vLLM's default backend, xgrammar, does: an object that lists its
    properties gets no others; "guidance" as vLLM's guidance backend: others allowed unless
    disable_additional_properties. Either way a bare object (json_object) stays any object, and the required
    tool-call list still takes its calls (closing its bare `items` object made it unsatisfiable)."""
    from tests.unit.test_tool_choice import REQUIRED_GOOD, required_schema

    so = StructuredOutputsConfig.parse(config)
    compiler = GrammarCompiler(byte_tokenizer(), VOCAB_SIZE, [EOS_ID],
                               disable_additional_properties=so.closes_objects)
    person = compiler.compile(StructuredOutputsParams(json=OPEN_PERSON))
    assert _accepts(compiler, person, {"name": "ada"})
    assert _accepts(compiler, person, {"name": "ada", "age": 3}) == extra_keys
    nested = compiler.compile(StructuredOutputsParams(json={"type": "array", "items": OPEN_PERSON}))
    assert _accepts(compiler, nested, [{"name": "bob", "x": [1]}]) == extra_keys
    assert _accepts(compiler, compiler.compile(StructuredOutputsParams(json_object=True)), {"any": {"key": 1}})
    required = compiler.compile(StructuredOutputsParams(json=required_schema()))
    assert _accepts(compiler, required, [{"name": "get_weather", "parameters": {"city": "Rome"}}])
    assert _accepts(compiler, required, REQUIRED_GOOD) == extra_keys  # an argument the parameters do not list


def test_a_property_named_properties_is_not_taken_for_a_schema_map():
    """Closing objects walks `properties` by value: a property called "properties" keeps its own schema."""
    compiler = GrammarCompiler(byte_tokenizer(), VOCAB_SIZE, [EOS_ID], disable_additional_properties=True)
    schema = {"type": "object", "properties": {"properties": {"type": "integer"}}, "required": ["properties"]}
    grammar = compiler.compile(StructuredOutputsParams(json=schema))
    assert _accepts(compiler, grammar, {"properties": 7})
    assert not _accepts(compiler, grammar, {"properties": 7, "additionalProperties": False})


def test_reasoning_keeps_the_row_free_until_the_end_token(compiler):
    think, end = 259, 260  # stand-ins for <think> and </think> ('a', 'b' in the byte tokenizer)
    grammar = compiler.compile(StructuredOutputsParams(choice=["zz"]))
    tokens = ReasoningTokens(start_id=think, end_id=end)
    g = RequestGrammar(compiler.new_matcher(grammar), bitmask_width(VOCAB_SIZE), compiler.stop_token_ids, tokens,
                       prompt_token_ids=[1, think])
    assert g.next_token_bitmask() is None and g.accept(300) and g.accept(end)  # free while thinking
    allowed = np.nonzero(_bits(g.next_token_bitmask(), VOCAB_SIZE))[0].tolist()
    assert allowed == [259 + 25]  # only 'z' once the reasoning ended
    closed = RequestGrammar(compiler.new_matcher(grammar), bitmask_width(VOCAB_SIZE), compiler.stop_token_ids,
                            tokens, prompt_token_ids=[think, 5, end])  # a template that closed the reasoning
    assert closed.next_token_bitmask() is not None


# ---- the engine, offline ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    path = tiny_checkpoint(tmp_path_factory.mktemp("so"))
    return LLM(model=str(path), max_model_len=MAX_MODEL_LEN, max_num_seqs=8, max_num_batched_tokens=32,
               block_size=8, min_token_bucket=32, min_seq_bucket=8)  # one bucket: one forward to compile


def _constrained(seed: int, **constraint) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=80,
                          structured_outputs=StructuredOutputsParams(**constraint))


def test_every_constrained_output_is_valid_and_free_rows_are_untouched(llm):
    free = SamplingParams(temperature=0.0, max_tokens=12)
    alone = llm.generate(["hello"], free, use_tqdm=False)[0].outputs[0].token_ids
    compiled = llm.llm_engine.runner.num_compilations
    params = [_constrained(s, json=PERSON, disable_any_whitespace=True) for s in range(4)]
    params += [_constrained(s, regex=REGEX) for s in range(3)]
    params += [_constrained(s, choice=CHOICES) for s in range(3)]
    params += [_constrained(s, grammar=GRAMMAR) for s in range(2)]
    params += [_constrained(0, json_object=True, disable_any_whitespace=True), free]
    outs = llm.generate(["hello"] * len(params), params, use_tqdm=False)
    texts = [o.outputs[0].text for o in outs]
    for text in texts[:4]:
        jsonschema.validate(json.loads(text), PERSON)
    assert all(re.fullmatch(REGEX, t) for t in texts[4:7]), texts[4:7]
    assert all(t in CHOICES for t in texts[7:10]), texts[7:10]
    assert all(re.fullmatch(r"[0-9]( \+ [0-9])*", t) for t in texts[10:12]), texts[10:12]
    assert all(o.outputs[0].finish_reason == "stop" for o in outs[:12])
    assert outs[12].outputs[0].finish_reason == "length" or isinstance(json.loads(texts[12]), dict)
    assert outs[-1].outputs[0].token_ids == alone  # a free request in a constrained batch samples as alone
    assert llm.llm_engine.runner.num_compilations == compiled  # the bitmask variant was compiled in warm-up
    assert llm.llm_engine.kv_cache_manager.num_free_blocks == llm.llm_engine.runner.num_blocks - 1


def test_seeded_constrained_output_does_not_depend_on_the_batch_and_n_gives_each_its_own_matcher(llm):
    p = SamplingParams(temperature=1.0, seed=7, max_tokens=80, n=3,
                       structured_outputs=StructuredOutputsParams(json=PERSON, disable_any_whitespace=True))
    alone = [c.text for c in llm.generate(["hi"], p, use_tqdm=False)[0].outputs]
    mixed = llm.generate(["hi", "other prompt"], [p, _constrained(1, regex=REGEX)], use_tqdm=False)
    assert [c.text for c in mixed[0].outputs] == alone
    for text in alone:
        jsonschema.validate(json.loads(text), PERSON)


def test_bad_constraints_are_value_errors_and_the_engine_lives_on(llm):
    for constraint in [dict(json={"type": "objekt"}), dict(regex="(unclosed"), dict(grammar="root ::= [")]:
        with pytest.raises(ValueError, match="structured_outputs"):
            llm.generate(["x"], _constrained(0, **constraint), use_tqdm=False)
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json=PERSON, regex="a")
    out = llm.generate(["x"], _constrained(0, choice=CHOICES), use_tqdm=False)[0].outputs[0]
    assert out.text in CHOICES
    assert not llm.llm_engine.has_unfinished_requests()


def test_structured_outputs_config_flag_is_validated():
    assert StructuredOutputsConfig.parse('{"backend": "auto", "disable_any_whitespace": true}') == \
        StructuredOutputsConfig(disable_any_whitespace=True)
    assert StructuredOutputsConfig.parse(None).closes_objects
    assert not StructuredOutputsConfig.parse('{"backend": "guidance"}').closes_objects
    for bad, match in [('{"backend": "xgrammar"}', "backend"), ('{"whitespace": 1}', "unknown keys"),
                       ("[1]", "JSON object"), ("{", "JSON object"),
                       ('{"disable_any_whitespace": "yes"}', "disable_any_whitespace")]:
        with pytest.raises(ValueError, match=match):
            StructuredOutputsConfig.parse(bad)


# ---- the server --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Served]:
    # Server-wide compact JSON: a random model given free whitespace writes little else.
    args = tiny_engine_args(tiny_checkpoint(tmp_path_factory.mktemp("so-server")), max_model_len=MAX_MODEL_LEN,
                            num_gpu_blocks_override=160,
                            structured_outputs_config='{"disable_any_whitespace": true}')
    served = serve(AsyncLLM.from_engine_args(args))
    yield served
    served.stop()


def _post(server: Served, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": MODEL, **body}, timeout=120)


def test_server_response_format_and_structured_outputs_on_chat_and_completions(server):
    chat = [{"role": "user", "content": "who?"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    person = _post(server, "/v1/chat/completions", {"messages": chat, "response_format": fmt, "seed": 1,
                                                     "max_tokens": 60})
    assert person.status_code == 200, person.text
    text = person.json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), PERSON)
    obj = _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 40, "seed": 3,
                                            "response_format": {"type": "json_object"}})
    assert obj.status_code == 200, obj.text
    choice = obj.json()["choices"][0]
    assert choice["text"].startswith("{")
    assert choice["finish_reason"] == "length" or isinstance(json.loads(choice["text"]), dict)
    for body, check in [({"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
                        ({"structured_outputs": {"regex": REGEX}}, lambda t: re.fullmatch(REGEX, t)),
                        ({"structured_outputs": {"grammar": GRAMMAR}},
                         lambda t: re.fullmatch(r"[0-9]( \+ [0-9])*", t))]:
        for path, extra in [("/v1/completions", {"prompt": "q"}), ("/v1/chat/completions", {"messages": chat})]:
            resp = _post(server, path, {**extra, **body, "max_tokens": 30, "seed": 2})
            assert resp.status_code == 200, resp.text
            c = resp.json()["choices"][0]
            assert check(c["text"] if "text" in c else c["message"]["content"]), c


def test_server_streams_constrained_output(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "?"}], stream=True,
                                            max_tokens=30, seed=4, extra_body={"structured_outputs":
                                                                               {"regex": REGEX}})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert re.fullmatch(REGEX, text), text


def test_server_bad_constraints_are_400s_naming_the_field(server):
    chat = [{"role": "user", "content": "?"}]
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
         "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, None),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "root ::= ["}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
    ]
    for body, param in cases:
        for path, extra in [("/v1/completions", {"prompt": "q"}), ("/v1/chat/completions", {"messages": chat})]:
            err = openai_error(_post(server, path, {**extra, **body, "max_tokens": 5}), 400)
            if param is not None:
                assert err["param"] == param, (body, err)
    ok = _post(server, "/v1/completions", {"prompt": "q", "max_tokens": 5, "structured_outputs": {"choice": ["ok"]}})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "ok"


def test_server_compiles_grammars_off_the_engine_thread(server, monkeypatch):
    compiler = server.engine.grammar_compiler
    threads: list[str] = []
    compile_on = compiler.compile

    def recording(params):
        if params.compiled_grammar is None:  # a real compile (the engine thread only finds the grammar already set)
            threads.append(threading.current_thread().name)
        return compile_on(params)

    monkeypatch.setattr(compiler, "compile", recording)
    resp = _post(server, "/v1/completions", {"prompt": "q", "max_tokens": 8,
                                             "structured_outputs": {"regex": "[0-9]{3}z"}})
    assert resp.status_code == 200 and re.fullmatch("[0-9]{3}z", resp.json()["choices"][0]["text"])
    engine_threads = {t.name for t in threading.enumerate() if "engine" in t.name}
    assert threads and not set(threads) & engine_threads, (threads, engine_threads)


def test_reasoning_parser_starts_the_constraint_after_the_end_tag(tmp_path):
    """With --reasoning-parser the engine keeps a row free until `</think>` is sampled (logit_bias makes the random
    model write it first), then constrains; a prompt that already closed its reasoning is constrained at once."""
    path = tiny_checkpoint(tmp_path)
    tokenizer = byte_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.save_pretrained(path)
    think, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    llm = LLM(model=str(path), max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=8,
              min_token_bucket=16, min_seq_bucket=4, reasoning_parser="deepseek_r1")
    assert llm.llm_engine.reasoning_tokens == ReasoningTokens(start_id=think, end_id=end)
    params = SamplingParams(temperature=0.0, max_tokens=8, logit_bias={end: 100.0},
                            structured_outputs=StructuredOutputsParams(choice=["zz"]))
    thinking, closed = llm.generate([[1, think, 259], [1, think, 259, end]], params, use_tqdm=False)
    assert thinking.outputs[0].token_ids[:3] == [end, 284, 284], thinking.outputs[0].token_ids
    assert closed.outputs[0].token_ids[:2] == [284, 284], closed.outputs[0].token_ids
