"""Structured output (inference/chat/constraint.py): JSON schemas, regexes and GBNF grammars that
every generated token must fit. Without the model: refused schemas name what is unsupported, the
mask kernel, EOG allowed exactly when the grammar accepts, forced tokens, llama.cpp's check-first
sampling. With both starter models: every schema of tests/data/json_schemas.json gives output
that validates with jsonschema, every grammar of tests/data/grammars/ output that parses, through
Engine.generate, the scheduler and `llamatui run`."""
import gc
import json
import pathlib
import queue
import weakref

import jsonschema
import numpy as np
import pytest
import regex

from llamatui.app.cli import run as cmd_run
from llamatui.app.cli import main
from llamatui.inference import ConstraintError, ConstraintSpec, Engine, LoadConfig, SamplingParams
from llamatui.inference.chat.constraint import Constraint, ConstraintVocab, _apply_mask
from llamatui.inference.sampling import Sampler
from llamatui.inference.tokenizers.tokenizer import Tokenizer
from test_vocab_files import llama_vocabs  # noqa: F401 - a fixture: llama.cpp's test vocabularies

DATA = pathlib.Path(__file__).resolve().parent / "data"
SCHEMAS = json.loads((DATA / "json_schemas.json").read_text())
MISSING = "/nonexistent/model.gguf"


def _validate(text: str, schema: dict) -> None:
    """jsonschema's verdict under the schema's own draft, formats checked too."""
    cls = jsonschema.validators.validator_for(schema)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(json.loads(text))


# --------------------------------------------------------------------------------------------
# the test data itself


def test_the_schema_file_covers_what_llama_cpp_skips():
    assert len(SCHEMAS) >= 50
    for entry in SCHEMAS:
        jsonschema.validators.validator_for(entry["schema"]).check_schema(entry["schema"])
    text = json.dumps([e["schema"] for e in SCHEMAS])
    for keyword in ('"anyOf"', '"oneOf"', '"allOf"', '"$ref"', '"prefixItems"', '"minimum"',
                    '"exclusiveMaximum"', '"additionalProperties"', '"format"', '"pattern"',
                    '"enum"', '"const"', '"maxItems"'):
        assert keyword in text, keyword
    mixed = [e for e in SCHEMAS if "anyOf" in e["schema"] and "properties" in e["schema"]]
    assert mixed, "anyOf mixed with properties"


# --------------------------------------------------------------------------------------------
# specs and refusals (no model)


@pytest.mark.parametrize("kind,source,words", [
    ("yaml", "x", "constraint kind must be one of json_schema, json_object, regex, lark, gbnf"),
    ("json_schema", "{not json", "the JSON schema is not valid JSON"),
    ("json_schema", [1, 2], "a JSON schema must be a JSON object, got list"),
    ("json_schema", True, "give an object"),
    ("json_object", "{}", "takes no source"),
    ("gbnf", "  ", "a gbnf constraint needs its text"),
    ("regex", None, "a regex constraint needs its text"),
])
def test_malformed_specs_are_refused_when_made(kind, source, words):
    with pytest.raises(ConstraintError, match=regex.escape(words)):
        ConstraintSpec(kind, source)


@pytest.mark.parametrize("kind,source,words", [
    ("json_schema", {"not": {"type": "string"}}, 'Unimplemented keys: ["not"]'),
    ("json_schema", {"type": "array", "uniqueItems": True}, 'Unimplemented keys: ["uniqueItems"]'),
    ("json_schema", {"type": "object", "propertyNames": {"maxLength": 3}},
     'Unimplemented keys: ["propertyNames"]'),
    ("json_schema", {"if": {"type": "string"}, "then": {"minLength": 2}}, '"if", "then"'),
    ("json_schema", {"type": "string", "format": "colour"}, "Unknown format: colour"),
    ("json_schema", {"$ref": "#/$defs/missing"}, "'/$defs/missing' does not exist"),
    ("json_schema", {"type": "integer", "minimum": 5, "maximum": 3},
     "minimum (5) is greater than maximum (3)"),
    ("regex", "[a-z", "unclosed character class"),
    ("lark", "start: item\n", 'unknown name: "item"'),
    ("gbnf", 'root ::= "a" | missing', "Rule 'missing' not found"),
    ("gbnf", 'root ::= ("a"', "Expected ')'"),
])
def test_what_the_library_refuses_is_named(kind, source, words):
    spec = ConstraintSpec(kind, source)
    with pytest.raises(ConstraintError) as info:
        spec.compile()
    assert words in str(info.value) and str(info.value).startswith("cannot use this ")


def test_every_test_grammar_and_schema_compiles():
    for path in sorted((DATA / "grammars").glob("*.gbnf")):
        ConstraintSpec("gbnf", path.read_text()).compile()
    for entry in SCHEMAS:
        ConstraintSpec("json_schema", entry["schema"]).compile()


def test_mask_kernel_matches_the_bits():
    rng = np.random.default_rng(0)
    for n_vocab, n_words in ((100, 4), (1000, 32), (70, 2)):  # the last: logits past the mask
        words = rng.integers(0, 2**32, n_words, dtype=np.uint64).astype(np.uint32)
        words[0], words[1] = 0, 0xFFFFFFFF  # whole words cleared / kept
        logits = rng.standard_normal(n_vocab).astype(np.float32)
        out = np.empty_like(logits)
        _apply_mask(logits, words, out)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
        allowed = np.zeros(n_vocab, bool)
        allowed[:min(n_vocab, bits.size)] = bits[:n_vocab]
        assert np.array_equal(out[allowed], logits[allowed])
        assert np.all(out[~allowed] == -np.inf)


# --------------------------------------------------------------------------------------------
# a constraint over SmolLM2's vocabulary (no model)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return Tokenizer.from_gguf(smollm2_path)


def _constraint(tokenizer, kind, source=None):
    return Constraint.build(tokenizer, tokenizer.n_vocab, ConstraintSpec(kind, source))


def _allowed(c, tokenizer):
    return np.isfinite(c.masked(np.zeros(tokenizer.n_vocab, np.float32)))


def test_the_vocabulary_is_built_once_per_tokenizer(tokenizer):
    assert ConstraintVocab.of(tokenizer) is ConstraintVocab.of(tokenizer)
    assert ConstraintVocab.of(tokenizer).ll.vocab_size == tokenizer.n_vocab


def test_the_vocabulary_goes_with_its_tokenizer(smollm2_path):
    """An app that loads model after model must not keep every vocabulary."""
    tok = Tokenizer.from_gguf(smollm2_path)
    c = _constraint(tok, "regex", "[a-z]+")
    alive = weakref.ref(tok)
    del tok, c
    gc.collect()
    assert alive() is None


def test_eog_is_allowed_exactly_when_the_grammar_accepts(tokenizer):
    c = _constraint(tokenizer, "regex", "[0-9]{1,3}")
    eog = sorted(tokenizer.eog_ids)
    assert len(eog) > 1  # the whole set is handled, not only the EOS llguidance knows
    assert not _allowed(c, tokenizer)[eog].any() and not any(c.allows(t) for t in eog)
    c.commit(tokenizer.encode("4", add_special=False)[0])
    assert c.accepting and not c.done
    assert _allowed(c, tokenizer)[eog].all() and all(c.allows(t) for t in eog)
    for digit in "27":
        c.commit(tokenizer.encode(digit, add_special=False)[0])
    assert c.done  # three digits: nothing but EOG may follow
    allowed = _allowed(c, tokenizer)
    assert set(np.nonzero(allowed)[0]) == set(eog)


def test_control_tokens_can_never_be_spelled(tokenizer):
    c = _constraint(tokenizer, "regex", "(.|\n){0,40}")  # any text at all
    allowed = _allowed(c, tokenizer)
    im_start = tokenizer.token_to_id("<|im_start|>")
    assert not allowed[im_start] and allowed.sum() > 40000


def test_forced_text_comes_as_tokens_without_sampling(tokenizer):
    schema = {"type": "object", "properties": {"low": {"type": "integer"},
                                               "high": {"type": "integer"}},
              "required": ["low", "high"], "additionalProperties": False}
    c = _constraint(tokenizer, "json_schema", schema)
    start = c.take_forced()  # the first key is the only way to begin
    assert tokenizer.decode(start) == '{"low":' and c.take_forced() == []
    for piece in (" ", "2", ","):
        forced = c.commit(tokenizer.encode(piece, add_special=False)[0])
    assert tokenizer.decode(forced) == ' "high":'  # the comma leaves one key possible
    assert c.n_forced == len(start) + len(forced) and c.n_tokens == c.n_forced + 3


def test_check_first_sampling_equals_masking_first_when_greedy(tokenizer):
    """llama.cpp's trick: the chain's own choice is kept when the grammar allows it; otherwise
    the mask is computed. Greedy, both give the argmax of the allowed logits."""
    rng = np.random.default_rng(1)
    sampler = Sampler(SamplingParams(temperature=0), tokenizer.n_vocab)
    c = _constraint(tokenizer, "regex", "[a-z]+( [a-z]+){0,5}")
    digit = tokenizer.encode("7", add_special=False)[0]
    word = tokenizer.encode("hello", add_special=False)[0]
    for favourite, rejected in ((word, False), (digit, True)):
        logits = rng.standard_normal(tokenizer.n_vocab).astype(np.float32)
        logits[favourite] = 30.0
        n_masks = c.n_masks
        token = c.sample(sampler, logits)
        expected = int(np.argmax(np.where(_allowed(c, tokenizer), logits, -np.inf)))
        assert token == expected and (token == favourite) != rejected
        assert c.n_masks == n_masks + rejected


NUMBER_IN_AN_OBJECT = {"type": "object", "additionalProperties": False, "required": ["s", "n"],
                       "properties": {"s": {"type": "string", "maxLength": 40},
                                      "n": {"type": "number"}}}


@pytest.mark.parametrize("schema", [{"type": "number"}, NUMBER_IN_AN_OBJECT])
def test_json_numbers_stop_at_llama_cpp_s_digit_cap(tokenizer, schema):
    """A model that would repeat a digit forever must end each part of a JSON number after
    MAX_NUMBER_DIGITS digits (llama.cpp's converter: [1-9][0-9]{0,15}, [0-9]{1,16}); digits in a
    string are not counted."""
    from llamatui.inference.chat.constraint import MAX_NUMBER_DIGITS
    sampler = Sampler(SamplingParams(temperature=0), tokenizer.n_vocab)
    c = _constraint(tokenizer, "json_schema", schema)
    out = c.take_forced()
    text = ""
    for _ in range(150):
        logits = np.full(tokenizer.n_vocab, -20.0, np.float32)
        for piece, value in (("4", 10.0), (".", 5.0), ("}", 2.0)):
            logits[tokenizer.encode(piece, add_special=False)[0]] = value
        logits[list(tokenizer.eog_ids)] = 0.0
        token = c.sample(sampler, logits)
        if token in tokenizer.eog_ids:
            break
        out += [token] + c.commit(token)
        text = tokenizer.decode(out)
    else:
        pytest.fail(f"no end: {text!r}")
    value = json.loads(text)
    number = text if schema == {"type": "number"} else text.split('"n": ')[1].rstrip("}")
    assert number == "4" * MAX_NUMBER_DIGITS + "." + "4" * MAX_NUMBER_DIGITS, text
    if schema is NUMBER_IN_AN_OBJECT:
        assert value["s"] == "4" * 40  # digits in a string: no cap


def test_constrained_text_is_shown_verbatim(llama_vocabs):  # noqa: F811 - the fixture
    """A grammar checks the raw pieces; detokenize's clean-up (GPT-2: no space before "," or
    ".") would show other text than it accepted."""
    gpt2 = Tokenizer.from_gguf(llama_vocabs / "ggml-vocab-gpt-2.gguf")
    text = 'She said , "no" .'
    ids = gpt2.encode(text, add_special=False)
    assert gpt2.clean_spaces
    for verbatim, expected in ((False, 'She said, "no".'), (True, text)):
        dec = gpt2.stream_decoder(verbatim=verbatim)
        assert "".join(dec.feed(t) for t in ids) + dec.flush() == expected


# --------------------------------------------------------------------------------------------
# generation on the starter models

GRAMMARS = {
    # file: (what to ask for, a regex (the `regex` module's) for what the grammar allows)
    "yes_no.gbnf": ("Is the sky blue? Answer yes or no.", r"yes|no"),
    "date.gbnf": ("What is the date of the first moon landing?",
                  r"[12][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
    "shopping_list.gbnf": ("Write a short shopping list.",
                           r"(- [a-z]{1,12}( [a-z]{1,12}){0,3}\n){1,4}"),
    "arithmetic.gbnf": ("Write an arithmetic expression that equals 10.",
                        (r"(?(DEFINE)(?<e>(?&t)(?: ?[-+] ?(?&t)){0,3})"
                         r"(?<t>(?&f)(?: ?[*/] ?(?&f)){0,3})(?<f>[0-9]{1,4}|\( ?(?&e) ?\)))"
                         r"(?&e)")),
    "csv_row.gbnf": ("Write a CSV row with a name, an age and a city.",
                     (r'(?(DEFINE)(?<f>[A-Za-z]{1,16}|"[A-Za-z ]{1,20}"))'
                      r"(?&f),[1-9][0-9]?,(?&f)\n")),
    "phone.gbnf": ("Write a phone number.", r"\+1 \([2-9][0-9]{2}\) [0-9]{3}-[0-9]{4}"),
    "sentence.gbnf": ("Describe a cat in one sentence.",
                      r"[A-Z][a-z]{0,11}( [a-z]{1,12}){2,9}[.!?]"),
    "key_value.gbnf": ("Write a small ini file section for a web server.",
                       (r"(?(DEFINE)(?<n>[a-z][a-z_]{0,14})"
                        r'(?<v>[0-9]{1,5}|true|false|"[a-zA-Z0-9 ]{0,20}"))'
                        r"\[(?&n)\]\n((?&n) = (?&v)\n){1,3}")),
    "json_small.gbnf": ("Describe a dog as JSON with its name and age.",
                        (r"(?(DEFINE)(?<v>(?&o)|(?&a)|(?&s)|(?&n)|true|false|null)"
                         r"(?<o>\{(?:(?&s): (?&v)(?:, (?&s): (?&v)){0,3})?\})"
                         r"(?<a>\[(?:(?&v)(?:, (?&v)){0,3})?\])"
                         r'(?<s>"(?:[^"\\\x7F\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})){0,24}")'
                         r"(?<n>-?(?:[0-9]|[1-9][0-9]{0,8})(?:\.[0-9]{1,6})?))(?&o)")),
    "chess.gbnf": ("Write the first moves of a chess game.",
                   (r"(?(DEFINE)(?<m>(?:(?:[a-h]x)?[a-h][1-8](?:=[NBRQ])?"
                    r"|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?))"
                    r"1\. (?&m) (?&m)\n(?:2\. (?&m) (?&m)\n)?")),
    "code_call.gbnf": ("Call a Python function that sends an email.",
                       (r"(?(DEFINE)(?<i>[a-z_][a-z0-9_]{0,15})"
                        r"(?<a>(?&i)=(?:-?[0-9]{1,6}|'[^'\n]{0,20}'|True|False)))"
                        r"(?&i)\((?:(?&a)(?:, (?&a)){0,2})?\)")),
    "unicode_words.gbnf": ("Name some French dishes.",
                           (r"(?(DEFINE)(?<w>[a-zA-ZàâçéèêëîïôûùüÿñæœÀÉÈ]{1,12}))"
                            r"(?&w)( (?&w)){0,4}")),
}


def test_every_grammar_file_has_a_check():
    assert set(GRAMMARS) == {p.name for p in (DATA / "grammars").glob("*.gbnf")}


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with Engine.load(smollm2_path, LoadConfig(n_ctx=1024, threads=2)) as e:
        yield e


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    with Engine.load(gemma3_path, LoadConfig(n_ctx=1024, threads=2)) as e:
        yield e


def _generate(engine, question, max_tokens, **kw):
    events = list(engine.generate([{"role": "user", "content": question}], max_tokens=max_tokens,
                                  **{"temperature": 0, **kw}))
    return "".join(e.text for e in events), events[-1]


def _check_schemas(engine, entries, **kw):
    failures = []
    for entry in entries:
        text, done = _generate(engine, f"Give one example of {entry['name']} as JSON.",
                               entry["max_tokens"], json_schema=entry["schema"], **kw)
        try:
            assert done.finish_reason == "eog", f"stopped by {done.finish_reason}"
            _validate(text, entry["schema"])
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{entry['name']}: {text[:300]!r}: {str(e).splitlines()[0]}")
    if failures:
        pytest.fail("\n".join(failures))


# Greedy Gemma 3 270M runs away where a schema leaves room unless the generated schema takes it
# away as llama.cpp's converter does: a time's fraction digits (times bounded: json_schema.py),
# a number's digits (the digit cap, MAX_NUMBER_DIGITS), keys "c".."z" and on in "allOf merging
# objects" (closed objects). No repeat penalty is needed for any of the 61.


def _check_grammars(engine, max_tokens=96):
    failures = []
    for name, (question, pattern) in GRAMMARS.items():
        text, done = _generate(engine, question, max_tokens,
                               grammar=(DATA / "grammars" / name).read_text())
        if done.finish_reason != "eog" or not regex.fullmatch(pattern, text):
            failures.append(f"{name}: {text[:300]!r} ({done.finish_reason})")
    if failures:
        pytest.fail("\n".join(failures))


def test_every_schema_validates_on_smollm2(smollm2):
    _check_schemas(smollm2, SCHEMAS)


def test_every_schema_validates_on_gemma3(gemma3):
    _check_schemas(gemma3, SCHEMAS)


def test_sampled_output_validates_too(smollm2):
    _check_schemas(smollm2, SCHEMAS[10:16], temperature=0.9, seed=3)


class _Shared:
    """The module's engine as `llamatui run` loads it (load_engine), left open afterwards."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def close(self):
        pass


def _check_cli(engine, path, monkeypatch, capsys):
    """Every schema through `llamatui run -p PROMPT -j SCHEMA` (a plain prompt, no template):
    the exit code is 0 and what it prints validates."""
    monkeypatch.setattr(cmd_run, "load_engine", lambda args: _Shared(engine))
    failures = []
    for entry in SCHEMAS:
        code = main(["run", "-m", str(path), "-t", "2", "--temp", "0",
                     "-n", str(entry["max_tokens"]), "-j", json.dumps(entry["schema"]),
                     "-p", f"Give one example of {entry['name']} as JSON: "])
        text = capsys.readouterr().out
        try:
            assert code == 0, f"exit code {code}"
            _validate(text, entry["schema"])
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{entry['name']}: {text[:300]!r}: {str(e).splitlines()[0]}")
    if failures:
        pytest.fail("\n".join(failures))


def test_every_schema_validates_in_the_cli_on_smollm2(smollm2, smollm2_path, monkeypatch,
                                                      capsys):
    _check_cli(smollm2, smollm2_path, monkeypatch, capsys)


def test_every_schema_validates_in_the_cli_on_gemma3(gemma3, gemma3_path, monkeypatch, capsys):
    _check_cli(gemma3, gemma3_path, monkeypatch, capsys)


def test_every_grammar_parses_on_smollm2(smollm2):
    _check_grammars(smollm2)


def test_every_grammar_parses_on_gemma3(gemma3):
    _check_grammars(gemma3)


def test_regex_lark_and_json_object(smollm2):
    text, done = _generate(smollm2, "Give a product code.", 32,
                           constraint=ConstraintSpec("regex", r"[A-Z]{3}-[0-9]{4}"))
    assert regex.fullmatch(r"[A-Z]{3}-[0-9]{4}", text) and done.finish_reason == "eog"
    lark = 'start: "Answer: " NUMBER\nNUMBER: /[0-9]{1,3}/\n'
    text, done = _generate(smollm2, "How many legs do 3 spiders have?", 32,
                           constraint=ConstraintSpec("lark", lark))
    assert regex.fullmatch(r"Answer: [0-9]{1,3}", text) and done.finish_reason == "eog"
    text, done = _generate(smollm2, "What is the capital of France? Answer in JSON.", 64,
                           constraint=ConstraintSpec("json_object"))
    assert isinstance(json.loads(text), dict) and done.finish_reason == "eog"


def test_events_report_the_constraint(smollm2):
    schema = next(e for e in SCHEMAS if e["name"] == "a book")
    _, done = _generate(smollm2, "Give one example of a book as JSON.", 160,
                        json_schema=schema["schema"])
    assert done.constrained and done.n_forced > 0 and done.mask_ms > 0
    _, plain = _generate(smollm2, "Hi", 2)
    assert not plain.constrained and plain.n_forced == 0 and plain.mask_ms == 0


def test_generate_refuses_before_anything_runs(smollm2):
    with pytest.raises(ConstraintError, match=regex.escape('Unimplemented keys: ["not"]')):
        smollm2.generate("x", json_schema={"not": {}})
    with pytest.raises(ConstraintError, match="give one of constraint, grammar and json_schema"):
        smollm2.generate("x", grammar='root ::= "a"', json_schema={"type": "object"})
    assert not smollm2.scheduler.has_work()


def test_output_cut_by_max_tokens_is_reported_as_length(smollm2):
    text, done = _generate(smollm2, "Give an address as JSON.", 3,
                           json_schema=next(e for e in SCHEMAS if e["name"] == "an address")
                           ["schema"])
    assert done.finish_reason == "length" and done.n_generated == 3
    with pytest.raises(ValueError):
        json.loads(text)


def test_forced_tokens_are_decoded_in_one_batch(smollm2):
    sched = smollm2.scheduler
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "born"],
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "born": {"type": "integer", "minimum": 1000, "maximum": 2024}}}
    ids = smollm2.prompt_tokens([{"role": "user", "content": "A famous painter as JSON."}])
    events = queue.SimpleQueue()
    sched.add_request(ids, SamplingParams(temperature=0, max_tokens=80), events.put,
                      constraint=ConstraintSpec("json_schema", schema), n_probs=1)
    n_decode = sched.stats["n_decode"]
    while sched.has_work():
        sched.step()
    got = [events.get() for _ in range(events.qsize())]
    _validate("".join(e.text for e in got), schema)
    done, tokens = got[-1], [e for e in got if e.kind == "token"]
    sampled = [e for e in tokens if e.logprob is not None]  # forced tokens have no logits
    assert done.finish_reason == "eog" and len(tokens) - len(sampled) == done.n_forced >= 4
    # the prompt (its last token in a step of its own, one slot), then each sampled token together
    # with the tokens forced after it (the last one's decode is skipped: the grammar is complete,
    # only EOG could follow); a prefix forced before anything is sampled takes a decode of its own
    forced_first = tokens[0].logprob is None
    last_alone = tokens[0].n_prompt - tokens[0].n_reused > 1
    assert sched.stats["n_decode"] - n_decode == len(sampled) + forced_first + last_alone


def test_constrained_and_free_requests_share_a_batch(smollm2_path):
    with Engine.load(smollm2_path, LoadConfig(n_ctx=512, threads=2, n_parallel=2,
                                              warmup=False)) as e:
        sched = e.scheduler
        schema = next(x for x in SCHEMAS if x["name"] == "a person")["schema"]
        free = e.tokenize("The capital of France is")
        solo = queue.SimpleQueue()
        sched.add_request(free, SamplingParams(temperature=0, max_tokens=10), solo.put)
        while sched.has_work():
            sched.step()
        for slot in sched.slots:
            slot.tokens.clear()
        outs = [queue.SimpleQueue(), queue.SimpleQueue()]
        sched.add_request(e.prompt_tokens([{"role": "user", "content": "A person as JSON"}]),
                          SamplingParams(temperature=0, max_tokens=60), outs[0].put,
                          constraint=ConstraintSpec("json_schema", schema))
        sched.add_request(free, SamplingParams(temperature=0, max_tokens=10), outs[1].put)
        while sched.has_work():
            sched.step()
        texts = ["".join(ev.text for ev in (q.get() for _ in range(q.qsize()))) for q in outs]
        _validate(texts[0], schema)
        solo_text = "".join(ev.text for ev in (solo.get() for _ in range(solo.qsize())))
        assert texts[1] == solo_text


def test_scheduler_refuses_at_add_request(smollm2):
    with pytest.raises(ConstraintError, match="Unknown format: colour"):
        smollm2.scheduler.add_request([1, 2], SamplingParams(), lambda ev: None,
                                      constraint=ConstraintSpec("json_schema",
                                                                {"format": "colour",
                                                                 "type": "string"}))
    assert not smollm2.scheduler.has_work()


# --------------------------------------------------------------------------------------------
# the CLI


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the constraint was checked")
    monkeypatch.setattr(Engine, "load", refuse)


@pytest.mark.parametrize("flags,code,words", [
    (["-j", '{"not": {}}'], 1, 'cannot use this JSON schema: Unimplemented keys: ["not"]'),
    (["-j", "{oops"], 1, "the JSON schema is not valid JSON"),
    (["--grammar", "root ::= nothing"], 1, "Rule 'nothing' not found"),
    (["-jf", "/nonexistent/schema.json"], 1, "cannot read /nonexistent/schema.json"),
    (["--grammar", 'root ::= "a"', "-j", "{}"], 2, "not allowed with argument --grammar"),
])
def test_cli_refuses_before_the_model_loads(flags, code, words, capsys, no_model_load):
    assert main(["run", "-m", MISSING, "-p", "hi", *flags]) == code
    err = capsys.readouterr().err
    assert err.startswith("llamatui run: error: ") and words in err and "Traceback" not in err


def test_cli_json_schema_file_output_parses(smollm2_path, tmp_path, capsys):
    entry = next(e for e in SCHEMAS if e["name"] == "anyOf mixed with properties")
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(entry["schema"]))
    assert main(["run", "-m", str(smollm2_path), "-c", "256", "-t", "2", "--temp", "0",
                 "-p", "A contact as JSON: ", "-jf", str(path)]) == 0
    captured = capsys.readouterr()
    _validate(captured.out, entry["schema"])
    assert "stop: eog | constrained: " in captured.err


def test_cli_grammar_and_a_cut_short_warning(smollm2_path, capsys):
    grammar = (DATA / "grammars" / "phone.gbnf").read_text()
    argv = ["run", "-m", str(smollm2_path), "-c", "256", "-t", "2", "--temp", "0",
            "-p", "Call me at ", "--grammar", grammar]
    assert main(argv) == 0
    assert regex.fullmatch(GRAMMARS["phone.gbnf"][1], capsys.readouterr().out)
    assert main([*argv, "-n", "2"]) == 1
    err = capsys.readouterr().err
    assert "warning: generation stopped (length) before the grammar was complete" in err
