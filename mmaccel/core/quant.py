"""Int8 linear layers, for drafts.

A draft's job is to guess; verification keeps the output exact whatever the draft computes, so a
draft may run on int8 weights. On a CPU a decoding step reads every weight once per token and is
bound by memory bandwidth: int8 weights are a quarter of the fp32 bytes. Each output channel has
one scale (symmetric, max-abs / 127).

On x86 CPUs the product is PyTorch's dynamically quantised linear (`quantized::linear_dynamic`,
FBGEMM): each call quantises its activations to int8 (one scale per call) and multiplies int8 by
int8 into fp32, with the bias fused, in one operator. Measured here on the 13 product shapes of a
Whisper base draft step, in isolation with warm caches: 0.31 ms at one row, against 0.58 ms for
bf16 activations through the weight-only kernel `aten._weight_int8pack_mm` (what gpt-fast uses)
and 1.1 ms for bf16 weights; it stays the fastest up to 64 rows (2.0 ms, bf16 2.4 ms), where the
weight-only kernel grows with the rows. It costs the draft nothing measurable in acceptance (0.305
target passes per token against 0.306 on the speech benchmark). Elsewhere (CUDA, other CPUs) the
product runs on the dequantised weight.

(torchao's `Int8WeightOnlyConfig` was measured here first: on this CPU it dequantises the whole
weight at every call and ran 2x slower than fp32, so the operators are called directly.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.errors import check

DYNAMIC_ENGINES = ("x86", "fbgemm")     # quantized engines whose dynamic linear was measured fast here


def fast_bf16_matmul(device: torch.device) -> bool:
    """Whether bf16 matrix products run natively here (CUDA, or a CPU with AVX512-BF16 / AMX)."""
    return device.type == "cuda" or bool(cpu_bf16_units())


def cpu_bf16_units() -> list[str]:
    """This CPU's native bf16 units among AMX and AVX512-BF16 (/proc/cpuinfo flags; none where unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return []
    return [unit for unit in ("amx_bf16", "avx512_bf16") if unit in flags]


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [N, K] -> (int8 [N, K], scales [N] fp32) with weight ≈ int8 * scale per row."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scale


def int8_matmul(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ (weight int8 [N, K] * scale [N])ᵀ (+ bias) -> [..., N] in x's dtype, on the
    dequantised weight (any device)."""
    y = F.linear(x, weight.to(x.dtype)) * scale.to(x.dtype)
    return y + bias.to(x.dtype) if bias is not None else y


class Int8Linear(nn.Module):
    """An `nn.Linear` with int8 weights (per-output-channel scales); the bias stays in fp32.
    `Int8Linear.of(weight, bias)` builds one from bare tensors (weight [out, in]).

    On a CPU whose quantized engine is FBGEMM's (`DYNAMIC_ENGINES`) it calls the dynamically
    quantised linear on weights packed once here; elsewhere `int8_matmul`.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        check(isinstance(linear, nn.Linear), f"Int8Linear wraps an nn.Linear, got {type(linear).__name__}")
        q, scale = quantize_rows(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.packed = None                  # FBGEMM's packed weight (CPU), built on first use

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None = None) -> Int8Linear:
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias.detach(), requires_grad=False)
        return cls(linear)

    def _packed(self):
        if self.packed is None:
            zero = torch.zeros(self.out_features, dtype=torch.long)
            w = torch._make_per_channel_quantized_tensor(self.weight.cpu(), self.scale.cpu().double(), zero, 0)
            self.packed = torch.ops.quantized.linear_prepack(w, None if self.bias is None else self.bias.cpu())
        return self.packed

    def forward(self, x: Tensor) -> Tensor:
        if x.is_cpu and self.weight.is_cpu and torch.backends.quantized.engine in DYNAMIC_ENGINES:
            flat = x.reshape(-1, x.shape[-1]).float()
            # reduce_range: 7-bit activations, so CPUs without VNNI cannot saturate their 16-bit sums
            y = torch.ops.quantized.linear_dynamic(flat, self._packed(), True)
            return y.view(*x.shape[:-1], self.out_features).to(x.dtype)
        return int8_matmul(x, self.weight, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"
