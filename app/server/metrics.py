"""/metrics: Prometheus text with llama-server's `llamacpp:*` names and meanings
(tools/server/server-task.cpp, `server_task_result_metrics::to_metrics`), the KV cache's use,
and the server's own health: event-loop lag (a histogram) and resident memory.
"""
from __future__ import annotations

import asyncio
import time

import psutil

LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, float("inf"))
LAG_INTERVAL = 0.01  # how often the monitor wakes (s)


class LoopLagMonitor:
    """How late the event loop runs a timer: a handler that blocks the loop shows up here.
    Counts into LAG_BUCKETS (a Prometheus histogram) and keeps the recent samples."""

    def __init__(self):
        self.counts = [0] * len(LAG_BUCKETS)
        self.total = 0.0
        self.n = 0
        self.recent: list[float] = []

    def record(self, lag: float) -> None:
        for i, edge in enumerate(LAG_BUCKETS):
            if lag <= edge:
                self.counts[i] += 1
                break
        self.total += lag
        self.n += 1
        self.recent.append(lag)
        del self.recent[:-1000]

    async def run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(LAG_INTERVAL)
            self.record(max(0.0, time.perf_counter() - t0 - LAG_INTERVAL))

    def lines(self) -> list[str]:
        name = "llamatui:event_loop_lag_seconds"
        out = [f"# HELP {name} How late the server's event loop ran a {LAG_INTERVAL:g} s timer",
               f"# TYPE {name} histogram"]
        running = 0
        for edge, count in zip(LAG_BUCKETS, self.counts):
            running += count
            le = "+Inf" if edge == float("inf") else f"{edge:g}"
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        out += [f"{name}_sum {self.total:.6f}", f"{name}_count {self.n}"]
        return out


def _item(kind: str, name: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
            f"llamacpp:{name} {value:g}"]


def render(stats: dict, slots: list[dict], n_queued: int, kv: tuple[int, int],
           lag: LoopLagMonitor) -> str:
    """The exposition text. stats: Scheduler.stats; slots: Scheduler.slots_info()."""
    busy = sum(1 for s in slots if s["request_id"] is not None)
    t_prompt, t_gen = stats["t_prompt"], stats["t_generation"]
    n_decode = max(stats["n_decode"], 1)
    kv_used, kv_total = kv
    lines = []
    for name, help_text, value in (
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
             stats["n_prompt_tokens"]),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
             stats["n_prompt_tokens_cached"]),
            ("prompt_seconds_total", "Total time spent processing prompts", t_prompt),
            ("tokens_predicted_total", "Number of generation tokens processed",
             stats["n_generated_tokens"]),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", t_gen),
            ("n_decode_total", "Total number of llama_decode() calls", stats["n_decode"]),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)",
             stats["n_tokens_max"]),
            ("requests_total", "Number of requests queued", stats["n_requests"])):
        lines += _item("counter", name, help_text, value)
    for name, help_text, value in (
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             stats["n_prompt_tokens"] / t_prompt if t_prompt else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             stats["n_generated_tokens"] / t_gen if t_gen else 0.0),
            ("requests_processing", "Number of requests processing", busy),
            ("requests_deferred", "Number of requests deferred", n_queued),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             stats["n_busy_slots"] / n_decode),
            ("kv_cache_tokens", "KV-cache cells in use", kv_used),
            ("kv_cache_usage_ratio", "KV-cache use (0 to 1)",
             kv_used / kv_total if kv_total else 0.0)):
        lines += _item("gauge", name, help_text, value)
    lines += lag.lines()
    rss = psutil.Process().memory_info().rss
    lines += ["# HELP process_resident_memory_bytes Resident memory size in bytes",
              "# TYPE process_resident_memory_bytes gauge",
              f"process_resident_memory_bytes {rss}"]
    return "\n".join(lines) + "\n"
