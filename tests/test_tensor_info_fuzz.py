"""Hostile tensor infos never get past the reader into numpy: 1,500 seeded structure-aware
mutations of a tiny file of 13 tensors of 11 types and every rank from 0 to 4 (tests/
tensor_info_fuzz.py: zero, huge and overflowing dimensions, too many or no dimensions, offsets
past the end, overlapping or misaligned, unknown and unsupported types, rows that are not whole
blocks, duplicate names, a truncated data section, other alignments, a wrong tensor count, nested
metadata arrays of mixed depth), each run in a worker process through GGUFFile.open (and the
same bytes as a header alone), every tensor's data and rows, rows picked by id and dequantized,
GGUFTensor.dequantize and inference.quants.dequantize, and `llamatui inspect` with and without
--json. Every case succeeds, with results that agree, or ends in a GGUFError, which the CLI
prints as one line with exit status 1; none in any other exception, a crash or a hang."""
import re
from collections import Counter

from tensor_info_fuzz import KINDS, failures, make_cases, run_cases, summary

N_CASES = 1500
SEED = 26

# What each of the reader's tensor-info checks says: all of them are reached.
CHECKS = {
    "zero dimension": r"tensor '[^']+': dimension \d is 0 \(every dimension must be at least 1\)",
    "dimension beyond int64": r"tensor '[^']+': dimension \d is \d+, more than int64 holds",
    "element count beyond int64": r"tensor '[^']+': dimensions \[[\d, ]+\] overflow int64",
    "too many dimensions": r"tensor '[^']+' has \d+ dimensions \(at most 4\)",
    "unknown type": r"tensor '[^']+' has unknown ggml type \d+",
    "partial block": r"tensor '[^']+': row length \d+ is not a multiple of the \w+ block size",
    "misaligned offset": r"tensor '[^']+': data offset \d+ is not aligned to \d+",
    "offset past the end": r"tensor '[^']+': data offset \d+ lies outside the file \(past the",
    "data past the end": r"tensor '[^']+': data \[\d+, \d+\) lies outside the file",
    "overlap": r"tensors '[^']+' and '[^']+' overlap in the data section",
    "duplicate name": r"duplicate tensor name '[^']+'",
}


def test_mutated_tensor_infos_open_and_read_or_raise_gguf_error(tmp_path):
    cases = make_cases(SEED, N_CASES)
    assert [c.label for c in make_cases(SEED, 40)] == [c.label for c in cases[:40]]  # seeded
    kinds = Counter(k for c in cases for k in c.kinds)
    assert set(kinds) == set(KINDS) and min(kinds.values()) >= 60, kinds

    results = run_cases(SEED, N_CASES, tmp_path)
    print(summary(results))
    found = failures(results)
    assert not found, f"{len(found)} failures, the first:\n" + "\n".join(found[:25])

    outcomes = Counter(r.outcome for r in results)
    assert outcomes["ok"] > N_CASES // 10 and outcomes["rejected"] > N_CASES // 3, outcomes
    errors = [r.detail["error"] for r in results if r.outcome == "rejected"]
    missing = [name for name, pattern in CHECKS.items()
               if not any(re.search(pattern, e) for e in errors)]
    assert not missing, missing
    # the accepted files were read for real: tensors dequantized, unsupported types refused
    assert sum(r.detail.get("dequantized", 0) for r in results) > N_CASES
    assert sum(r.detail.get("unsupported", 0) for r in results) > N_CASES // 10
