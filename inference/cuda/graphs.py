"""Decode steps replayed as CUDA graphs, as ggml-cuda does (ggml_cuda_graph_evaluate_and_capture).

A decode step launches a few hundred small kernels; from Python each launch costs more than the
kernel runs. When the whole model runs on one device, `DecodeGraphs.run` captures a step's
forward pass once into a CUDA graph and replays it for every later step of the same shape:

- a shape (the graph's key) is the number of tokens (at most MAX_TOKENS), which rows want
  logits, and whether they come back as logits or as greedy tokens (ctx.greedy); everything
  that changes from step to step (token ids, positions, cells, the cells' positions and
  sequences, the number of cells to attend) is read by the kernels from the backend's batch
  buffers, which `begin_batch` refills before every step;
- the first step of a shape runs eagerly (compiling kernels, uploading tables, warming the
  memory pool), the second is captured and then launched, later ones are replayed;
- a forward pass that cannot be captured (it copies to the device, or computes on the host after
  its last download) runs eagerly, and that shape is never captured again.

LLAMATUI_CUDA_GRAPHS=0 turns graphs off (llama.cpp's GGML_CUDA_DISABLE_GRAPHS).
"""
from __future__ import annotations

import os
from collections import OrderedDict

from .matvec import MAX_TOKENS

MAX_GRAPHS = 8  # shapes kept (each holds its intermediate buffers)


def graphs_enabled() -> bool:
    return os.environ.get("LLAMATUI_CUDA_GRAPHS", "1").strip().lower() not in ("0", "off", "no")


class DecodeGraphs:
    """The captured decode steps of one single-device model."""

    def __init__(self, backend):
        self.backend = backend
        self.rt = backend.rt
        self._graphs: OrderedDict = OrderedDict()
        self._seen: set = set()
        self._eager: set = set()  # shapes that could not be captured
        self._buffers = None  # the batch buffers the graphs read (new ones: graphs are stale)
        self.replays = 0
        self.captures = 0
        self.failures: list[str] = []  # why a shape stayed eager (one line each)

    def run(self, ctx, forward):
        """forward() for the micro-batch `ctx` (whose inputs begin_batch has uploaded): eagerly,
        captured, or replayed. Returns the logits (or greedy tokens) as forward() does."""
        if ctx.n_tokens > MAX_TOKENS:
            return forward()
        if self.backend.batch_buffers is not self._buffers:
            self._graphs.clear()
            self._buffers = self.backend.batch_buffers
        key = (ctx.n_tokens, ctx.out_rows.tobytes(), ctx.greedy)
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            return self._replay(graph)
        if key in self._eager or key not in self._seen:
            self._seen.add(key)
            return forward()
        graph = self._capture(key, forward)
        return forward() if graph is None else self._replay(graph)

    def _capture(self, key, forward):
        self.rt.synchronize()
        try:
            self.rt.begin_capture()
        except Exception as e:  # noqa: BLE001 -- no graphs on this device: run eagerly
            return self._give_up(key, e)
        try:
            out = forward()
        except Exception as e:  # noqa: BLE001 -- something the graph cannot hold
            try:
                self.rt.end_capture()
            except Exception:  # noqa: BLE001 -- an invalidated capture ends in an error
                pass
            return self._give_up(key, e)
        try:
            graph = self.rt.end_capture()
        except Exception as e:  # noqa: BLE001
            return self._give_up(key, e)
        if not any(out is o for o in graph.outputs):
            return self._give_up(key, "the forward pass computes on the host after its last "
                                       "download")
        graph.result = out
        self.captures += 1
        self._graphs[key] = graph
        while len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return graph

    def _give_up(self, key, why) -> None:
        self._eager.add(key)
        text = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
        self.failures.append(text.strip().splitlines()[0] if text.strip() else text)
        return None

    def _replay(self, graph):
        self.rt.replay(graph)
        self.rt.synchronize()  # the logits (or tokens) are read next
        self.replays += 1
        return graph.result.copy()
