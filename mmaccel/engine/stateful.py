"""Compiled steps that keep their state: a module exported once to OpenVINO whose last outputs are the next call's
values of some of its inputs (a decoder's key/value buffers), held inside the runtime between calls.

Why (measured, `benchmarks/engine/decoder_step_stateful.md`): a decoder pass fed its cache at every call spends most
of its time converting and copying the cache into the runtime (`decoder_step_probe.md`); as OpenVINO state
(`apply_make_stateful_transformation`) the buffers stay where the graph reads them and a call passes only what is
new. The graph is exported as the tracer leaves it, every dimension free, kept once on disk
(`compiled.cached_graph`) and compiled once per process on first use (OpenVINO's blob cache keeps that too): with
the batch alone free it ran 1.2-2x slower here, and with the batch free and the other dimensions fixed, or with
every dimension fixed, OpenVINO 2026.4's CPU plugin gave wrong answers over bf16 inputs (70-140 % off).

`StatefulGraph.session(batch)` hands out a `Session`: an infer request with its own state (zeros at first, shaped
like the example's state inputs at that batch), taken from a pool and
given back by `release()` (what it held is garbage to the next user, who must not read what it has not written).
Checked like `compile_module`: a fresh export is compared with the eager module on the example (state set to the
example's buffers) and refused beyond `compiled.TOLERANCE`; any failure is one warning line and None.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from mmaccel.engine.compiled import (
    PRECISIONS,
    TOLERANCE,
    cached_graph,
    compile_config,
    first_line,
    int8_weights,
    save_graph,
)
from mmaccel.engine.precision import check_precision
from mmaccel.errors import check
from mmaccel.paths import default_cache_dir


def to_ov(ov, t: Tensor):
    """A torch tensor as an OpenVINO tensor of its dtype (bf16 kept bf16), a copy owned by OpenVINO."""
    if t.dtype == torch.bfloat16:
        out = ov.Tensor(ov.Type.bf16, ov.Shape(list(t.shape)))
        np.copyto(out.data.view(np.uint16), t.detach().contiguous().view(torch.int16).numpy().view(np.uint16))
        return out
    return ov.Tensor(np.ascontiguousarray(t.detach().cpu().numpy()))


def from_ov(tensor) -> Tensor:
    """An OpenVINO tensor as a torch tensor of its dtype (bf16 read as bf16, which numpy has not), a copy."""
    if tensor.get_element_type().get_type_name() == "bf16":
        return torch.from_numpy(np.array(tensor.data, copy=True).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(tensor.data, copy=True))


class Session:
    """One infer request of a `StatefulGraph` at one batch size, with its own state. `run(feed)` with the inputs
    that are not state (by their index in the module's signature; inputs set by `set_input` may be left out) ->
    the outputs that are not state, as numpy arrays (valid until the next call)."""

    def __init__(self, graph: StatefulGraph, batch: int, request, variables: list):
        self.graph, self.batch, self._request, self._variables = graph, batch, request, variables

    def run(self, feed: dict[int, np.ndarray]) -> list[np.ndarray]:
        position = self.graph.position
        out = self._request.infer({position[i]: x for i, x in feed.items()}, share_inputs=True)
        return [out[j] for j in range(self.graph.num_outputs)]

    def set_input(self, index: int, tensor) -> None:
        """Input `index` (of the module's signature) stays `tensor` (an `ov.Tensor`, shared) for the next calls."""
        self._request.set_input_tensor(self.graph.position[index], tensor)

    def read_state(self) -> list[Tensor]:
        """The state, in the order of the module's state inputs, as torch tensors of their dtypes (copies)."""
        return [from_ov(v.state) for v in self._variables]

    def state_views(self) -> list[Tensor] | None:
        """The state as torch tensors over the runtime's own memory, for writing a few entries in place (a row that
        joins, a tree path kept) without copying it all: valid until the next `run`. None where the runtime hands
        out copies (the caller then reads and writes the whole state)."""
        views = []
        for variable in self._variables:
            data = variable.state.data
            if not np.shares_memory(data, variable.state.data):
                return None
            t = torch.from_numpy(data)
            views.append(t.view(torch.int16).view(torch.bfloat16) if variable.state.get_element_type().get_type_name()
                         == "bf16" else t)
        return views

    def write_state(self, tensors: list[Tensor]) -> None:
        """Set the state (torch tensors, cast to each state's dtype)."""
        import openvino as ov

        for variable, t, dtype in zip(self._variables, tensors, self.graph.state_dtypes, strict=True):
            variable.state = to_ov(ov, t.to(dtype))

    def release(self) -> None:
        """Back to the pool (its state is then someone else's)."""
        self.graph._give_back(self)


class StatefulGraph:
    """A module (tensors -> tensors) compiled with its inputs `states` (indices) fed back from its last
    `len(states)` outputs, in that order. `session(batch)` -> a `Session`."""

    def __init__(self, ov, graph, precision: str, root: Path, states: list[int], example: tuple[Tensor, ...],
                 source: str, int8_activations: bool = False):
        self._ov, self._graph, self._root = ov, graph, root
        self._shapes = [list(x.shape[1:]) for x in example]       # each input's shape past the batch
        self.state_dtypes = [example[i].dtype for i in states]
        self.int8_activations = int8_activations
        num_inputs = len(example)
        self.precision, self.states, self.source = precision, list(states), source
        self.position = {i: p for p, i in enumerate(i for i in range(num_inputs) if i not in self.states)}
        self.num_outputs = len(graph.outputs) - len(self.states)
        self.error: float | None = None          # relative error of the first output against eager, when exported now
        self.first_call_s = 0.0                  # export (or cache read) and check, seconds
        self.compile_s: float | None = None      # seconds the compile took (None: not compiled yet)
        self._compiled = None
        self._free: dict[int, list[Session]] = {}
        self._lock = threading.Lock()

    def session(self, batch: int) -> Session:
        """A session at `batch` rows (the graph compiled on first use; may raise what OpenVINO raises)."""
        with self._lock:
            if self._free.get(batch):
                return self._free[batch].pop()
            if self._compiled is None:
                start = time.perf_counter()
                self._compiled = self._compile()
                self.compile_s = time.perf_counter() - start
        request = self._compiled.create_infer_request()
        by_name = {v.name: v for v in request.query_state()}
        names = [p.get_any_name() for p in self._graph.inputs]
        outputs = [p.get_any_name() for p in self._graph.outputs][self.num_outputs :]
        variables = [by_name[names[i] + out] for i, out in zip(self.states, outputs, strict=True)]
        session = Session(self, batch, request, variables)
        # a state has no shape before it is written
        session.write_state([torch.zeros(batch, *self._shapes[i], dtype=self._dtype(i)) for i in self.states])
        return session

    def _compile(self):
        from openvino._offline_transformations import apply_make_stateful_transformation

        graph = self._graph.clone()
        names = [p.get_any_name() for p in graph.inputs]
        outputs = [p.get_any_name() for p in graph.outputs][self.num_outputs :]
        apply_make_stateful_transformation(graph, {names[i]: out for i, out in zip(self.states, outputs, strict=True)})
        return self._ov.Core().compile_model(graph, "CPU",
                                             compile_config(self.precision, self._root, self.int8_activations))

    def _dtype(self, index: int) -> torch.dtype:
        return self.state_dtypes[self.states.index(index)]

    def _give_back(self, session: Session) -> None:
        with self._lock:
            self._free.setdefault(session.batch, []).append(session)


def compile_stateful(module: nn.Module, example: tuple[Tensor, ...], states: list[int], precision: str = "int8",
                     cache_dir: str | Path | None = None, int8_activations: bool = False) -> StatefulGraph | None:
    """`module` compiled with the inputs `states` held as state (see the module docstring), or None with one warning
    line when it cannot be. `example`: inputs of the shapes and dtypes it will see (bf16 inputs and states stay
    bf16). At int8 its linear layers' weights are int8 with a scale per row (`compiled.int8_weights`);
    `int8_activations`: their products int8 too (`compiled.compile_config`)."""
    check_precision(precision, PRECISIONS)
    check(isinstance(module, nn.Module), f"compile_stateful takes an nn.Module, got {type(module).__name__}")
    check(len(states) > 0 and all(0 <= i < len(example) for i in states), "compile_stateful needs state input indices")
    start = time.perf_counter()
    try:
        import openvino as ov
    except ImportError as e:
        return _fallback(module, f"openvino is not installed ({e})")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "compiled"
    graphed = int8_weights(module) if precision == "int8" else module
    try:
        graph, source, dest = cached_graph(ov, graphed, example, root, keep_dtypes=True)
        if source == "export":
            for j, port in enumerate(graph.outputs):      # names the state variables are made from
                port.get_tensor().set_names({f"out{j}"})
        stateful = StatefulGraph(ov, graph, precision, root, states, example, source, int8_activations)
        if source == "export":
            stateful.error = _relative_error(stateful, module, example)
    except Exception as e:  # noqa: BLE001 - an export, compile or run failure falls back to eager
        return _fallback(module, f"the stateful graph cannot be built ({first_line(e)})")
    if stateful.error is not None:
        if not stateful.error <= TOLERANCE[precision]:
            return _fallback(module, f"its output differs from eager by {stateful.error:.2g} (relative L2), more "
                                     f"than {precision}'s {TOLERANCE[precision]}")
        save_graph(ov, graph, dest, {"module": type(module).__name__, "error": stateful.error, "states": states})
    stateful.first_call_s = time.perf_counter() - start
    return stateful


@torch.no_grad()
def _relative_error(graph: StatefulGraph, module: nn.Module, example: tuple[Tensor, ...]) -> float:
    """The relative L2 error of the first output against eager, state set to the example's buffers, on the example
    and on a perturbed copy of its inputs that are not state (a tracer that baked an input in fails the second)."""
    import openvino as ov

    generator = torch.Generator().manual_seed(0)
    session = graph.session(example[0].shape[0])
    worst = 0.0
    try:
        for perturb in (False, True):
            inputs = list(example)
            if perturb:
                inputs = [x if i in graph.states or not x.is_floating_point() else
                          x + (0.1 * x.float().std().clamp_min(1e-3) * torch.randn(x.shape, generator=generator)).to(x.dtype)
                          for i, x in enumerate(example)]
            session.write_state([inputs[i] for i in graph.states])
            for i, x in enumerate(inputs):
                if i not in graph.states:
                    session.set_input(i, to_ov(ov, x))
            got = torch.from_numpy(np.array(session.run({})[0], dtype=np.float32))
            want = module(*inputs)[0].float()
            check(got.shape == want.shape, f"compiled output shape {tuple(got.shape)} != eager {tuple(want.shape)}")
            worst = max(worst, float((got - want).norm() / want.norm().clamp_min(1e-30)))
    finally:
        session.release()
    return worst


def _fallback(module: nn.Module, why: str) -> None:
    warnings.warn(f"mmaccel: {type(module).__name__} runs eagerly: {why}", stacklevel=3)
    return None
