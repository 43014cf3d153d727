"""What one pass must read and compute, and the time under which no implementation can run it (its floor).

`trace_pass(run, weights, cache)` runs a pass once and counts what its products read: every op that multiplies
(matrix products, attention, embedding lookups, convolutions) is seen by a dispatch mode, which adds up the bytes
of its operands by kind, each tensor once per pass:

- weights: tensors of the model (`weights`), whole for products, the rows looked up for embeddings;
- kv: the self-attention cache (`cache`) as attention reads it (the used slots of every row);
- cross: the other keys/values attention reads (Whisper's cross-attention over 1500 audio frames);
- activations: everything else the products read (hidden states; small at one token, large in an encoder).

FLOPs come from torch's own `FlopCounterMode`. A traced cost is converted to another precision's bytes (`at`):
bf16 halves every tensor, int8 quarters the weights and keeps bf16 keys/values. The floor is the roofline of the
machine measured in the same run (`Machine.floor_s`): the larger of bytes / read bandwidth and FLOPs / GEMM rate.
A measured time below its floor means the pass ran from cache (its bytes fit the last-level cache).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from mmaccel.engine.machine import Machine
from mmaccel.engine.precision import check_precision

aten = torch.ops.aten
# the ops that multiply, as a dispatch mode sees them (in inference mode composite ops such as linear and
# scaled_dot_product_attention arrive whole; elsewhere they arrive decomposed)
PRODUCTS = {aten.linear.default, aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
            aten.matmul.default, aten.conv1d.default, aten.conv2d.default, aten.convolution.default,
            aten._weight_int8pack_mm.default, aten._int_mm.default}
EMBEDDINGS = {aten.embedding.default, aten.index_select.default}
ATTENTION = {getattr(aten, name).default for name in (
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math") if hasattr(aten, name)}
# bytes per element of each kind, relative to the traced (fp32) model, per precision
SCALE = {"fp32": {"weights": 1.0, "kv": 1.0, "cross": 1.0, "activations": 1.0},
         "bf16": {"weights": 0.5, "kv": 0.5, "cross": 0.5, "activations": 0.5},
         "int8": {"weights": 0.25, "kv": 0.5, "cross": 0.5, "activations": 1.0}}


@dataclass(frozen=True)
class PassCost:
    """Bytes read (by kind) and FLOPs of one pass."""

    weights: int
    kv: int
    cross: int
    activations: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.weights + self.kv + self.cross + self.activations

    def at(self, precision: str) -> PassCost:
        """This cost (traced in fp32) as `precision` stores it (see the module docstring)."""
        scale = SCALE[check_precision(precision)]
        return PassCost(*(round(getattr(self, k) * scale[k]) for k in ("weights", "kv", "cross", "activations")),
                        self.flops)

    def floor_s(self, machine: Machine, precision: str) -> float:
        """The roofline floor of this pass (traced in fp32) in `precision` on `machine`."""
        cost = self.at(precision)
        return machine.floor_s(cost.bytes, cost.flops, precision)

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes": self.bytes}


def _key(t: Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def _nbytes(t: Tensor) -> int:
    """The distinct bytes a view holds: broadcast (stride 0) dimensions read the same elements again."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        n *= size if stride != 0 else 1
    return n * t.element_size()


def _tensors(value) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class _ReadCounter(TorchDispatchMode):
    """Adds up the bytes the products of a pass read, by kind (see the module docstring).

    A tensor computed from a weight or the cache by an op of that one tensor (a dtype cast, the copy that expands
    grouped keys/values to every head) stands for what it came from: reading it counts its origin's bytes, once."""

    def __init__(self, weights: set[int], cache: set[int]):
        super().__init__()
        self.direct = {**{p: "weights" for p in weights}, **{p: "kv" for p in cache}}
        self.derived: dict[int, tuple[str, tuple, int]] = {}      # storage -> (kind, origin key, origin bytes)
        self.bytes = {"weights": 0, "kv": 0, "cross": 0, "activations": 0}
        self.seen: set[tuple] = set()
        self.alive: list[Tensor] = []       # what was counted or derived stays allocated for the pass: a freed
                                            # storage's address reused by another tensor would alias its key

    def _origin(self, t: Tensor, attention_kv: bool) -> tuple[str, tuple, int]:
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.direct:
            return self.direct[ptr], _key(t), _nbytes(t)
        if ptr in self.derived:
            return self.derived[ptr]
        return ("cross" if attention_kv else "activations"), _key(t), _nbytes(t)

    def _count(self, t: Tensor, attention_kv: bool) -> None:
        kind, key, nbytes = self._origin(t, attention_kv)
        if key not in self.seen:
            self.seen.add(key)
            self.alive.append(t)
            self.bytes[kind] += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = _tensors(list(args))
        if func in EMBEDDINGS:            # a lookup reads the rows it returns
            if inputs and isinstance(out, Tensor):
                kind = self._origin(inputs[0], False)[0]
                self.bytes[kind if kind != "activations" else "weights"] += _nbytes(out)
        elif func in PRODUCTS or func in ATTENTION:
            for i, t in enumerate(inputs):
                if func in ATTENTION and i >= 3:
                    break                                          # masks: not operands
                self._count(t, func in ATTENTION and i in (1, 2))  # attention's keys and values
        elif len(inputs) == 1:            # a copy of a weight or of the cache (one input: not arithmetic) stands for it
            sources = [o for o in (self._origin(inputs[0], False),) if o[0] in ("weights", "kv")]
            if sources:
                for t in _tensors(out):
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in self.direct and ptr not in self.derived:
                        self.derived[ptr] = sources[0]
                        self.alive.append(t)
        return out


def _pointers(tensors: Iterable[Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, Tensor)}


def trace_pass(run: Callable[[], object], weights: Iterable[Tensor], cache: Iterable[Tensor] = ()) -> PassCost:
    """Run `run()` once and count what its products read and compute. `weights`: the model's tensors; `cache`: the
    self-attention cache buffers (a `KVCache`'s k and v)."""
    counter = _ReadCounter(_pointers(weights), _pointers(cache))
    flops = FlopCounterMode(display=False)
    with torch.inference_mode(), flops, counter:
        run()
    return PassCost(**counter.bytes, flops=int(flops.get_total_flops()))


def model_tensors(*modules: torch.nn.Module) -> list[Tensor]:
    """The parameters and buffers of `modules` (what `trace_pass` counts as weights)."""
    return [t for m in modules for t in (*m.parameters(), *m.buffers())]
