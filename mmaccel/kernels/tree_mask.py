"""The ancestor-or-self mask of a token tree (Triton).

The reference is `TokenTree.mask()` in `mmaccel.core.tree` (the EAGLE-2 / Medusa tree mask,
reference video_core.md B.12): node i may attend to node j when j is i or one of its ancestors.
One program builds one row mask[b, i, :] by walking the parent pointers from i up to the root, so
it takes depth(i) steps; positions (prefix + depth) are read off the mask by its users as before.
N is a compile-time constant.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _ancestor_mask(parents_ptr, mask_ptr, N: tl.constexpr, NB: tl.constexpr):
    i = tl.program_id(0)
    b = tl.program_id(1)
    slots = tl.arange(0, NB)
    row = slots == i
    node = tl.load(parents_ptr + b * N + i)
    while node >= 0:
        row = row | (slots == node)
        node = tl.load(parents_ptr + b * N + node)
    tl.store(mask_ptr + (b * N + i) * N + slots, row.to(tl.int8), mask=slots < N)


def ancestor_mask(parents: Tensor) -> Tensor:
    """Ancestor-or-self mask [B, N, N] (bool) from parents [B, N] (-1 for the root, parents[:, i] < i)."""
    B, N = parents.shape
    mask = torch.empty(B, N, N, dtype=torch.int8, device=parents.device)
    _ancestor_mask[(N, B)](parents.contiguous(), mask, N, triton.next_power_of_2(N))
    return mask.view(torch.bool)
