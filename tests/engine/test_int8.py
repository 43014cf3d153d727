"""Int8 linears: the rounding bound, the dequantised product, and the dynamically quantised CPU
operator against both the float layer and the dequantised product, each token at its own scale."""

import pytest
import torch
from torch import nn

from mmaccel.engine import int8 as quant
from mmaccel.engine.int8 import Int8Linear, int8_matmul, quantize_rows
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


def test_each_token_gets_its_own_activation_scale():
    """Rows four orders of magnitude apart: with one scale per call the quiet rows would round to nothing (the noisy
    audio that broke the int8 encoder); per token each row is quantised alone, bitwise as in a call of its own."""
    torch.manual_seed(3)
    lin = nn.Linear(256, 128)
    x = torch.randn(40, 256) * torch.logspace(-3, 1, 40)[:, None]
    q = Int8Linear(lin)
    with torch.inference_mode():
        ref, got = lin(x), q(x)
        alone = torch.cat([q(row[None]) for row in x])
    per_row = (got - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(per_row.max()) < 0.05
    if DYNAMIC:
        assert torch.equal(got, alone)          # bitwise: a row's output does not depend on the rows beside it
        flat = x.reshape(-1, 256)
        one_scale = torch.ops.quantized.linear_dynamic(flat, q._packed(), quant.REDUCE_RANGE) + lin.bias.detach()
        assert float(((one_scale - ref).norm(dim=1) / ref.norm(dim=1)).max()) > 0.5     # what per-call scales lose
