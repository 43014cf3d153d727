"""The fused GSD grouped-acceptance kernels equal `accept_grouped` and `accept_grouped_coupled`, checked through Triton's
interpreter on a CPU (tests/kernels/interpreted_grouped.py)."""

import pytest

from mmaccel.kernels.dispatch import triton_available


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_kernel_under_the_interpreter(interpreted):
    interpreted("grouped")
