"""Hostile metadata never crashes, hangs or exhausts memory: 3,200 seeded structure-aware
mutations of tiny models (tests/metadata_fuzz.py: every key the engine, tokenizer, chat template
and recommender read, given values of the wrong type, zero, negative, huge, NaN, infinite, empty,
nested, of the wrong length, removed, or joined by unexpected keys; a few tensors dropped,
reshaped, retyped or filled with NaN), each run in a worker process through GGUFFile.open and a
full read, the recommender's estimate, `inspect --json`, Engine.load at n_ctx 64 with its warm-up
decode, generate("ab", max_tokens=1) and (de)tokenizing. Every case succeeds or ends in one of
the project's own clear errors; none in another exception type, MemoryError, numpy's or Python's
internal wording, a crash or a hang over 20 s."""
from collections import Counter

from metadata_fuzz import (BASES, CASE_TIMEOUT_S, OPTIONAL_KEYS, VALUE_CLASSES, base_model,
                           coverage, make_cases, run_cases, summary)

N_CASES = 3200
SEED = 20261202


def test_mutated_metadata_succeeds_or_ends_in_a_clear_error(tmp_path):
    cases = make_cases(SEED, N_CASES)
    assert [c.label for c in make_cases(SEED, 40)] == [c.label for c in cases[:40]]  # seeded
    classes, keys = coverage(cases)
    assert set(classes) == set(VALUE_CLASSES) and min(classes.values()) >= 100, classes
    for base in BASES:  # every key the readers read was mutated, on every base
        md, _ = base_model(base)
        arch = md[0][1]
        read = {k for k, _, _ in md} | {k.format(arch=arch) for k in OPTIONAL_KEYS}
        assert all(keys[k] >= 3 for k in read), sorted(k for k in read if keys[k] < 3)

    results = run_cases(cases, tmp_path, n_workers=2)
    print(summary(results))
    failures = [r for r in results if r.failures]
    assert not failures, f"{len(failures)} failures, the first:\n" + "\n".join(
        f"{r.case.label[:300]}\n    {r.failures}" for r in failures[:25])
    assert max(r.seconds for r in results) < CASE_TIMEOUT_S
    # the mutations reach every layer: some models still load and generate, others are refused
    # by the file reader, the metadata checks, and the non-finite logits check
    outcomes = Counter(r.outcome for r in results)
    assert outcomes["ok"] > N_CASES // 10, outcomes
    for error in ("GGUFError", "ModelMetadataError", "NonFiniteLogitsError"):
        assert outcomes[f"clear {error}"] >= 5, outcomes
