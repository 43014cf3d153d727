"""Cheaper Whisper encoders: the same weights in bf16, or with int8 linear layers.

End to end the fp32 encoder is most of a transcription's time on a CPU (0.44 s per 30-s window for
base, against 12-16 ms a decoder step), so its precision is the first lever on RTFx. Unlike the
decoder methods this is not lossless: the encoder states move, and with them the transcript. The
ASR benchmark reports the WER of each precision beside its speed.

- `fp32`: the model as loaded (the reference).
- `bf16`: a bf16 copy of the encoder (native on CUDA and on CPUs with AVX512-BF16 / AMX; see
  `fast_bf16_matmul`); features go in as bf16 and the states come out as fp32 for the decoder.
- `int8`: a copy whose attention and MLP linear layers are `Int8Linear` (per-channel int8 weights,
  FBGEMM's dynamically quantised product on x86 CPUs); convolutions, norms and the rest stay fp32.

The fp32 encoder is never modified: a variant is a copy, built once per pipeline and precision.

Measured on Whisper base (`benchmarks/asr_base_encoder*.json`): bf16 keeps the WER (5.94 against 6.21
in domain, 41.3 against 41.9 on the noisy out-of-domain split) at a 1.5x cheaper encoder; int8 costs
3.4 points in domain and breaks on noisy audio (93 %: one activation scale per call loses the speech).
Prefer bf16 where it is native. On a CPU without bf16 units nothing here beats fp32 at equal WER, and
neither does faster-whisper: CTranslate2's int8 encoder took 1.25-1.28 s per window against our fp32's
1.13-1.17 s on an AVX2-only CPU (`benchmarks/asr_features/encoder_cost.json`); the encoder costs both the same.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from mmaccel.core.quant import Int8Linear
from mmaccel.errors import check

PRECISIONS = ("fp32", "bf16", "int8")


def check_precision(precision: str) -> str:
    check(precision in PRECISIONS, f"unknown encoder precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    return precision


def encoder_variant(encoder: nn.Module, precision: str) -> nn.Module:
    """`encoder` itself for fp32, else a converted copy (see the module docstring)."""
    check_precision(precision)
    if precision == "fp32":
        return encoder
    variant = copy.deepcopy(encoder).eval()
    if precision == "bf16":
        return variant.to(torch.bfloat16)
    for layer in variant.layers:
        for owner, name in [(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj")] + \
                           [(layer, "fc1"), (layer, "fc2")]:
            setattr(owner, name, Int8Linear(getattr(owner, name)))
    return variant


def input_dtype(encoder: nn.Module) -> torch.dtype:
    """The dtype an encoder's input features must have (its first convolution's)."""
    return encoder.conv1.weight.dtype
