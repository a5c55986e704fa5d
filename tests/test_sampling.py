"""Sampling chain (llama.cpp's order and semantics) and stop-string handling."""
import math
import random

import numpy as np
import pytest

from llamatui.inference.sampling import (SAMPLING_LIMITS, Sampler, SamplingParams,
                                       StopStringMatcher, all_finite)

# every filter off, temperature 1: draws follow softmax(logits) exactly
PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, temperature=1.0)


def logits_of(probs):
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def draw_counts(sampler, logits, n):
    counts = np.zeros(len(logits), dtype=np.int64)
    for _ in range(n):
        counts[sampler.sample(logits)] += 1
    return counts


def random_logits(rng, n, scale=3.0):
    return (rng.standard_normal(n) * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# parameters


def test_defaults_are_llama_cpp_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (p.repeat_penalty, p.repeat_last_n, p.frequency_penalty, p.presence_penalty) == \
        (1.0, 64, 0.0, 0.0)
    assert p.seed is None and p.logit_bias == {} and p.max_tokens is None and p.stop == ()
    assert not p.is_greedy and SamplingParams(temperature=0).is_greedy


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_k=True), "top_k"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=-0.1), "top_p"),
    (dict(min_p=2), "min_p"),
    (dict(typical_p=-1), "typical_p"),
    (dict(repeat_penalty=0), "repeat_penalty"),
    (dict(repeat_penalty=float("inf")), "repeat_penalty"),
    (dict(repeat_last_n=-2), "repeat_last_n"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(presence_penalty=None), "presence_penalty"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={"7": 1.0}), "logit_bias"),
    (dict(logit_bias={3: float("nan")}), "logit_bias"),
    (dict(logit_bias={3: float("inf")}), "logit_bias"),
    (dict(logit_bias=[1, 2]), "logit_bias"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop=[""]), "stop"),
    (dict(stop=["ok", 3]), "stop"),
    (dict(min_keep=-1), "min_keep"),
])
def test_invalid_params_raise_clear_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_the_limits_table_is_what_the_params_check():
    """SAMPLING_LIMITS states each option's range once: SamplingParams accepts every bound it
    names and refuses the value just past it (front-ends build their own forms on it)."""
    for name, limit in SAMPLING_LIMITS.items():
        step = 1 if limit.integer else 1e-3
        if limit.low is not None:
            if limit.low_open:
                with pytest.raises(ValueError, match=name):
                    SamplingParams(**{name: limit.low})
                SamplingParams(**{name: limit.low + step})
            else:
                SamplingParams(**{name: limit.low})
                with pytest.raises(ValueError, match=name):
                    SamplingParams(**{name: limit.low - step})
        if limit.high is not None:
            SamplingParams(**{name: limit.high})
            with pytest.raises(ValueError, match=name):
                SamplingParams(**{name: limit.high + step})
        if limit.integer:
            with pytest.raises(ValueError, match=name):
                SamplingParams(**{name: 2.5})
        default = getattr(SamplingParams(), name)
        assert default is None or limit.problem(default) is None
    with pytest.raises(ValueError):  # a front-end may narrow a range, never widen it
        SAMPLING_LIMITS["top_p"].narrowed(high=2.0)
    assert SAMPLING_LIMITS["top_p"].narrowed(high=0.5).problem(0.6) == "must be at most 0.5"


def test_params_normalise_stop_and_bias():
    p = SamplingParams(stop="</s>", logit_bias={np.int64(5): -math.inf, 7: 2})
    assert p.stop == ("</s>",)
    assert p.logit_bias == {5: -math.inf, 7: 2.0}
    assert SamplingParams(stop=["a", "b", "a"]).stop == ("a", "b")


def test_sampler_rejects_bad_inputs():
    with pytest.raises(ValueError, match="vocabulary has 10 tokens"):
        Sampler(SamplingParams(logit_bias={10: 1.0}), 10)
    s = Sampler(SamplingParams(), 10)
    with pytest.raises(ValueError, match=r"shape \(10,\)"):
        s.sample(np.zeros(11, np.float32))
    bad = np.zeros(10, np.float32)
    bad[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        s.sample(bad)
    with pytest.raises(ValueError, match="NaN"):
        Sampler(SamplingParams(top_k=0), 10).sample(bad)
    with pytest.raises(ValueError, match="NaN"):
        Sampler(SamplingParams(temperature=0), 10).sample(bad)
    with pytest.raises(ValueError, match="token id"):
        s.accept(10)


# ---------------------------------------------------------------------------------------------
# greedy and determinism


@pytest.mark.parametrize("n_vocab", [7, 1000, 262144])
@pytest.mark.parametrize("top_k", [40, 0, 1])
def test_greedy_is_argmax(n_vocab, top_k):
    rng = np.random.default_rng(n_vocab + top_k)
    s = Sampler(SamplingParams(temperature=0.0, top_k=top_k), n_vocab)
    for _ in range(20):
        x = random_logits(rng, n_vocab)
        assert s.sample(x) == int(np.argmax(x))
    # the full chain (typical on, so no shortcut) agrees
    s = Sampler(SamplingParams(temperature=0.0, top_k=top_k, typical_p=0.9999), n_vocab)
    for _ in range(3):
        x = random_logits(rng, n_vocab, scale=8.0)
        assert s.sample(x) == int(np.argmax(x))


def test_greedy_ties_pick_the_lowest_id_like_argmax():
    x = np.zeros(100, np.float32)
    x[[17, 42, 80]] = 5.0
    for top_k in (40, 0, 2):
        assert Sampler(SamplingParams(temperature=0, top_k=top_k), 100).sample(x) == 17


def test_greedy_uses_no_randomness():
    rng = np.random.default_rng(3)
    xs = [random_logits(rng, 500) for _ in range(10)]
    a = [Sampler(SamplingParams(temperature=-1.0, seed=s), 500).sample(x) for s, x in enumerate(xs)]
    assert a == [int(np.argmax(x)) for x in xs]


def test_top_k_1_is_greedy_at_any_temperature():
    rng = np.random.default_rng(5)
    s = Sampler(SamplingParams(top_k=1, temperature=1.5, seed=1), 3000)
    for _ in range(50):
        x = random_logits(rng, 3000, scale=0.5)
        assert s.sample(x) == int(np.argmax(x))


def _sequence(seed, xs, **kw):
    s = Sampler(SamplingParams(seed=seed, **kw), len(xs[0]))
    out = []
    for x in xs:
        t = s.sample(x)
        s.accept(t)
        out.append(t)
    return out


def test_same_seed_same_sequence_and_reset_restarts_it():
    rng = np.random.default_rng(11)
    xs = [random_logits(rng, 5000, scale=1.0) for _ in range(60)]
    a = _sequence(1234, xs, repeat_penalty=1.3)
    b = _sequence(1234, xs, repeat_penalty=1.3)
    assert a == b
    assert len(set(a)) > 10  # really sampling, not greedy
    s = Sampler(SamplingParams(seed=99, **PLAIN), 5000)
    first = [s.sample(x) for x in xs[:20]]
    s.reset()
    assert [s.sample(x) for x in xs[:20]] == first


def test_different_seeds_give_different_sequences():
    x = np.zeros(1000, np.float32)  # uniform over 1000 tokens
    seqs = [tuple(Sampler(SamplingParams(seed=seed, **PLAIN), 1000).sample(x) for _ in range(30))
            for seed in range(6)]
    # two independent 30-draw sequences from 1000 equally likely tokens coincide with
    # probability 1e-90; even sharing more than a few positions is very unlikely
    for i in range(len(seqs)):
        for j in range(i + 1, len(seqs)):
            same = sum(a == b for a, b in zip(seqs[i], seqs[j]))
            assert same <= 3, (i, j, same)


def test_random_seed_when_none():
    a, b = Sampler(SamplingParams(), 10), Sampler(SamplingParams(), 10)
    assert a.seed != b.seed
    assert Sampler(SamplingParams(seed=7), 10).seed == 7


# ---------------------------------------------------------------------------------------------
# the draw and the filters, on hand-made distributions

PROBS = [0.5, 0.3, 0.1, 0.06, 0.04]


def test_draw_follows_the_distribution():
    s = Sampler(SamplingParams(seed=2024, **PLAIN), 5)
    n = 40000
    freq = draw_counts(s, logits_of(PROBS), n) / n
    # binomial standard error ≤ 0.0025; allow 4 sigma
    np.testing.assert_allclose(freq, PROBS, atol=0.01)


def test_temperature_sharpens_and_flattens():
    x = logits_of(PROBS)
    n = 20000
    for temp in (0.5, 2.0):
        s = Sampler(SamplingParams(seed=3, **{**PLAIN, "temperature": temp}), 5)
        expect = np.asarray(PROBS) ** (1 / temp)
        expect /= expect.sum()
        np.testing.assert_allclose(draw_counts(s, x, n) / n, expect, atol=0.015)


@pytest.mark.parametrize("min_p, allowed", [
    (0.15, {0, 1, 2}),  # p ≥ 0.15 · 0.5 = 0.075
    (0.5, {0, 1}),  # p ≥ 0.25
    (0.9, {0}),  # p ≥ 0.45
    (0.05, {0, 1, 2, 3, 4}),  # p ≥ 0.025: all
])
def test_min_p_is_relative_to_the_most_likely_token(min_p, allowed):
    for top_k in (0, 5, 40):  # unsorted and sorted code paths
        s = Sampler(SamplingParams(seed=1, **{**PLAIN, "min_p": min_p, "top_k": top_k}), 5)
        counts = draw_counts(s, logits_of(PROBS), 3000)
        assert set(np.nonzero(counts)[0]) == allowed
        # the survivors keep their relative odds
        kept = np.asarray([PROBS[i] for i in sorted(allowed)])
        np.testing.assert_allclose(counts[sorted(allowed)] / 3000, kept / kept.sum(), atol=0.04)


@pytest.mark.parametrize("top_p, allowed", [
    (0.0, {0}),  # keeps at least one token
    (0.45, {0}),
    (0.7, {0, 1}),  # 0.5 + 0.3 reaches 0.7
    (0.85, {0, 1, 2}),
    (0.95, {0, 1, 2, 3}),
    (0.99, {0, 1, 2, 3, 4}),
])
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p, allowed):
    for top_k in (0, 40):
        s = Sampler(SamplingParams(seed=4, **{**PLAIN, "top_p": top_p, "top_k": top_k}), 5)
        counts = draw_counts(s, logits_of(PROBS), 3000)
        assert set(np.nonzero(counts)[0]) == allowed


def test_top_p_on_a_large_vocabulary_uses_the_same_nucleus():
    # 2000 tokens: a head of 10 likely ones and a flat tail; both top-p code paths agree
    x = np.full(2000, -4.0, np.float32)
    x[1000:1010] = np.linspace(6.0, 4.0, 10)
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    n_keep = int(np.searchsorted(np.cumsum(p[order]), 0.9) + 1)
    expected = set(order[:n_keep].tolist())
    for top_k in (0, 1999):  # unsorted (shortcut) and sorted paths
        s = Sampler(SamplingParams(seed=0, **{**PLAIN, "top_p": 0.9, "top_k": top_k}), 2000)
        s.sample(x)
        assert set(s.last_candidates[0].tolist()) == expected


def test_top_k_keeps_the_k_largest_with_ties_to_lower_ids():
    rng = np.random.default_rng(8)
    x = rng.integers(0, 20, size=50000).astype(np.float32)  # many ties
    for k in (1, 7, 40, 300):
        s = Sampler(SamplingParams(seed=0, **{**PLAIN, "top_k": k}), len(x))
        s.sample(x)
        ids = s.last_candidates[0]
        expected = np.lexsort((np.arange(len(x)), -x))[:k]
        assert sorted(ids.tolist()) == sorted(expected.tolist())


@pytest.mark.parametrize("k", [40, 300, 49_151])  # the usual few dozen, and far more
def test_top_k_candidates_are_ordered_by_logit_then_id_with_their_probabilities(k):
    rng = np.random.default_rng(9)
    x = (rng.integers(0, 30, size=49_152) / 4).astype(np.float32)  # many ties at the top
    s = Sampler(SamplingParams(seed=0, **{**PLAIN, "top_k": k, "temperature": 0.7}), len(x))
    s.sample(x)
    ids, probs = s.last_candidates
    expected = np.lexsort((np.arange(len(x)), -x))[:k]
    assert ids.tolist() == expected.tolist()
    e = np.exp((x[expected] - x[expected[0]]).astype(np.float64) / np.float32(0.7))
    np.testing.assert_allclose(probs, e / e.sum(), rtol=1e-5)


@pytest.mark.parametrize("n", [1, 15, 16, 49_152, 49_155])
def test_all_finite_sees_nan_and_infinities_in_blocks_and_tail(n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    assert all_finite(x) and all_finite(x[::2]) and all_finite(x.astype(np.float64))
    for where in {0, n // 2, n - 1}:
        for value in (np.nan, np.inf, -np.inf):
            y = x.copy()
            y[where] = value
            assert not all_finite(y) and not all_finite(y.astype(np.float64))
    big = np.full(n, np.finfo(np.float32).max, np.float32)  # finite, though their sum is not
    assert all_finite(big)


@pytest.mark.parametrize("where", [5, 30_001, 49_151])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_top_k_finds_nan_and_inf_anywhere(where, value):
    # the scan checks 16 logits at a time: the first k, whole blocks and the tail all count
    x = np.random.default_rng(2).standard_normal(49_152).astype(np.float32)
    x[100:200] = -np.inf  # banned tokens are not errors
    x[where] = value
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        Sampler(SamplingParams(seed=0, top_k=40), len(x)).sample(x)
    x[where] = 0.0
    Sampler(SamplingParams(seed=0, top_k=40), len(x)).sample(x)


def test_typical_keeps_tokens_whose_surprise_is_near_the_entropy():
    # entropy of PROBS is 1.236 nats; surprises are 0.69, 1.20, 2.30, 2.81, 3.22, so the most
    # typical token is id 1, then 0, then 2
    x = logits_of(PROBS)
    for typical_p, allowed in ((0.2, {1}), (0.5, {0, 1}), (0.85, {0, 1, 2})):
        s = Sampler(SamplingParams(seed=6, **{**PLAIN, "typical_p": typical_p}), 5)
        assert set(np.nonzero(draw_counts(s, x, 2000))[0]) == allowed
    # greedy runs after the filters, as in llama.cpp: typical can remove the argmax
    s = Sampler(SamplingParams(temperature=0, typical_p=0.2, top_k=0, top_p=1, min_p=0), 5)
    assert s.sample(x) == 1


# ---------------------------------------------------------------------------------------------
# logit bias and penalties


def test_logit_bias_minus_inf_bans_a_token():
    rng = np.random.default_rng(9)
    x = random_logits(rng, 300)
    best = int(np.argmax(x))
    second = int(np.argsort(-x)[1])
    greedy = Sampler(SamplingParams(temperature=0, logit_bias={best: -math.inf}), 300)
    assert greedy.sample(x) == second
    s = Sampler(SamplingParams(seed=1, **{**PLAIN, "temperature": 3.0},
                               logit_bias={best: -math.inf}), 300)
    assert best not in {s.sample(x) for _ in range(3000)}
    # a positive bias promotes
    worst = int(np.argmin(x))
    assert Sampler(SamplingParams(temperature=0, logit_bias={worst: 100.0}), 300).sample(x) == worst


def test_banning_every_token_is_an_error():
    for temp in (0.8, 0.0):
        s = Sampler(SamplingParams(temperature=temp, logit_bias={i: -math.inf for i in range(4)}), 4)
        with pytest.raises(ValueError, match="-inf"):
            s.sample(np.zeros(4, np.float32))


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    x = np.array([2.0, 1.0, -1.0, -2.0, 0.5], np.float32)
    s = Sampler(SamplingParams(repeat_penalty=2.0, **PLAIN), 5)
    s.accept_many([0, 2])
    s.sample(x)
    ids, probs = s.last_candidates
    expect_logits = np.array([1.0, 1.0, -2.0, -2.0, 0.5])
    expect = np.exp(expect_logits) / np.exp(expect_logits).sum()
    np.testing.assert_allclose(probs[np.argsort(ids)], expect, rtol=1e-5)


def test_repeat_penalty_changes_the_greedy_choice_both_ways():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0), 3)
    x = np.array([2.0, 1.5, -5.0], np.float32)
    assert s.sample(x) == 0
    s.accept(0)
    assert s.sample(x) == 1  # 2.0 / 2 = 1.0 < 1.5
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0), 3)
    y = np.array([-1.0, -1.5, -5.0], np.float32)
    s.accept(0)
    assert s.sample(y) == 1  # -1.0 · 2 = -2.0 < -1.5 (dividing would have favoured it)


def test_frequency_and_presence_penalties():
    x = np.zeros(4, np.float32)
    s = Sampler(SamplingParams(frequency_penalty=0.5, presence_penalty=1.0, **PLAIN), 4)
    s.accept_many([0, 0, 0, 1])
    s.sample(x)
    ids, probs = s.last_candidates
    expect_logits = np.array([-(3 * 0.5 + 1.0), -(0.5 + 1.0), 0.0, 0.0])
    expect = np.exp(expect_logits) / np.exp(expect_logits).sum()
    np.testing.assert_allclose(probs[np.argsort(ids)], expect, rtol=1e-5)


def test_penalty_window_is_the_last_n_tokens():
    x = np.array([2.0, 1.5, 0.0, 0.0], np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=4.0, repeat_last_n=2), 4)
    s.accept_many([0, 2])
    assert s.sample(x) == 1  # 0 is in the window
    s.accept(3)  # pushes 0 out
    assert s.history == (2, 3)
    assert s.sample(x) == 0
    off = Sampler(SamplingParams(temperature=0, repeat_penalty=4.0, repeat_last_n=0), 4)
    off.accept(0)
    assert off.sample(x) == 0 and off.history == ()
    whole = Sampler(SamplingParams(temperature=0, repeat_penalty=4.0, repeat_last_n=-1), 4,
                    n_ctx=3)
    whole.accept_many([0, 2, 3])
    assert whole.sample(x) == 1
    whole.accept(2)
    assert whole.sample(x) == 0


# ---------------------------------------------------------------------------------------------
# a real-size vocabulary (speed is measured in benchmarks/bench_sampling.py)


def test_sampling_a_262144_token_vocabulary_draws_from_the_top_k():
    rng = np.random.default_rng(12)
    x = random_logits(rng, 262144)
    x[5] = x.max() + 10  # the best token, banned by the bias below
    s = Sampler(SamplingParams(seed=1, top_k=40, logit_bias={5: -math.inf}), 262144)
    top40 = set(np.argsort(np.where(np.arange(262144) == 5, -np.inf, x))[-40:].tolist())
    draws = {s.sample(x) for _ in range(200)}
    assert draws <= top40 and 5 not in draws and len(draws) > 1


# ---------------------------------------------------------------------------------------------
# stop strings


def feed_all(m, pieces):
    out = []
    for p in pieces:
        text, stopped = m.feed(p)
        out.append(text)
        if stopped:
            break
    return out


def test_stop_string_split_across_pieces():
    m = StopStringMatcher(["<|end|>"])
    assert m.feed("Hel") == ("Hel", False)
    assert m.feed("lo<|") == ("lo", False)  # "<|" may start the stop string: held back
    assert m.pending == "<|"
    assert m.feed("en") == ("", False)
    assert m.feed("d|>more") == ("", True)
    assert m.stopped and m.stop_string == "<|end|>" and m.text == "Hello"
    assert m.feed("after") == ("", True)


def test_partial_prefix_released_when_it_turns_out_not_to_be_a_stop():
    m = StopStringMatcher(["###"])
    assert m.feed("a#") == ("a", False)
    assert m.feed("#b") == ("##b", False)
    assert not m.stopped and m.text == "a##b"


def test_longest_partial_prefix_is_held():
    m = StopStringMatcher(["aab"])
    assert m.feed("xaaa") == ("xa", False)  # "aa" could still become "aab"
    assert m.feed("b!") == ("", True)
    assert m.text == "xa"
    m = StopStringMatcher(["abab"])
    assert m.feed("aba") == ("", False)
    assert m.feed("c") == ("abac", False)


def test_earliest_stop_string_wins():
    m = StopStringMatcher(["world", "lo w"])
    assert m.feed("hello world") == ("hel", True)
    assert m.stop_string == "lo w"


def test_flush_releases_held_text_and_no_stops_pass_through():
    m = StopStringMatcher(["</s>"])
    assert m.feed("abc</") == ("abc", False)
    assert m.flush() == "</"
    m = StopStringMatcher([])
    assert m.feed("a</s>") == ("a</s>", False)
    with pytest.raises(ValueError):
        StopStringMatcher([""])


def test_stop_matcher_random_chunkings():
    rnd = random.Random(1)
    for _ in range(400):
        text = "".join(rnd.choice("abc ") for _ in range(rnd.randint(0, 40)))
        stops = [rnd.choice(["abc", "ca b", "bb", "a a", "cc c"])]
        if rnd.random() < 0.5:
            other = rnd.choice(["abc", "ca b", "bb", "a a", "cc c"])
            if other not in stops[0] and stops[0] not in other:
                stops.append(other)
        found = [p for p in (text.find(s) for s in stops) if p != -1]
        expected = text[:min(found)] if found else text
        # random chunking
        pieces, i = [], 0
        while i < len(text):
            j = i + rnd.randint(1, 5)
            pieces.append(text[i:j])
            i = j
        m = StopStringMatcher(stops)
        shown = ""
        for p in pieces:
            out, stopped = m.feed(p)
            shown += out
            assert expected.startswith(shown)  # nothing shown is ever taken back
            if stopped:
                break
        if not m.stopped:
            shown += m.flush()
        assert shown == expected, (text, stops, pieces)
        assert m.stopped == bool(found)
