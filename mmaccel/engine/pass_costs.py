"""What a pass costs by its width, measured on this machine: the shape adaptive drafting reads.

A verify pass feeds the target `width` tokens (the pending token and width - 1 drafts). What that costs against a
one-token pass depends on the model, its precision, the batch size and the CPU (Whisper base in fp32 on a 2-core
AMX Xeon: a 9-token pass 1.4x a 1-token one at batch 1, 1.7x at batch 8, 2.1x at batch 8 with the timestamp
rules), so it is measured, never guessed: `width_costs(run, key)` times `run(width)` (one pass of that width,
rolled back) at each of `WIDTHS`, at a cache length of `KV_LEN` (median of `REPEATS`, never below the narrower
width's), and interpolates between them. The figures are kept on disk (`mmaccel.engine.measured`:
`$MMACCEL_CACHE/pass_costs/`, keyed by the machine and what the caller says the pass is), so a second process reads
them instead of measuring (one to six seconds a batch size).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mmaccel.engine.measured import measured, time_ms

WIDTHS = (1, 2, 3, 5, 9, 17)   # tokens per pass measured (others are interpolated)
KV_LEN = 32                    # cache entries before a timed pass (a prompt and ~28 tokens of transcript or text)
REPEATS = 7


@dataclass(frozen=True)
class WidthCosts:
    """Milliseconds of one pass by its width (tokens fed), measured here or read from the cache (`source`).
    Called with a draft count d it gives the pass of width d + 1 relative to a one-token pass (`PassCosts.shape`)."""

    ms: dict[int, float]
    source: str                  # "measured" | "cache"

    def __call__(self, drafts: int) -> float:
        return self.at(drafts + 1) / self.ms[1]

    def at(self, width: int) -> float:
        """Milliseconds of a pass of `width` tokens: linear between the widths measured, past the last along the
        last two."""
        widths = sorted(self.ms)
        lo = max([w for w in widths if w <= width], default=widths[0])
        hi = min([w for w in widths if w > lo], default=None)
        if hi is None:                                       # beyond the widest: extend the last segment
            lo, hi = widths[-2], widths[-1]
        slope = (self.ms[hi] - self.ms[lo]) / (hi - lo)
        return max(self.ms[lo] + slope * (width - lo), 1e-6)


def width_costs(run: Callable[[int], object], key: dict, widths: tuple[int, ...] = WIDTHS, repeats: int = REPEATS,
                cache_dir: str | os.PathLike | None = None) -> WidthCosts:
    """The pass `run(width)` times by width: read from the cache under `key` (what the pass is: model, precision,
    batch size, ... as JSON values) and this machine, else measured now (median of `repeats`) and cached."""
    def measure() -> dict:
        ms, most = {}, 0.0
        with torch.inference_mode():
            for w in widths:            # a wider pass does no less work: a dip is the clock's noise
                most = max(most, time_ms(lambda w=w: run(w), repeats)[0])
                ms[str(w)] = round(most, 4)
        return {"ms": ms}

    def valid(value: dict) -> bool:
        ms = value["ms"]
        return sorted(int(w) for w in ms) == list(widths) and all(float(t) > 0 for t in ms.values())
    value, source = measured("pass_costs", {**key, "widths": list(widths), "kv_len": KV_LEN}, measure, valid, cache_dir)
    return WidthCosts({int(w): float(t) for w, t in value["ms"].items()}, source)
