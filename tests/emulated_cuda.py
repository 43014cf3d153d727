"""A CUDA device emulated on the CPU, for device-consistency and host-sync checks without a GPU.

Inside `emulated_cuda()` torch believes a GPU is present: `device="cuda"` factories, `.to("cuda")` and
`.cuda()` give `Emulated` tensors (CPU data that report `cuda:0`), modules move onto it, and every torch
call that mixes an emulated tensor with a CPU tensor of one or more dimensions fails with CUDA's own
message, as a GPU would (0-dim CPU tensors are scalars there; CPU index tensors are copied over, as
CUDA indexing allows). So a stray CPU tensor in a decode path is caught by a CPU-only test.

The context also counts what makes the host wait on a GPU (`Report.syncs`): reading values back
(`.item()`, `.tolist()`, `bool()`, `int()`, `.cpu()`), data-dependent shapes (`nonzero`, boolean-mask
indexing) and CPU index tensors; and host tensors uploaded (`Report.uploads`: from pageable memory the
host waits for those as well). A sync-free decode step shows no growth of either with the number of
steps. `torch.Generator(device="cuda")` gives a CPU generator, `torch.cuda.Event` is a no-op and
`pin_memory=True` plain host memory, so device-side code paths run unchanged.

CUDA graphs are emulated as they behave: `torch.cuda.graph(g)` records the aten ops of the region
(`_Capture`), and its effects are undone when it ends (memory written is restored, memory allocated
in it holds garbage), since a real capture runs nothing; `g.replay()` runs the recorded ops again on
the same tensors, writing fresh results into the tensors the capture allocated. Python code does not
run again at replay, so a step that reassigns an attribute or reads a value on the host instead of
updating its tensors in place gives wrong results here, as on a GPU. A host read or an upload inside a
capture is an error, as on a GPU. `Report.replays` counts replays.

Triton kernels are not emulated: the context sets MMACCEL_KERNELS=torch, so the dispatcher takes the
PyTorch references (the kernels themselves are checked under TRITON_INTERPRET=1 in tests/kernels).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

# calls that read device values on the host (or size an output by them)
SYNCS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero", "masked_select",
         "unique", "unique_consecutive", "argwhere", "__len__"}
READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "__len__"}   # host values out
# calls where a CPU source tensor is a legal host-to-device copy
COPIES = {"copy_", "__setitem__", "index_put_", "module_load"}
INDEXING = {"__getitem__", "__setitem__", "index", "index_put_"}


class Report:
    """What the host waited for inside the context, by kind."""

    def __init__(self):
        self.syncs: list[str] = []
        self.uploads = 0        # host tensors copied to the device (from pageable memory the host waits for those too)
        self.pinned = 0         # page-locked host buffers asked for (the emulation gives plain ones)
        self.capturing = False  # inside torch.cuda.graph: a host read or upload is an error there
        self.replays = 0        # CUDA graph replays

    def sync(self, kind: str) -> None:
        if self.capturing:
            raise RuntimeError("emulated CUDA: operation not permitted when stream is capturing "
                               f"({kind} reads the device on the host)")
        self.syncs.append(kind)

    def upload(self) -> None:
        if self.capturing:
            raise RuntimeError("emulated CUDA: operation not permitted when stream is capturing "
                               "(a host tensor copied to the device)")
        self.uploads += 1

    def count(self) -> int:
        return len(self.syncs)

    def kinds(self) -> Counter:
        return Counter(self.syncs)


class Emulated(torch.Tensor):
    """CPU data reporting cuda:0. Only the function mode below handles it: an op that reaches the
    dispatcher directly would compute on no data, so that is an error."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                   device=torch.device("cuda", 0), requires_grad=inner.requires_grad,
                                                   storage_offset=inner.storage_offset())

    def __init__(self, inner: torch.Tensor):
        self.inner = inner

    def __repr__(self) -> str:
        return f"Emulated({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"emulated CUDA: {func} reached the dispatcher outside the function mode")


def _wrap(x):
    return Emulated(x) if isinstance(x, torch.Tensor) and not isinstance(x, Emulated) else x


def _unwrap(x):
    return x.inner if isinstance(x, Emulated) else x


# Every torch call goes through the mode, so its walk over the arguments is most of an emulated decode's
# time. The two walks below are pytree's `tree_leaves` and `tree_map` (same order, same containers) with
# a fast path for the plain tuples, lists and dicts of tensors and scalars that torch calls take; anything
# else (named tuples, torch.Size, ...) goes to pytree itself.
_SCALARS = (int, float, type(None), torch.dtype, torch.device, slice, str, type(...), complex, torch.layout,
            torch.memory_format)


def _tensors(tree, found: list | None = None) -> list[torch.Tensor]:
    """The tensors among `tree_leaves(tree)` (a tuple, list or dict), in its order."""
    found = [] if found is None else found
    for x in tree.values() if type(tree) is dict else tree:
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif type(x) in (tuple, list, dict):
            _tensors(x, found)
        elif not isinstance(x, _SCALARS):
            found.extend(y for y in tree_leaves(x) if isinstance(y, torch.Tensor))
    return found


def _map_tensors(fn, tree):
    """`tree_map(fn, tree)` for an `fn` that leaves everything but tensors as it is."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind([fn(x) if isinstance(x, torch.Tensor) else x if isinstance(x, _SCALARS) else _map_tensors(fn, x)
                     for x in tree])
    if kind is dict:
        return {k: _map_tensors(fn, v) for k, v in tree.items()}
    return tree if isinstance(tree, _SCALARS) else tree_map(fn, tree)


class _Mode(TorchFunctionMode):
    def __init__(self, report: Report):
        super().__init__()
        self.report = report

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda", "cpu"):
            return self._move(name, args, kwargs)
        tensors = _tensors((args, kwargs))
        emulated = any(isinstance(x, Emulated) for x in tensors)
        if name == "_has_compatible_shallow_copy_type":          # Module.to: new parameters, never `.data = `
            return not emulated
        if emulated and name not in ("__get__", "__set__"):      # properties read the wrapper's own metadata
            self._check_devices(name, tensors)
            out = func(*_map_tensors(_unwrap, args), **_map_tensors(_unwrap, kwargs))
            if name in READS or (name == "module_load" and not isinstance(args[0], Emulated)):
                return out                                        # host values; a CPU module loading device data
            return _map_tensors(_wrap, out)
        if kwargs.pop("pin_memory", False):                      # page-locked host memory needs the driver
            self.report.pinned += 1
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":   # a factory: torch.zeros(..., device="cuda")
            kwargs["device"] = "cpu"
            return _map_tensors(_wrap, func(*args, **kwargs))
        return func(*args, **kwargs)

    def _check_devices(self, name: str, tensors: list[torch.Tensor]) -> None:
        stray = [x for x in tensors if not isinstance(x, Emulated) and x.dim() > 0]
        if stray and name in INDEXING and all(not x.is_floating_point() for x in stray):
            self.report.sync("cpu index")                         # legal: CUDA copies the indices over
            stray = []
        if stray and name not in COPIES:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:0 and cpu! (emulated CUDA: {name} got a CPU tensor of shape {tuple(stray[0].shape)})")
        if name in SYNCS or (name == "__getitem__" and any(x.dtype == torch.bool for x in tensors[1:])):
            self.report.sync(name)

    def _move(self, name: str, args, kwargs):
        tensor = args[0]
        if name == "cuda":
            device, dtype = torch.device("cuda"), None
        elif name == "cpu":
            device, dtype = torch.device("cpu"), None
        else:
            device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
        inner = _unwrap(tensor)
        if dtype is not None:
            inner = inner.to(dtype)
        if device is None:
            return Emulated(inner) if isinstance(tensor, Emulated) else inner
        if device.type == "cuda":
            if not isinstance(tensor, Emulated):
                self.report.upload()
            return tensor if isinstance(tensor, Emulated) and dtype is None else Emulated(inner)
        if isinstance(tensor, Emulated):
            self.report.sync("cpu")
            return inner.clone()
        return inner


@contextlib.contextmanager
def emulated_cuda():
    """Run the body with a CUDA device emulated on the CPU; yields the `Report` of host syncs.

    The body runs under `torch.inference_mode()` (what every decode path uses; autograd would ask the
    absent driver for a stream)."""
    report = Report()
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)     # Module.to keeps parameter identity (ties)
    _ACTIVE.append(report)
    try:
        with _emulation(report):
            yield report
    finally:
        _ACTIVE.pop()
        torch.__future__.set_swap_module_params_on_conversion(swap)


_Generator = torch.Generator


class _Event:
    """torch.cuda.Event on the emulated device: the work is done when it is queued."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _EmulatedGenerator(_Generator):
    """torch.Generator(device="cuda") on the emulated device: a CPU generator (emulated tensors hold CPU data)."""

    def __new__(cls, device="cpu"):
        return _Generator("cpu" if torch.device(device).type == "cuda" else device)


class _Stream:
    """torch.cuda.Stream on the emulated device: one queue, in order."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _storage(t: torch.Tensor):
    return t.untyped_storage()


class _Capture(TorchDispatchMode):
    """Records the aten ops of a captured region on the emulated device's CPU data (see the module doc)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.saved: dict[int, tuple] = {}       # memory from before the capture written in it: its old bytes
        self.created: dict[int, torch.Tensor] = {}   # fresh outputs by storage: garbage after the capture

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        given = dict(zip((a.name for a in schema.arguments), args)) | kwargs
        for arg in schema.arguments:
            value = given.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
                st = _storage(value)
                if st.data_ptr() not in self.created and st.data_ptr() not in self.saved:
                    self.saved[st.data_ptr()] = (st, st.clone())
        out = func(*args, **kwargs)
        # new memory or a view of its inputs? By storage, not by schema: composite ops seen here may
        # return an input as it is (x.float() of a float) or a view of a copy (reshape)
        inputs = {_storage(x).data_ptr() for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)}
        outs = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        fresh = not any(_storage(x).data_ptr() in inputs for x in outs)
        self.ops.append((func, args, kwargs, out, fresh))
        if fresh:
            self.created.update((_storage(x).data_ptr(), x) for x in outs)
        return out

    def finish(self) -> None:
        """A real capture ran nothing: restore what it wrote, leave garbage in what it allocated."""
        for st, old in self.saved.values():
            st.copy_(old)
        for t in self.created.values():
            t.fill_(float("nan") if t.is_floating_point() else (True if t.dtype == torch.bool else -987654321))


_ACTIVE: list[Report] = []      # the reports of the open contexts, innermost last


class _Graph:
    """torch.cuda.CUDAGraph on the emulated device (it may outlive the context that captured it)."""

    def __init__(self):
        self.ops = None

    def replay(self) -> None:
        assert self.ops is not None, "replay of a graph never captured"
        _ACTIVE[-1].replays += 1
        with torch.inference_mode():
            for func, args, kwargs, out, fresh in self.ops:
                result = func(*args, **kwargs)
                if fresh:
                    for mine, new in zip(tree_leaves(out), tree_leaves(result)):
                        if isinstance(mine, torch.Tensor):
                            mine.copy_(new)


@contextlib.contextmanager
def _captured(report: Report, graph: _Graph, **kwargs):
    mode = _Capture()
    report.capturing = True
    try:
        with mode:
            yield
    finally:
        report.capturing = False
    mode.finish()
    graph.ops = mode.ops


@contextlib.contextmanager
def _emulation(report: Report):
    with mock.patch.object(torch, "Generator", _EmulatedGenerator), mock.patch.object(torch.cuda, "Event", _Event), \
            mock.patch.dict(os.environ, {"MMACCEL_KERNELS": "torch"}), \
            mock.patch.object(torch.cuda, "_lazy_init", lambda: None), \
            mock.patch.object(torch.cuda, "is_available", lambda: True), \
            mock.patch.object(torch.cuda, "device_count", lambda: 1), \
            mock.patch.object(torch.cuda, "is_bf16_supported", lambda *a, **k: True), \
            mock.patch.object(torch.cuda, "get_device_name", lambda *a, **k: "emulated CUDA"), \
            mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None), \
            mock.patch.object(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None), \
            mock.patch.object(torch.cuda, "max_memory_allocated", lambda *a, **k: 0), \
            mock.patch.object(torch.cuda, "Stream", _Stream), \
            mock.patch.object(torch.cuda, "current_stream", lambda *a, **k: _Stream()), \
            mock.patch.object(torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext()), \
            mock.patch.object(torch.cuda, "CUDAGraph", _Graph), \
            mock.patch.object(torch.cuda, "graph", lambda graph, **k: _captured(report, graph, **k)), \
            torch.inference_mode(), _Mode(report):
        yield


def on_host(x):
    """A result of the emulated device as plain CPU data (tensors inside lists, dicts, dataclasses' tensors)."""
    return tree_map(_unwrap, x)
