"""The fused speculative-verification kernel equals its reference and keeps the target law, checked
through Triton's interpreter on a CPU (a fresh process: TRITON_INTERPRET is read when Triton loads)."""

import pytest

from mmaccel.kernels.dispatch import triton_available, use_triton


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_kernel_under_the_interpreter(interpreted):
    interpreted("speculative")


def test_dispatch(monkeypatch):
    import torch

    cpu = torch.zeros(2)
    monkeypatch.setenv("MMACCEL_KERNELS", "auto")
    assert not use_triton(cpu)                                     # CPU tensors take the reference
    monkeypatch.setenv("MMACCEL_KERNELS", "torch")
    assert not use_triton(cpu)
    monkeypatch.setenv("MMACCEL_KERNELS", "fast")
    from mmaccel.errors import InputError
    with pytest.raises(InputError, match="MMACCEL_KERNELS must be"):
        use_triton(cpu)
