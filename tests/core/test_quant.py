"""Weight-only int8 linears: the rounding bound, the CPU kernel against a dequantised reference,
and the bf16 copy for products of many rows."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmaccel.core.quant import Int8Linear, int8_matmul, quantize_rows
from mmaccel.errors import InputError


def test_rows_round_trip_within_half_a_step():
    w = torch.randn(48, 40, generator=torch.Generator().manual_seed(0))
    w[3] = 0                                                   # an all-zero row keeps a finite scale
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert torch.isfinite(scale).all()
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-7).all())


@pytest.mark.parametrize("width", [64, 40, 8])      # the CPU kernel takes multiples of 16; the rest dequantise
def test_the_product_equals_the_dequantised_one(width):
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(96, width, generator=g), torch.randn(2, 3, width, generator=g)
    q, scale = quantize_rows(w)
    got = int8_matmul(x, q, scale)
    assert got.shape == (2, 3, 96) and got.dtype == x.dtype
    # bf16 activations and scales: within bf16 rounding of the dequantised product
    ref = x.bfloat16().float() @ (q.float() * scale.bfloat16().float()[:, None]).T
    torch.testing.assert_close(got, ref, atol=0.05, rtol=0.02)


def test_int8_linear_stays_close_to_the_float_layer():
    torch.manual_seed(2)
    lin = nn.Linear(64, 32)
    x = torch.randn(5, 64)
    q = Int8Linear(lin)
    ref = lin(x)
    rel = (q(x) - ref).norm() / ref.norm()
    assert float(rel) < 0.02
    assert "int8" in repr(q)
    with pytest.raises(InputError, match="wraps an nn.Linear"):
        Int8Linear(nn.Conv1d(2, 2, 1))


def test_many_rows_run_on_the_bf16_copy_and_few_on_int8():
    torch.manual_seed(3)
    lin = nn.Linear(64, 32)
    q = Int8Linear(lin, bf16_rows=4)
    few, many = torch.randn(3, 64), torch.randn(2, 2, 64)
    with torch.no_grad():
        torch.testing.assert_close(q(few), int8_matmul(few, q.weight, q.scale, q.bias))
        bf16 = (F.linear(many.bfloat16(), lin.weight.bfloat16()) + lin.bias).float()
        torch.testing.assert_close(q(many), bf16)
        assert float((q(many) - lin(many)).norm() / lin(many).norm()) < 0.02
    assert Int8Linear(lin).weight_bf16 is None                             # no copy unless asked
    with pytest.raises(InputError, match="bf16_rows must be None or an int >= 1"):
        Int8Linear(lin, bf16_rows=0)
