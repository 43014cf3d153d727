"""Host or device: where decoding bookkeeping may read tensor values, and the checks that follow.

On a GPU reading a value back on the host waits for every queued kernel, so the decode loop and the
small helpers under it have two backends, chosen by `on_host`: plain host checks on a CPU, and
asynchronous device asserts with fixed shapes on a GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmaccel.errors import check


def on_host(device: torch.device | str) -> bool:
    """Whether decoding bookkeeping on `device` may read values on the host at no cost: everywhere but a
    GPU, where a read waits for every queued kernel. The two backends of the small helpers below (and
    of the decode loop's) are chosen by this."""
    return torch.device(device).type != "cuda"


def expect(condition: Tensor, message: str) -> None:
    """A check on tensor values: an `InputError` at once on the host; on a GPU an asynchronous device
    assert (raised at the next synchronisation, without making the host wait here)."""
    if on_host(condition.device):
        check(bool(condition.all()), message)
    else:
        torch._assert_async(condition.all(), message)


def as_row_counts(n: int | Tensor, batch: int, name: str = "n", device: torch.device | str = "cpu") -> Tensor:
    """Normalise an int or a [B] tensor of per-row counts to a LongTensor [B] on `device` (checked >= 0)."""
    if isinstance(n, Tensor):
        check(n.dim() == 1 and n.shape[0] == batch, f"{name} must be an int or a [{batch}] tensor, got shape {tuple(n.shape)}")
        counts = n.detach().to(device, torch.long)
    else:
        check(isinstance(n, int), f"{name} must be an int or a tensor, got {type(n).__name__}")
        counts = torch.full((batch,), n, dtype=torch.long, device=device)
    expect(counts >= 0, f"{name} must be >= 0")
    return counts
