"""Where models run: one place that turns a user's `device=` / `dtype=` into checked torch objects.

CPU is the default everywhere; "auto" picks CUDA when torch sees a GPU. A device or dtype this
machine cannot run is a clear `InputError` here, before any weights move, not an error from deep
inside torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from mmaccel.errors import InputError, check

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """None / "cpu" -> cpu; "auto" -> cuda when available, else cpu; "cuda" / "cuda:N" checked against
    the GPUs torch sees."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"unknown device {device!r}: use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {str(device)!r} was asked for, but torch sees no CUDA GPU on this machine "
                             f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use device='cpu'")
        count = torch.cuda.device_count()
        check(dev.index is None or dev.index < count, f"device {str(device)!r}: this machine has {count} GPU(s), "
              f"cuda:0..cuda:{count - 1}")
    elif dev.type not in ("cpu", "meta"):
        raise InputError(f"device {str(device)!r} is not supported: use cpu, cuda, cuda:N or auto")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype | None:
    """None keeps each checkpoint's own dtype; otherwise a floating dtype the device can run."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise InputError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    check(isinstance(dtype, torch.dtype) and dtype.is_floating_point,
          f"dtype must be a floating torch dtype (float32, bfloat16, float16), got {dtype!r}")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise InputError(f"{torch.cuda.get_device_name(device)} cannot run bfloat16; use dtype=float16 or float32")
    return dtype


def add_device_option(parser, default: str | None = "cpu") -> None:
    """The `--device` and `--cuda-graphs` options every command shares."""
    parser.add_argument("--device", default=default, help="cpu (default), cuda, cuda:N or auto (cuda when there is a GPU)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay the fixed-shape decode steps as CUDA graphs (with --device cuda)")


def module_device(module: Any) -> torch.device | None:
    """The device of a module's first parameter (or buffer), None for a module without tensors."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return None


def check_same_device(named: Iterable[tuple[str, Any]]) -> None:
    """Modules that run together must live on one device: a clear error naming both otherwise."""
    seen: list[tuple[str, torch.device]] = []
    for name, module in named:
        if module is None:
            continue
        device = module_device(module)
        if device is None:
            continue
        for other, other_device in seen:
            if device != other_device:
                raise InputError(f"the {name} is on {device} but the {other} is on {other_device}: load them on "
                                 f"one device (from_pretrained(..., device=...)) or move them with .to(device)")
        seen.append((name, device))


def use_cuda_graphs(enabled: bool, device: torch.device, *models: Any) -> None:
    """Replay the fixed-shape decode steps of `models` as CUDA graphs (`mmaccel.core.graphs`) when
    `enabled`: on a GPU only, and for models that offer it (a `cuda_graphs` switch)."""
    check(isinstance(enabled, bool), f"cuda_graphs must be True or False, got {enabled!r}")
    if not enabled:
        return
    check(device.type == "cuda", f"cuda_graphs=True needs device='cuda', got {str(device)!r}: CUDA graphs replay "
          "GPU kernels (on the CPU the eager steps run)")
    for model in models:
        if model is not None:
            check(hasattr(model, "cuda_graphs"), f"{type(model).__name__} does not offer CUDA graphs")
            model.cuda_graphs = True
