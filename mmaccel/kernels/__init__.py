"""Fused kernels for the memory-bound steps of decoding, each with a PyTorch reference twin.

`dispatch.use_triton(...)` decides per call: Triton on CUDA tensors, the reference elsewhere
(`MMACCEL_KERNELS=torch` forces the reference, `=triton` forces Triton, e.g. under
`TRITON_INTERPRET=1` on a CPU for the tests). Callers (the acceptance rules) call the dispatcher only.

    speculative.py  exact chain verification        core.acceptance.accept_speculative
    pooled.py       LANTERN pooled acceptance       core.acceptance.accept_pooled
    grouped.py      GSD grouped acceptance          core.acceptance.accept_grouped(_coupled)
    tree_verify.py  token-tree verification         core.tree.verify_tree_sampled / verify_tree_greedy
    tree_mask.py    ancestor-or-self tree mask      core.tree.TokenTree.mask
    race.py         the exponential race over a vocabulary row, shared by the above

`mmaccel bench kernels` times each against its reference, eager and under `torch.compile`.
"""
