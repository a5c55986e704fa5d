"""Constrained decoding speed: llamatui's JSON-schema decoding against its own unconstrained
decoding and against llama.cpp's grammar sampler, measured in one run; then the mask engines
alone (llguidance, xgrammar, llama.cpp's grammar) replaying the same tokens.

    python benchmarks/bench_constrained.py [--models smollm2-135m gemma3-270m] [-t 2] [-r 3]
                                           [--xgrammar-python VENV/bin/python]

Per schema of tests/data/json_schemas.json chosen for its features (nested objects, arrays,
enums, anyOf/oneOf, string formats), greedy, the same prompt tokens for both runtimes:

- llamatui constrained: tokens/s over the generated tokens (forced ones included: they are
  decoded in the sampled token's batch), the share of forced tokens, the constraint's work per
  token (checks, masks, resampling, forced tokens) and that work as a share of one unconstrained
  token's time; whether the output validates;
- llamatui unconstrained: tokens/s on a free-text prompt, as many tokens (the baseline);
- llama.cpp (llama-cpp-python, when installed): tokens/s with `LlamaGrammar.from_json_schema`
  (its own converter and grammar sampler, which llama-cpp-python runs first in its chain, over
  the whole vocabulary, every token) and without a grammar; whether its output validates.

Each figure is the median of -r runs; a ratio, the median of per-run ratios, each run taking
constrained and free, ours and llama.cpp's, back to back (the machine is shared and noisy).

The replay section feeds every mask engine the token sequence llamatui produced and times one full
mask per token (no check-first shortcut), the figure MaskBench reports: llguidance, xgrammar (run
with --xgrammar-python, a Python that has xgrammar and torch) and llama.cpp's grammar sampler
applied to the whole vocabulary. Ratios are llamatui / peer: above 1 means llamatui is faster.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
BENCH_SCHEMAS = ["a nested company", "a list of people", "a todo list", "a weather report",
                 "anyOf mixed with properties", "oneOf shapes", "an event with formats",
                 "a user profile", "an order", "a $ref to $defs"]
FREE_PROMPT = "Write a long story about a dragon who learns to cook."


def _schemas():
    with open(os.path.join(DATA, "json_schemas.json")) as f:
        entries = {e["name"]: e for e in json.load(f)}
    return [entries[name] for name in BENCH_SCHEMAS]


def _valid(text: str, schema: dict) -> bool:
    import jsonschema
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(json.loads(text))
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def _question(entry) -> list:
    return [{"role": "user", "content": f"Give one example of {entry['name']} as JSON."}]


# --------------------------------------------------------------------------------------------
# end to end


def ours(engine, entry):
    """(tokens/s, forced share, constraint ms/token, valid, token ids) of one constrained run."""
    events = list(engine.generate(_question(entry), json_schema=entry["schema"], temperature=0,
                                  max_tokens=entry["max_tokens"]))
    done = events[-1]
    text = "".join(e.text for e in events)
    ids = [e.token_id for e in events if e.kind == "token"]
    return (done.gen_tps, done.n_forced / max(done.n_generated, 1), done.mask_ms,
            _valid(text, entry["schema"]) and done.finish_reason == "eog", ids)


def ours_free(engine, n_tokens: int) -> float:
    events = list(engine.generate([{"role": "user", "content": FREE_PROMPT}], temperature=0,
                                  max_tokens=n_tokens))
    return events[-1].gen_tps


def _timed_stream(chunks) -> tuple[str, float]:
    """Text and tokens/s after the first token (the prompt's time excluded, as in ours)."""
    parts, t_first, n = [], None, 0
    for chunk in chunks:
        if t_first is None:
            t_first = time.perf_counter()
        parts.append(chunk["choices"][0]["text"])
        n += 1
    elapsed = time.perf_counter() - t_first if t_first else 0.0
    return "".join(parts), (n - 1) / elapsed if n > 1 and elapsed > 0 else 0.0


def llama_cpp(llm, engine, entry):
    """(constrained tokens/s, valid) through llama-cpp-python."""
    from llama_cpp import LlamaGrammar
    grammar = LlamaGrammar.from_json_schema(json.dumps(entry["schema"]), verbose=False)
    ids = engine.prompt_tokens(_question(entry))
    llm.reset()
    text, tps = _timed_stream(llm.create_completion(ids, max_tokens=entry["max_tokens"],
                                                    temperature=0, grammar=grammar, stream=True))
    return tps, _valid(text, entry["schema"])


def llama_cpp_free(llm, engine, n_tokens: int) -> float:
    llm.reset()
    ids = engine.prompt_tokens([{"role": "user", "content": FREE_PROMPT}])
    return _timed_stream(llm.create_completion(ids, max_tokens=n_tokens, temperature=0,
                                               stream=True))[1]


@dataclass
class Row:
    """One schema's runs; each run: constrained then free, ours then llama.cpp's, back to back
    (the machine is shared: neighbouring runs see the same load, so ratios are per run)."""
    entry: dict
    ids: list = field(default_factory=list)
    valid: bool = True
    forced: float = 0.0
    tps: list = field(default_factory=list)
    free: list = field(default_factory=list)
    mask_ms: list = field(default_factory=list)
    peer_valid: bool | None = None
    peer_tps: list = field(default_factory=list)
    peer_free: list = field(default_factory=list)


def end_to_end(path, threads, reps):
    from llamatui.inference import Engine, LoadConfig
    try:
        from llama_cpp import Llama
        llm = Llama(str(path), n_ctx=1024, n_batch=512, n_threads=threads,
                    n_threads_batch=threads, verbose=False)
    except ImportError:
        llm = None
    rows = []
    with Engine.load(path, LoadConfig(n_ctx=1024, threads=threads)) as engine:
        ours(engine, _schemas()[0])  # compiles the mask kernel, builds the vocabulary
        for entry in _schemas():
            row = Row(entry)
            for _ in range(reps):
                tps, row.forced, mask_ms, valid, row.ids = ours(engine, entry)
                n = max(len(row.ids), 16)
                row.valid &= valid
                row.tps.append(tps)
                row.mask_ms.append(mask_ms)
                row.free.append(ours_free(engine, n))
                if llm:
                    tps, row.peer_valid = llama_cpp(llm, engine, entry)
                    row.peer_tps.append(tps)
                    row.peer_free.append(llama_cpp_free(llm, engine, n))
            rows.append(row)
    return rows


def _median(xs) -> float:
    return float(np.median(xs))


def _ratio(a, b) -> float:
    """The median of the per-run ratios a[i] / b[i]."""
    return _median([x / y for x, y in zip(a, b)])


def print_end_to_end(rows):
    print(f"| {'schema':28s} | ours t/s | forced | mask ms/tok | mask/tok | free t/s | "
          f"c/free | ok | llama.cpp t/s | ok | free t/s | ours/llama.cpp |")
    print("|" + "|".join(["-" * 30] + ["-" * 10 + ":"] * 11) + "|")
    for r in rows:
        share = _median([m / (1e3 / f) for m, f in zip(r.mask_ms, r.free)])
        line = (f"| {r.entry['name'][:28]:28s} | {_median(r.tps):8.1f} | {r.forced:6.0%} | "
                f"{_median(r.mask_ms):11.3f} | {share:8.1%} | {_median(r.free):8.1f} | "
                f"{_ratio(r.tps, r.free):6.2f} | {'y' if r.valid else 'n':2s} |")
        if r.peer_tps:
            line += (f" {_median(r.peer_tps):13.1f} | {'y' if r.peer_valid else 'n':2s} | "
                     f"{_median(r.peer_free):8.1f} | {_ratio(r.tps, r.peer_tps):14.2f} |")
        else:
            line += f" {'—':>13s} | {'':2s} | {'':8s} | {'':14s} |"
        print(line)
    ratio = _median([_ratio(r.tps, r.free) for r in rows])
    share = _median([m / (1e3 / f) for r in rows for m, f in zip(r.mask_ms, r.free)])
    print(f"\nconstrained / unconstrained tok/s (median over schemas): {ratio:.2f}x "
          f"(target >= 0.85); constraint work per token: {share:.2%} of an unconstrained "
          f"token (target <= 15%); outputs valid: {sum(r.valid for r in rows)}/{len(rows)}")
    peers = [r for r in rows if r.peer_tps]
    if peers:
        print(f"llamatui / llama.cpp constrained tok/s (median over schemas): "
              f"{_median([_ratio(r.tps, r.peer_tps) for r in peers]):.2f}x (target >= 2); "
              f"llama.cpp constrained / unconstrained: "
              f"{_median([_ratio(r.peer_tps, r.peer_free) for r in peers]):.2f}x; "
              f"llama.cpp outputs valid: {sum(bool(r.peer_valid) for r in peers)}/{len(peers)}")


# --------------------------------------------------------------------------------------------
# mask engines alone, replaying the same tokens


def replay_llguidance(tokenizer, n_vocab, schema, ids):
    import llguidance

    from llamatui.inference.chat.constraint import ConstraintSpec, ConstraintVocab
    vocab = ConstraintVocab.of(tokenizer, n_vocab)
    matcher = llguidance.LLMatcher(vocab.ll, ConstraintSpec("json_schema", schema).compile())
    words = np.zeros(vocab.n_words, np.uint32)
    times = []
    for t in ids:
        t0 = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        times.append(time.perf_counter() - t0)
        if t in vocab.eog_ids or not matcher.consume_token(t):
            break
    return times


XGRAMMAR_PROBE = r"""
import json, sys, time
import numpy as np, torch, xgrammar as xgr
vocab_file, schema, ids = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
spec = json.load(open(vocab_file))
tokens = [bytes.fromhex(h) for h in spec["tokens"]]
info = xgr.TokenizerInfo(tokens, vocab_type=xgr.VocabType.RAW, stop_token_ids=spec["eog"])
compiled = xgr.GrammarCompiler(info).compile_json_schema(
    json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
matcher = xgr.GrammarMatcher(compiled)
mask = xgr.allocate_token_bitmask(1, info.vocab_size)
times = []
for t in ids:
    t0 = time.perf_counter()
    matcher.fill_next_token_bitmask(mask)
    times.append(time.perf_counter() - t0)
    if t in spec["eog"] or not matcher.accept_token(t):
        break
print(json.dumps(times))
"""


def replay_xgrammar(python, vocab_file, schema, ids):
    proc = subprocess.run([python, "-c", XGRAMMAR_PROBE, vocab_file, json.dumps(schema),
                           json.dumps(ids)], capture_output=True, text=True, check=False)
    if proc.returncode:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def replay_llama_cpp(llm, schema, ids):
    """llama.cpp's grammar sampler applied to the whole vocabulary before each token."""
    import ctypes
    import llama_cpp
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    vocab = llm._model.vocab
    gbnf = json_schema_to_gbnf(json.dumps(schema))
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    data = (llama_cpp.llama_token_data * n)()
    view = np.frombuffer(data, dtype=np.dtype([("id", np.int32), ("logit", np.float32),
                                                ("p", np.float32)]))
    times = []
    try:
        for t in ids:
            view["id"] = np.arange(n, dtype=np.int32)
            view["logit"] = 0.0
            arr = llama_cpp.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
            t0 = time.perf_counter()
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
            times.append(time.perf_counter() - t0)
            if view["logit"][t] == -np.inf or llama_cpp.llama_vocab_is_eog(vocab, t):
                break
            llama_cpp.llama_sampler_accept(sampler, t)
    finally:
        llama_cpp.llama_sampler_free(sampler)
    return times


def replay(path, rows, threads, xgrammar_python):
    from llamatui.inference.chat.constraint import ConstraintVocab
    from llamatui.inference.tokenizers.tokenizer import Tokenizer
    tokenizer = Tokenizer.from_gguf(path)
    vocab = ConstraintVocab.of(tokenizer)
    llm = None
    try:
        from llama_cpp import Llama
        llm = Llama(str(path), n_ctx=256, n_threads=threads, verbose=False)
    except ImportError:
        pass
    vocab_file = None
    if xgrammar_python:
        vocab_file = f"/tmp/bench_constrained_vocab_{os.getpid()}.json"
        special = {i for i in range(tokenizer.n_vocab) if tokenizer.is_control(i)}
        with open(vocab_file, "w") as f:
            json.dump({"tokens": [b"" .hex() if i in special else
                                  tokenizer.token_to_piece(i).hex()
                                  for i in range(tokenizer.n_vocab)],
                       "eog": sorted(vocab.eog_ids.tolist())}, f)
    print(f"\n| {'schema':28s} | llguidance µs/mask | xgrammar µs/mask | llama.cpp µs/mask | "
          f"steps |")
    print("|" + "|".join(["-" * 30] + ["-" * 19 + ":", "-" * 18 + ":", "-" * 19 + ":",
                                       "-" * 6 + ":"]) + "|")
    totals = {"llguidance": [], "xgrammar": [], "llama.cpp": []}
    for row in rows:
        entry, ids = row.entry, row.ids
        res = {"llguidance": replay_llguidance(tokenizer, tokenizer.n_vocab, entry["schema"],
                                               ids)}
        res["xgrammar"] = replay_xgrammar(xgrammar_python, vocab_file, entry["schema"], ids) \
            if vocab_file else None
        res["llama.cpp"] = replay_llama_cpp(llm, entry["schema"], ids) if llm else None
        cells = []
        for name, times in res.items():
            if times:
                totals[name].extend(times)
                cells.append(f"{np.mean(times) * 1e6:.0f} ({len(times)})")
            else:
                cells.append("—")
        print(f"| {entry['name'][:28]:28s} | {cells[0]:>18s} | {cells[1]:>17s} | "
              f"{cells[2]:>18s} | {len(ids):5d} |")
    means = {k: np.mean(v) * 1e6 for k, v in totals.items() if v}
    print("\nmean per mask: " + ", ".join(f"{k} {v:.0f} µs" for k, v in means.items()))
    if vocab_file:
        os.unlink(vocab_file)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--xgrammar-python", default=None,
                    help="a Python with xgrammar and torch (a separate venv keeps torch out of "
                         "llamatui's install), for the replay")
    args = ap.parse_args()
    from conftest import _starter
    for name in args.models:
        path = _starter(name)
        print(f"\n## {path.name} (-t {args.threads}, greedy, load {os.getloadavg()[0]:.1f})\n")
        rows = end_to_end(path, args.threads, args.repetitions)
        print_end_to_end(rows)
        replay(path, rows, args.threads, args.xgrammar_python)


if __name__ == "__main__":
    main()
