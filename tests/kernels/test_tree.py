"""The fused token-tree kernels (ancestor mask, greedy and sampled verification) equal their
references, and sampled verification keeps the target law, checked through Triton's interpreter on a
CPU (tests/kernels/interpreted_tree.py)."""

import pytest

from mmaccel.kernels.dispatch import triton_available


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_kernel_under_the_interpreter(interpreted):
    interpreted("tree")
