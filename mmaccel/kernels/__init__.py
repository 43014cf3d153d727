"""Fused kernels for the memory-bound steps of decoding, each with a PyTorch reference twin.

`dispatch.use_triton(...)` decides per call: Triton on CUDA tensors, the reference elsewhere
(`MMACCEL_KERNELS=torch` forces the reference, `=triton` forces Triton, e.g. under
`TRITON_INTERPRET=1` on a CPU for the tests). Callers (the acceptance rules) call the dispatcher only.
"""
