"""Precision as a property of a loaded model: which one runs here, and the converted copy that runs it.

- `fp32`: the model as loaded (the reference every other precision is relaxed against).
- `bf16`: a bf16 copy; native on CUDA and on CPUs with AVX512-BF16 / AMX. Elsewhere a CPU emulates it several times
  slower than fp32, so asking for it there is an error, and "auto" does not pick it.
- `int8`: a copy whose linear layers are `Int8Linear` (a scale per weight row, a scale per token); convolutions,
  norms, embeddings and attention stay fp32, as CTranslate2's `int8_float32` keeps them.
- `auto`: per part, by what bounds it (`resolve_precision`, which says which and why): compute-bound work that runs
  compiled on a CPU with int8 dot-product units in int8 (`mmaccel.engine.compiled`), else in bf16 where it is
  native, else fp32; a CPU decoder's bandwidth-bound one-token passes in int8.

A converted copy never modifies the model it came from.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from mmaccel.engine.int8 import Int8Linear
from mmaccel.engine.machine import cpu_bf16_units, cpu_int8_units, fast_bf16_matmul
from mmaccel.errors import InputError, check

PRECISIONS = ("fp32", "bf16", "int8")
CHOICES = ("auto", *PRECISIONS)


@dataclass(frozen=True)
class Precision:
    """A resolved precision: what runs (`name`), what was asked for and why this one."""

    name: str           # fp32 | bf16 | int8
    requested: str      # auto | fp32 | bf16 | int8
    reason: str         # one line, e.g. "auto: bf16 (this CPU has avx512_bf16)"


def check_precision(precision: str, choices: tuple[str, ...] = PRECISIONS) -> str:
    """`precision` if it is one of `choices`, else a one-line error naming them."""
    check(precision in choices, f"unknown precision {precision!r}; choose from {', '.join(choices)}")
    return precision


BOUNDS = ("compute", "bandwidth")


def resolve_precision(requested: str, device: torch.device | str = "cpu", bound: str = "compute",
                      compiled: bool = False) -> Precision:
    """The precision `requested` runs as on `device` ("auto" resolved; bf16 refused where it is not native).

    `bound`: what limits the part it is for, which decides "auto" (`mmaccel bench floor` measured both): a
    compute-bound part (an encoder window, a prompt) runs bf16 where it is native (twice fp32's GEMM rate), else
    fp32; a bandwidth-bound part on a CPU (a decoder's one-token passes, which read every weight) runs int8, a
    quarter of fp32's bytes (bf16 mat-vec products measured slower than fp32 there); on CUDA both run bf16.
    `compiled`: the part can run compiled (`mmaccel.engine.compiled`, OpenVINO present); a compute-bound one then
    runs int8 on a CPU with int8 dot-product units (VNNI / AMX): its int8 products with per-token activation scales
    beside bf16 (where native) for the rest measured fastest there, at CTranslate2's error
    (`benchmarks/engine/precision_choices.json`)."""
    check_precision(requested, CHOICES)
    check(bound in BOUNDS, f"unknown bound {bound!r}; choose from {', '.join(BOUNDS)}")
    device = torch.device(device)
    where = "CUDA" if device.type == "cuda" else "this CPU"
    units = cpu_bf16_units()
    native = fast_bf16_matmul(device)
    if requested == "auto":
        if bound == "bandwidth" and device.type == "cpu":
            return Precision("int8", requested, "auto: int8 (one-token passes read every weight; int8 reads a "
                                                "quarter of fp32's bytes)")
        if compiled and device.type == "cpu" and cpu_int8_units():
            return Precision("int8", requested, f"auto: int8, compiled (this CPU has {', '.join(cpu_int8_units())})")
        if native:
            has = "native bf16" if device.type == "cuda" else ", ".join(units)
            return Precision("bf16", requested, f"auto: bf16 ({where} has {has})")
        return Precision("fp32", requested, f"auto: fp32 ({where} has no native bf16 units, AVX512-BF16 or AMX)")
    if requested == "bf16" and not native:
        raise InputError("precision 'bf16' needs native bf16 units (AVX512-BF16 or AMX) or CUDA; this CPU would "
                         "emulate it several times slower than fp32: use precision='auto', 'fp32' or 'int8'")
    return Precision(requested, requested, f"{requested} (asked for)")


def convert(module: nn.Module, precision: str) -> nn.Module:
    """`module` itself for fp32, else a converted copy in eval mode: bf16 throughout, or int8 linear layers
    (every `nn.Linear` inside it; the rest stays as it is)."""
    check_precision(precision)
    check(isinstance(module, nn.Module), f"convert takes an nn.Module, got {type(module).__name__}")
    if precision == "fp32":
        return module
    variant = copy.deepcopy(module).eval()
    if precision == "bf16":
        return variant.to(torch.bfloat16)
    linears = [(owner, name) for owner in variant.modules() for name, child in owner.named_children()
               if isinstance(child, nn.Linear)]
    check(bool(linears), f"{type(module).__name__} has no linear layers to run in int8")
    for owner, name in linears:
        setattr(owner, name, Int8Linear(getattr(owner, name)))
    return variant
