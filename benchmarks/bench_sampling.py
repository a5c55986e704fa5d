"""Time per sampling step over Gemma 3's 262,144-token vocabulary with llama.cpp's default chain.

    python benchmarks/bench_sampling.py
"""
import math
import time

import numpy as np

from llamatui.inference.sampling import Sampler, SamplingParams


def main():
    rng = np.random.default_rng(12)
    logits = (rng.standard_normal(262144) * 3).astype(np.float32)
    for label, params in [("defaults", SamplingParams(seed=1)),
                          ("greedy", SamplingParams(temperature=0)),
                          ("penalties+bias", SamplingParams(seed=1, repeat_penalty=1.1,
                                                            logit_bias={5: -math.inf}))]:
        s = Sampler(params, len(logits))
        s.accept_many(range(64))
        s.sample(logits)  # compile / warm up
        times = []
        for _ in range(200):
            t = time.perf_counter()
            s.sample(logits)
            times.append(time.perf_counter() - t)
        print(f"{label:16s} median {np.median(times) * 1e3:7.3f} ms   p90 "
              f"{np.percentile(times, 90) * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
