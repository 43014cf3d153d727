"""CUDA graphs over the fixed-shape steps of a decode (gpt-fast's approach, without a compiler).

On a GPU one step of a small model is a few hundred tiny kernels, and launching them costs the host
more time than they take on the device. A CUDA graph records the kernels of one step once and then
replays them all with one launch. A replay runs the same kernels on the same memory, so a step can be
captured when its shapes are fixed and everything it reads or writes lives in tensors that outlive
the graph and change in place: the model's weights, the cache's buffers and lengths (`KVCache` on a
GPU attends over its whole capacity and updates its lengths in place for this) and the graph's own
static inputs (tokens, positions, tree mask), into which every call copies its arguments.

`StepGraphs` holds the graphs of one cache, one per step shape: they point at the cache's memory, so
they live and die with it. The first `warmup` calls of a shape run eagerly on a side stream (CUDA
libraries set themselves up lazily, which a capture does not allow); the next call is captured and
replayed, and so is every later call of that shape. Outputs are copied out of the graph's static
outputs, which the next replay overwrites. Capturing runs nothing: a step's effects happen at replay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from typing import NamedTuple

import torch
from torch import Tensor

Body = Callable[..., tuple[Tensor, ...]]


class _Graph(NamedTuple):
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor | None, ...]       # static inputs: each call copies its arguments here
    outputs: tuple[Tensor, ...]             # static outputs: each replay writes here


class StepGraphs:
    """The captured steps of one cache, by shape. `run(key, body, *inputs)` returns `body(*inputs)`.

    `body` takes tensors (or None) and returns a tuple of tensors. Calls with the same `key` must
    have inputs of the same shapes, the same None pattern and the same body up to those inputs.
    """

    def __init__(self, warmup: int = 1):
        self.warmup = warmup
        self.graphs: dict[Hashable, _Graph] = {}
        self.eager_calls: Counter = Counter()

    def run(self, key: Hashable, body: Body, *inputs: Tensor | None) -> tuple[Tensor, ...]:
        captured = self.graphs.get(key)
        if captured is None:
            self.eager_calls[key] += 1
            if self.eager_calls[key] <= self.warmup:
                return _on_side_stream(body, inputs)
            captured = self.graphs[key] = _capture(body, inputs)
        for static, x in zip(captured.inputs, inputs):
            if static is not None:
                static.copy_(x)
        captured.graph.replay()
        return tuple(out.clone() for out in captured.outputs)

    def __len__(self) -> int:
        return len(self.graphs)


def _on_side_stream(body: Body, inputs: tuple[Tensor | None, ...]) -> tuple[Tensor, ...]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = body(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    return out


def _capture(body: Body, inputs: tuple[Tensor | None, ...]) -> _Graph:
    static = tuple(None if x is None else x.clone() for x in inputs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = body(*static)
    return _Graph(graph, static, tuple(outputs))
