"""The fused LANTERN pooled-acceptance kernel equals `accept_pooled` and keeps the target law at
delta = 0, checked through Triton's interpreter on a CPU (tests/kernels/interpreted_pooled.py)."""

import pytest

from mmaccel.kernels.dispatch import triton_available


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_kernel_under_the_interpreter(interpreted):
    interpreted("pooled")
