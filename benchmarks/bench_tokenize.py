"""Tokenizing speed with special-token parsing (every chat prompt), on Gemma 3's 6,414 special
tokens, against llama.cpp's longest-first loop run in the same process.

    python benchmarks/bench_tokenize.py [--mb 1.0]

Texts: plain English (the Apache licence repeated); "special" text: special-token strings
(drawn from all of them) between snippets of the same English, about half of the characters
each; a prompt with every special token once. Printed: full `encode` time for each text with
parse_special off and on (CPU seconds), then the partition step alone, one pass against the
longest-first loop (`partition_longest_first`) on a slice short enough for it to finish in
seconds.
"""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def timed(fn, *args, repeat=1):
    """Best CPU seconds of this process over `repeat` calls: on a shared machine wall time
    mostly measures the neighbours."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        out = fn(*args)
        best = min(best, time.process_time() - t)
    return best, out


def special_text(tok, english: str, size: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    specials = tok._special_texts
    parts, n = [], 0
    while n < size:
        if rng.random() < 0.5:
            s = rng.choice(specials)
        else:
            i = rng.randrange(len(english) - 50)
            s = english[i:i + rng.randrange(1, 40)]
        parts.append(s)
        n += len(s)
    return "".join(parts)[:size]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1.0, help="size of the long texts in MB")
    ap.add_argument("--slice", type=int, default=50_000,
                    help="characters the longest-first loop is timed on")
    args = ap.parse_args()
    from conftest import GOLDEN, test_store
    from llamatui.inference.tokenizers.tokenizer import Tokenizer
    from llamatui.inference.tokenizers.special import partition_longest_first
    from llamatui.models.store import pull_starter

    tok = Tokenizer.from_gguf(pull_starter("gemma3-270m", store=test_store()))
    english = (GOLDEN / "texts" / "apache-2.0.txt").read_text()
    size = int(args.mb * 1_000_000)
    order = list(range(len(tok._special_texts)))
    random.Random(1).shuffle(order)
    texts = {
        "plain": (english * (size // len(english) + 1))[:size],
        "special": special_text(tok, english, size),
        "every special once": "\n".join(tok._special_texts[i] for i in order),
    }
    tok.encode("warm up <start_of_turn>", parse_special=True)
    print(f"Gemma 3, {len(tok._special_texts)} special tokens\n")
    print(f"{'text':20s} {'chars':>9s} {'encode':>9s} {'+ specials':>11s} {'tokens':>8s}")
    for name, text in texts.items():
        plain_s, _ = timed(tok.encode, text, True, False)
        special_s, ids = timed(tok.encode, text, True, True)
        print(f"{name:20s} {len(text):9d} {plain_s:8.3f}s {special_s:10.3f}s {len(ids):8d}")

    part = tok._partitioner(True)
    print(f"\npartition only, on the first {args.slice} characters:")
    print(f"{'text':20s} {'one pass':>10s} {'longest-first':>14s} {'ratio':>7s}")
    for name, text in texts.items():
        text = text[:args.slice]
        new_s, new = timed(part.partition, text, repeat=3)
        old_s, old = timed(partition_longest_first, text, *part.spec)
        assert new == old, name
        print(f"{name:20s} {new_s:9.4f}s {old_s:13.3f}s {old_s / new_s:6.0f}x")


if __name__ == "__main__":
    main()
