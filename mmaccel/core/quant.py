"""Weight-only int8 linear layers, for drafts.

A draft's job is to guess; verification keeps the output exact whatever the draft computes, so a
draft may run on int8 weights. On a CPU a decoding step reads every weight once per token and is
bound by memory bandwidth: int8 weights are a quarter of the fp32 bytes. Each output channel has
one scale (symmetric, max-abs / 127); activations run in bf16 through torch's packed CPU kernel
(`aten._weight_int8pack_mm`, the one gpt-fast uses; it needs the input width to be a multiple of
16), elsewhere through a dequantised product.

(torchao's `Int8WeightOnlyConfig` was measured here first: on this CPU it dequantises the whole
weight at every call and ran 2x slower than fp32, so the kernel is called directly.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.errors import check


def fast_bf16_matmul(device: torch.device) -> bool:
    """Whether bf16 matrix products run natively here (CUDA, or a CPU with AVX512-BF16 / AMX)."""
    if device.type == "cuda":
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [N, K] -> (int8 [N, K], scales [N] fp32) with weight ≈ int8 * scale per row."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scale


def int8_matmul(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ (weight int8 [N, K] * scale [N])ᵀ (+ bias) -> [..., N] in x's dtype (a bf16
    `scale` and an fp32 `bias` save conversions per call on the CPU kernel)."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.is_cpu and flat.shape[-1] % 16 == 0:     # the kernel's blocking (other widths crash)
        bf16 = torch.bfloat16
        y = torch.ops.aten._weight_int8pack_mm(flat.to(bf16), weight, scale if scale.dtype == bf16 else scale.to(bf16))
    else:
        y = F.linear(flat, weight.to(x.dtype)) * scale.to(x.dtype)
    if bias is not None:
        y = y + bias                                     # bf16 + fp32 bias: one op, fp32
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y.view(*x.shape[:-1], weight.shape[0])


class Int8Linear(nn.Module):
    """An `nn.Linear` with int8 weights (per-output-channel scales); the bias stays in float.
    `Int8Linear.of(weight, bias)` builds one from bare tensors (weight [out, in]).

    `bf16_rows`: products of at least that many rows run on a bf16 copy of the weight instead. The
    int8 kernel's time grows with the rows (measured here: 1.2x fp32's at 8 rows of a draft step),
    while native bf16 products (`fast_bf16_matmul`) barely grow, so a batched draft step and a
    multi-token one are cheaper in bf16; one-row steps stay int8, a quarter of the fp32 bytes.
    """

    def __init__(self, linear: nn.Linear, bf16_rows: int | None = None):
        super().__init__()
        check(isinstance(linear, nn.Linear), f"Int8Linear wraps an nn.Linear, got {type(linear).__name__}")
        check(bf16_rows is None or (isinstance(bf16_rows, int) and bf16_rows >= 1),
              f"bf16_rows must be None or an int >= 1, got {bf16_rows!r}")
        q, scale = quantize_rows(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale.to(torch.bfloat16))    # what the CPU kernel reads
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.bf16_rows = bf16_rows
        self.register_buffer("weight_bf16", None if bf16_rows is None else linear.weight.detach().to(torch.bfloat16).clone())

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None = None, bf16_rows: int | None = None) -> "Int8Linear":
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias.detach(), requires_grad=False)
        return cls(linear, bf16_rows)

    def forward(self, x: Tensor) -> Tensor:
        if self.bf16_rows is not None and x.numel() >= self.bf16_rows * self.in_features:
            y = F.linear(x.to(torch.bfloat16), self.weight_bf16)
            y = y + self.bias if self.bias is not None else y
            return y.to(x.dtype)
        return int8_matmul(x, self.weight, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"
