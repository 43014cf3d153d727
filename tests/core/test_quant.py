"""Int8 linears: the rounding bound, the dequantised product, and the dynamically quantised CPU
operator against both the float layer and the dequantised product."""

import pytest
import torch
from torch import nn

from mmaccel.core import quant
from mmaccel.core.quant import Int8Linear, int8_matmul, quantize_rows
from mmaccel.errors import InputError

DYNAMIC = torch.backends.quantized.engine in quant.DYNAMIC_ENGINES


def test_rows_round_trip_within_half_a_step():
    w = torch.randn(48, 40, generator=torch.Generator().manual_seed(0))
    w[3] = 0                                                   # an all-zero row keeps a finite scale
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert torch.isfinite(scale).all()
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-7).all())


def test_the_product_equals_the_dequantised_one():
    g = torch.Generator().manual_seed(1)
    w, x, b = torch.randn(96, 40, generator=g), torch.randn(2, 3, 40, generator=g), torch.randn(96, generator=g)
    q, scale = quantize_rows(w)
    got = int8_matmul(x, q, scale, b)
    assert got.shape == (2, 3, 96) and got.dtype == x.dtype
    torch.testing.assert_close(got, x @ (q.float() * scale[:, None]).T + b)


@pytest.mark.parametrize("rows", [1, 5, 70])
def test_int8_linear_stays_close_to_the_float_layer(rows, monkeypatch):
    torch.manual_seed(2)
    lin = nn.Linear(64, 32)
    x = torch.randn(rows, 2, 64)
    keep = x.clone()
    q = Int8Linear(lin)
    with torch.inference_mode():
        ref, got = lin(x), q(x)
        assert got.shape == ref.shape and got.dtype == x.dtype
        assert float((got - ref).norm() / ref.norm()) < 0.02
        assert (q.packed is not None) == DYNAMIC              # the operator ran where the engine has it
        monkeypatch.setattr(quant, "DYNAMIC_ENGINES", ())      # elsewhere: the dequantised product
        dequantised = q(x)
    torch.testing.assert_close(dequantised, int8_matmul(x, q.weight, q.scale, q.bias))
    # the dynamic operator only adds its activation rounding (7 bits) to the weights'
    assert float((got - dequantised).norm() / dequantised.norm()) < 0.02
    torch.testing.assert_close(x, keep, rtol=0, atol=0)
    assert "int8" in repr(q)


def test_int8_linear_keeps_the_input_dtype_and_rejects_other_modules():
    lin = nn.Linear(32, 16, bias=False)
    q = Int8Linear(lin)
    with torch.inference_mode():
        y = q(torch.randn(3, 32, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and y.shape == (3, 16)
    with pytest.raises(InputError, match="wraps an nn.Linear"):
        Int8Linear(nn.Conv1d(2, 2, 1))
