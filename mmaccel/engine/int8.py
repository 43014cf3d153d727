"""Int8 linear layers: a scale per weight row and a scale per token (CTranslate2's scheme).

On a CPU a decoding step reads every weight once per token and is bound by memory bandwidth: int8 weights are a
quarter of the fp32 bytes. Each output row of a weight has one scale (symmetric, max-abs / 127); each token (row of
the activations) gets its own scale too, as CTranslate2 quantises them: one scale for a whole call lets a loud
frame set the step of every quiet one (a 30-s encoder window at one scale lost the speech of noisy audio, WER 93 %).

On x86 CPUs the product is PyTorch's dynamically quantised linear (`quantized::linear_dynamic`, FBGEMM / oneDNN),
int8 by int8 into fp32, which quantises its activations with one scale per call: so each row is first divided by
its own abs-max, a fixed row holding 1 and -1 pins the call's range to [-1, 1], and the output rows are multiplied
back by their abs-max before the bias is added. Every token is then quantised alone and its integer product is
exact, so a row's output is bitwise the same whichever rows share its call (a verify pass's products are the
one-token pass's: what greedy-verified methods need of this layer; attention does not give it yet, see
docs/concepts/engine.md). Without int8 dot-product units (VNNI / AMX) activations keep
7 bits, so that AVX2's 16-bit sums cannot saturate. Measured here on the shapes of a Whisper base decoder step, the
bare call took 0.31 ms at one row for a draft step's 13 products, against 0.58 ms for bf16 activations through the
weight-only kernel `aten._weight_int8pack_mm` and 1.1 ms for bf16 weights; the scaling and the anchor add ~0.04 ms
per product at one row (Python-level ops a compiled step will fuse) and 1.4-1.8x at 8-1500 rows. Elsewhere (CUDA,
other CPUs) the product runs on the dequantised weight.

(torchao's `Int8WeightOnlyConfig` was measured here first: on this CPU it dequantises the whole weight at every
call and ran 2x slower than fp32, so the operators are called directly. `benchmarks/engine/precision_choices.json`
compares the libraries that could implement this layer.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.engine.machine import cpu_int8_units
from mmaccel.errors import check

DYNAMIC_ENGINES = ("x86", "fbgemm")     # quantized engines whose dynamic linear was measured fast here
REDUCE_RANGE = not cpu_int8_units()     # 7-bit activations where AVX2's 16-bit sums could saturate


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
    quantised linear on weights packed once here, each token at its own scale; elsewhere `int8_matmul`.
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
        self.anchor = None                  # the row [1, 0, ..., 0, -1] every call appends (see forward)

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
            self.packed = torch.ops.quantized.linear_prepack(w, None)     # the bias is added after the row scales
        return self.packed

    def forward(self, x: Tensor) -> Tensor:
        if x.is_cpu and self.weight.is_cpu and torch.backends.quantized.engine in DYNAMIC_ENGINES:
            flat = x.reshape(-1, x.shape[-1]).float()
            reach = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
            # the anchor row pins the call's range to [-1, 1] whatever the other rows hold: each token is quantised
            # alone, so a row's output is bitwise the same in a pass of one token or of a batch (greedy-identity)
            rows = torch.cat([flat / reach, self._anchor(flat.shape[1])])
            y = torch.ops.quantized.linear_dynamic(rows, self._packed(), REDUCE_RANGE)[:-1] * reach
            if self.bias is not None:
                y = y + self.bias
            return y.view(*x.shape[:-1], self.out_features).to(x.dtype)
        return int8_matmul(x, self.weight, self.scale, self.bias)

    def _anchor(self, width: int) -> Tensor:
        if self.anchor is None:
            self.anchor = torch.zeros(1, width)
            self.anchor[0, 0], self.anchor[0, -1] = 1.0, -1.0
        return self.anchor

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"
