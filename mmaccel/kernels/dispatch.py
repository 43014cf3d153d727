"""Which implementation a kernel call takes: Triton or its PyTorch reference."""

from __future__ import annotations

import functools
import importlib.util
import os

from torch import Tensor

from mmaccel.errors import check

ENV = "MMACCEL_KERNELS"     # auto (default) | triton | torch


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(*tensors: Tensor) -> bool:
    """True when the call should run the Triton kernel: every tensor on CUDA (or MMACCEL_KERNELS=triton,
    which the interpreter tests set together with TRITON_INTERPRET=1) and Triton installed."""
    mode = os.environ.get(ENV, "auto")
    check(mode in ("auto", "triton", "torch"), f"{ENV} must be auto, triton or torch, got {mode!r}")
    if mode == "torch" or not triton_available():
        return False
    return mode == "triton" or all(t.is_cuda for t in tensors)
