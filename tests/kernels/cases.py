"""Random inputs for the kernel checks: laws on a dyadic grid, where every float32 sum is exact in any
order (so a kernel must equal its reference bit for bit, deviation included), or on a continuous one,
where only the order of float32 sums may differ (tokens equal, deviations equal to rounding)."""

import torch

GRID = 2.0 ** -16        # probabilities k * GRID: sums below 2**8 need no rounding in float32


def laws(g: torch.Generator, shape: tuple[int, ...], dyadic: bool) -> torch.Tensor:
    """Peaked random distributions over the last dimension; dyadic ones have many exact ties."""
    p = torch.rand(shape, generator=g).pow(3)
    p /= p.sum(-1, keepdim=True)
    return (p / GRID).floor() * GRID if dyadic else p


def chain_case(g: torch.Generator, B: int, K: int, V: int, dyadic: bool):
    """drafts [B, K] drawn from q, q [B, K, V], p [B, K+1, V], uniforms [B, K], exponentials [B, K+1, V]."""
    p = laws(g, (B, K + 1, V), dyadic)
    q = laws(g, (B, K, V), dyadic)
    drafts = torch.multinomial(q.reshape(-1, V) + 1e-12, 1, generator=g).reshape(B, K)
    return drafts, q, p, torch.rand(B, K, generator=g), torch.empty(B, K + 1, V).exponential_(generator=g)


def with_reference(fn, *args, **kwargs):
    """fn's result with the reference forced (MMACCEL_KERNELS=torch), then with the kernel forced."""
    import os

    os.environ["MMACCEL_KERNELS"] = "torch"
    ref = fn(*args, **kwargs)
    os.environ["MMACCEL_KERNELS"] = "triton"
    return ref, fn(*args, **kwargs)
