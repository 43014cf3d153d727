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


def random_tree(g: torch.Generator, p: torch.Tensor, filler: float = 0.1, ragged: bool = False):
    """A TokenTree for laws p [B, N, V]: parents drawn below each node; a child's token is likely under its
    parent's law (so paths get accepted deep), with repeated sibling tokens and some filler (-1) nodes;
    ragged: each row's nodes from a random count on are all filler (as chain_tree pads a row's tail)."""
    from mmaccel.core.tree import TokenTree

    B, N, V = p.shape
    parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, N)])
                           for _ in range(B)])
    likely = torch.multinomial(p.reshape(B * N, V), 2, replacement=True, generator=g).reshape(B, N, 2)
    at_parent = likely.gather(1, parents.clamp_min(0)[..., None].expand(-1, -1, 2))
    pick = torch.randint(0, 2, (B, N, 1), generator=g)
    tokens = torch.where(torch.rand(B, N, generator=g) < 0.8, at_parent.gather(2, pick)[..., 0],
                         torch.randint(0, V, (B, N), generator=g))
    tokens = torch.where((torch.rand(B, N, generator=g) < filler) & (parents >= 0), -1, tokens)
    if ragged:
        real = torch.randint(1, N + 1, (B, 1), generator=g)
        tokens = torch.where(torch.arange(N)[None, :] >= real, -1, tokens)
    return TokenTree(tokens, parents)
